"""A running rollout job (`python -m pipelines.job`, a real streaming job on the
emulator) for the fault tests (tests/test_rollout_faults_*.py): what happened is read
afterwards from the job's outputs only: records on the records topic, dead letters, and
the rollout telemetry rows under --logdir.

The faulty environment is tests/_faulty_env.py, a plugin environment: the job finds it
through an `agentic_rl.environments` entry point of a distribution on its PYTHONPATH.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
import uuid
from pathlib import Path

from flax import nnx

from core.contracts import pubsub_io
from core.contracts.records import KIND_ATTRIBUTE, decode
from core.contracts.rollout_request import RolloutRequest
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.telemetry import scalars
from localstack.launch.processes import ProcessGroup
from tests import _commands as commands
from tests import _faulty_env

REPO = Path(__file__).resolve().parents[1]
SHAPE = (2, 256)
GROUP = 2
STARTUP_S = 150  # the job's first records: JAX compile and Beam start on a loaded 2-core machine
# The job's step timeout (--step_timeout_s): long enough that the good requests sent with
# the hung ones are served while the hung steps still wait.
STEP_TIMEOUT_S = 10.0


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def params_of(seed: int) -> dict:
    return nnx.to_pure_dict(split_params(init_model(ModelConfig(), seed))[1])


def store_with_v0(tmp_path: Path) -> PolicyStore:
    store = PolicyStore(str(tmp_path / "store"))
    store.publish(0, params_of(0))
    return store


def plugin_site(tmp_path: Path) -> Path:
    """A site dir holding an installed distribution's metadata only: its entry point makes
    `faulty` (tests/_faulty_env.py, importable from the repo root) a plugin environment."""
    site = tmp_path / "plugin-site"
    info = site / "faulty_env_plugin-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty-env-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        f"[agentic_rl.environments]\n{_faulty_env.NAME} = tests._faulty_env:make_env\n"
    )
    return site


class Job:
    """One rollout pipeline subprocess on fresh topics, and what came out of it."""

    def __init__(self, emu, tmp_path: Path, store: PolicyStore, **settings):
        names = {k: topic_name(k) for k in ("requests", "records", "dead")}
        self.topics = {k: emu.create_topic(v) for k, v in names.items()}
        self.subs = {k: emu.create_subscription(v + "-sub", v) for k, v in names.items()}
        self.logdir = tmp_path / "logs"
        cmd = commands.rollout(
            emu.project,
            requests_subscription=self.subs["requests"],
            records_topic=self.topics["records"],
            dead_letter_topic=self.topics["dead"],
            policy_root=store.root,
            logdir=str(self.logdir),
            telemetry_every_s=0.5,
            rows=SHAPE[0],
            seq_len=SHAPE[1],
            max_new_tokens_per_turn=8,
            step_timeout_s=STEP_TIMEOUT_S,
            **{**commands.FAST_ROLLOUT, **settings},
        )
        path = [str(plugin_site(tmp_path)), str(REPO), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        self.group = ProcessGroup(cmd, tmp_path / "pipeline.log", env=env, cwd=str(REPO))
        self.publisher = pubsub_io.publisher_client()
        self.subscriber = emu.subscriber()
        self.records = []  # (message attributes, PackedRecord)
        self.dead = []  # PubsubMessage

    def __enter__(self) -> Job:
        self.group.start()
        return self

    def __exit__(self, *exc) -> None:
        self.group.stop()  # SIGTERM: the job writes its last telemetry row

    def send(self, request_id: str, fault: str = "ok", i: int = 0) -> None:
        task = _faulty_env.task(fault, i).to_json_dict()
        req = RolloutRequest(request_id, _faulty_env.NAME, task, GROUP, {"max_turns": 1})
        pubsub_io.publish(self.publisher, self.topics["requests"], req.to_bytes()).result()

    def poll(self, timeout_s: float = 0.5) -> None:
        for kind in ("records", "dead"):
            msgs = pubsub_io.pull(self.subscriber, self.subs[kind], 20, timeout_s=timeout_s)
            pubsub_io.ack(self.subscriber, self.subs[kind], [m.ack_id for m in msgs])
            for m in (m.message for m in msgs):
                if kind == "dead":
                    self.dead.append(m)
                elif KIND_ATTRIBUTE not in m.attributes:  # drop notices are not records
                    self.records.append((dict(m.attributes), decode(m.data, SHAPE)))

    def wait_for(self, what: str, cond, timeout_s: float) -> None:
        """Polls the outputs until cond() holds; an AssertionError if the job dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not cond():
            if self.group.poll() is not None:
                raise AssertionError(f"the rollout job died waiting for {what}:\n{self.group.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{timeout_s:.0f}s without {what}:\n{self.group.log_tail()}")
            self.poll()
        print(f"{time.strftime('%H:%M:%S')} got {what}", file=sys.stderr, flush=True)

    # -- what came out ---------------------------------------------------------------------
    def trajectories(self) -> dict[str, dict]:
        """trajectory_id -> status, reward, the policy versions of its generated tokens, and
        its record's (min, max)_policy_version attributes."""
        out = {}
        for attrs, rec in self.records:
            for t in rec.trajectories:
                gen = (rec.segment_ids[t.row] == t.segment) & (rec.loss_mask[t.row] == 1)
                out[t.trajectory_id] = {
                    "status": t.status,
                    "reward": t.reward,
                    "versions": set(rec.policy_versions[t.row][gen].tolist()),
                    "record_versions": (int(attrs["min_policy_version"]), int(attrs["max_policy_version"])),
                }
        return out

    def done(self, *request_ids: str) -> bool:
        got = self.trajectories()
        return all(f"{r}/{i}" in got for r in request_ids for i in range(GROUP))

    def dead_by_request(self) -> dict[str, list[str]]:
        out = {}
        for m in self.dead:
            out.setdefault(json.loads(m.data)["request_id"], []).append(m.attributes["error"])
        return out

    def telemetry(self) -> dict:
        """The newest rollout telemetry row (the job is one worker process: one metrics.jsonl)."""
        files = glob.glob(str(self.logdir / "*" / scalars.JSONL))
        assert len(files) <= 1, files
        rows = scalars.read_rows(files[0]) if files else []
        return rows[-1] if rows else {}


def group_of(trajectories: dict, request_id: str) -> list[dict]:
    return [trajectories[f"{request_id}/{i}"] for i in range(GROUP) if f"{request_id}/{i}" in trajectories]


def counted_by_status(row: dict) -> dict[str, int]:
    """The row's rollout/episodes_<status> counters (not the episodes_per_s and _in_flight gauges)."""
    prefix, gauges = "rollout/episodes_", {"per_s", "in_flight"}
    return {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix) and k[len(prefix) :] not in gauges}


def packed_by_status(trajectories: dict) -> dict[str, int]:
    out = {}
    for t in trajectories.values():
        out[t["status"]] = out.get(t["status"], 0) + 1
    return out
