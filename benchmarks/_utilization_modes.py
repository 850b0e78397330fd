"""The two ceilings of benchmarks/utilization.py, each on its own core, measured side by
side in the same window (the two vCPUs of this VM slow each other down when both are
busy, so a ceiling measured next to an idle core overstates what either side gets in a
real run):

- rollout alone: the real rollout job (emulator and pipeline on the rollout core) fed by a
  feeder whose window never runs dry, drained by a sink that only counts and keeps the
  records: the trajectories/s and tokens/s the rollout side makes when nothing waits on it;
- learner alone (`python benchmarks/_utilization_modes.py learner RECORDS.bin ...`, on the
  learner core): the real `Learner.train_step`, back to back, on the records the rollout
  job made during its warm-up, started when the rollout window starts. Also measured once
  more afterwards with the other core idle, for comparison.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import struct
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core import config
from core.contracts import pubsub_io
from core.contracts.records import decode
from localstack.emulators.pubsub import PubSubEmulator
from localstack.launch.commands import rollout_command
from localstack.launch.demo_config import DemoConfig
from localstack.launch.processes import ProcessGroup
from pipelines.config import RolloutJobConfig


def _write_frames(path: Path, payloads: list[bytes]) -> None:
    with open(path, "wb") as f:
        for p in payloads:
            f.write(struct.pack("<I", len(p)) + p)


def _read_frames(path: Path) -> list[bytes]:
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def rollout_alone(
    init_store: Path,
    tool_latency: str,
    workdir: Path,
    *,
    rollout_cpus: set[int],
    group_size: int = 8,
    window: int = 512,
    warm_s: float = 15.0,
    measure_s: float = 45.0,
    plan_flags: list[str] = (),
    settings: dict | None = None,
    env_name: str = "calculator",
    env_config: dict | None = None,
    learner: tuple[set[int], int] | None = None,
) -> dict:
    """Trajectories/s and tokens/s of the rollout side when requests never run out; the
    records are kept in workdir/records.bin. The rollout job runs as the demo runs it, with
    a plan's `pipeline_flags` (`plan_flags`), then `settings` (RolloutJobConfig values by
    flag name) on top. learner=(cpus, batch_records): the learner-alone ceiling runs on
    those cores during the same window (its result under the key "learner_alone")."""
    import environments
    from trainer.learning.data.feeder import Feeder, TrajectoryCredits

    store = workdir / "policy-store"
    shutil.copytree(init_store, store, dirs_exist_ok=True)
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, rollout_cpus)  # the emulator inherits the rollout core
    try:
        emu = PubSubEmulator(log_dir=workdir / "emulator").start()
    finally:
        os.sched_setaffinity(0, own)
    try:
        req_t, rec_t = emu.create_topic("requests"), emu.create_topic("records")
        dead_t = emu.create_topic("dead")
        req_s, rec_s = (
            emu.create_subscription("requests-sub", "requests"),
            emu.create_subscription("records-sub", "records"),
        )
        env = {**os.environ, **emu.env(), "JAX_PLATFORMS": "cpu"}
        job = config.build(
            RolloutJobConfig,
            requests_subscription=req_s,
            records_topic=rec_t,
            dead_letter_topic=dead_t,
            policy_root=str(store),
            policy_poll_s=DemoConfig.policy_poll_s,  # the demo's, which the plans assume
            max_wait_s=DemoConfig.max_wait_s,
        )
        job = config.replace(config.parse(RolloutJobConfig, list(plan_flags), base=job), **(settings or {}))
        cmd = rollout_command(job, emu.project)
        os.environ.update(emu.env())
        env_settings = {**(env_config or {}), "tool_latency": tool_latency}  # what the requests carry
        tasks = environments.make_tasks(env_name, 7, 2000, "train", env_settings)
        credits = TrajectoryCredits(window)
        feeder = Feeder(req_t, tasks, credits, group_size, env_name, env_settings)
        with ProcessGroup(cmd, workdir / "pipeline.log", env, cpus=rollout_cpus) as pipeline:
            feeder.start()
            return _drain(emu, rec_s, credits, pipeline, workdir, warm_s, measure_s, feeder, learner)
    finally:
        emu.stop()


def _drain(emu, sub, credits, pipeline, workdir: Path, warm_s: float, measure_s: float, feeder, learner) -> dict:
    subscriber = emu.subscriber()
    beside = None  # the learner-alone process, started with the window
    kept: list[bytes] = []
    first = start = None
    trajs = tokens = records = 0
    per_5s: dict[int, int] = {}  # trajectories per 5 s of the window: is it steady?
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if pipeline.poll() is not None:
                raise RuntimeError(f"rollout pipeline exited:\n{pipeline.log_tail()}")
            msgs = pubsub_io.pull(subscriber, sub, 100, timeout_s=1.0)
            now = time.monotonic()
            for m in msgs:
                rec = decode(m.message.data)
                credits.release(len(rec.trajectories))
                if first is None:
                    first = now
                if start is not None:
                    per_5s[int((now - start) // 5)] = per_5s.get(int((now - start) // 5), 0) + len(rec.trajectories)
                    trajs += len(rec.trajectories)
                    tokens += rec.num_tokens
                    records += 1
                kept.append(bytes(m.message.data))
            pubsub_io.ack(subscriber, sub, [m.ack_id for m in msgs])
            if first is not None and start is None and now - first >= warm_s:
                start = now
                if learner:
                    _write_frames(workdir / "warmup_records.bin", kept)
                    beside = start_learner_alone(
                        workdir / "warmup_records.bin", learner[1], measure_s, learner[0], workdir
                    )
            if start is not None and now - start >= measure_s:
                break
        else:
            raise RuntimeError("rollout-alone: no steady state within 300 s")
    finally:
        feeder.stop()
    wall = time.monotonic() - start
    _write_frames(workdir / "records.bin", kept)
    side = finish_learner_alone(*beside) if beside else None
    return {
        **({"learner_alone": side} if side else {}),
        "trajectories_per_s": trajs / wall,
        "tokens_per_s": tokens / wall,
        "records_per_s": records / wall,
        "trajectories_per_record": trajs / max(1, records),
        "measured_s": round(wall, 1),
        "records_kept": len(kept),
        "trajectories_per_s_by_5s": [round(per_5s.get(i, 0) / 5, 1) for i in range(int(wall // 5))],
    }


def learner_alone(records_path: Path, batch_records: int, seconds: float) -> dict:
    """Back-to-back train steps on the rollout side's own records for `seconds` after the
    compile (this process's cores)."""
    from core.contracts.record_shape import RecordLayout
    from core.policy.model.config import ModelConfig
    from trainer.learning.step.learner import Learner, LearnerConfig

    recs = [decode(p) for p in _read_frames(records_path)]
    if len(recs) < batch_records:
        raise RuntimeError(f"only {len(recs)} records to train on")
    # As the job's learner (builder.make_learner): attention within the default layout's
    # trajectory length, the layout these runs use.
    span = RecordLayout().trajectory_len
    learner = Learner(ModelConfig(), LearnerConfig(batch_records=batch_records), span=span)
    batches = [recs[i : i + batch_records] for i in range(0, len(recs) - batch_records + 1, batch_records)]
    learner.train_step(batches[0])  # compile
    times, tokens, trajs = [], 0, 0
    end = time.monotonic() + seconds
    for i in itertools.count():
        if time.monotonic() >= end and len(times) >= 3:
            break
        b = batches[i % len(batches)]
        t0 = time.perf_counter()
        learner.train_step(b)
        times.append(time.perf_counter() - t0)
        tokens += sum(r.num_tokens for r in b)
        trajs += sum(len(r.trajectories) for r in b)
    wall = sum(times)
    return {
        "step_s": statistics.median(times),
        "tokens_per_s": tokens / wall,
        "trajectories_per_s": trajs / wall,
        "fill": statistics.fmean(r.num_tokens / r.tokens.size for r in recs),
    }


def start_learner_alone(records_path: Path, batch_records: int, seconds: float, cpus: set[int], workdir: Path):
    out = workdir / f"learner_alone_{records_path.stem}.json"
    cmd = [sys.executable, __file__, "learner", str(records_path), str(batch_records), str(seconds), str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return ProcessGroup(cmd, workdir / f"{out.stem}.log", env, cpus=cpus).start(), out


def finish_learner_alone(proc: ProcessGroup, out: Path, timeout_s: float = 300) -> dict:
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if proc.poll() != 0:
            raise RuntimeError(f"learner-alone failed:\n{proc.log_tail()}")
        return json.loads(out.read_text())
    finally:
        proc.stop()


def learner_alone_pinned(records_path: Path, batch_records: int, seconds: float, cpus: set[int], workdir: Path):
    """The learner-alone ceiling with nothing else running."""
    return finish_learner_alone(*start_learner_alone(records_path, batch_records, seconds, cpus, workdir))


if __name__ == "__main__" and sys.argv[1:2] == ["learner"]:
    path, batch, n, out = Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5])
    out.write_text(json.dumps(learner_alone(path, batch, n)))
