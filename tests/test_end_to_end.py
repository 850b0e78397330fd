"""The whole loop on real parts: Pub/Sub emulator, Beam streaming pipeline on the
BundleBasedDirectRunner, JAX learner, on-disk policy store; then nothing left running."""

import json
import re
import struct
import threading
import time
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import psutil
import pytest
from _records_data import make_record, rewrite_header
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from core import config
from core.contracts import pubsub_io, records
from core.contracts.store import PolicyStore
from core.telemetry import scalars
from localstack.launch.demo import run_local
from localstack.launch.demo_config import DemoConfig
from tests import _commands as commands

pytestmark = pytest.mark.e2e  # the demo: the emulator, the pipeline and the learner


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in p.info["cmdline"] or []):
                found.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'])[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _bad_records() -> dict[str, bytes]:
    """Messages that must not train: each a different way for a record to be wrong."""
    good = make_record(3, 4, 256, record_id="bad-nan")
    gen = np.argwhere(good.loss_mask == 1)[0]
    good.advantages[tuple(gen)] = np.float32(1234.5)  # a sentinel to overwrite below
    valid = records.encode(good)
    sentinel, nan = struct.pack("<f", 1234.5), struct.pack("<f", float("nan"))
    assert valid.count(sentinel) == 1
    return {
        "corrupt": b"\x00not a record at all",
        "truncated": valid[: len(valid) // 2],
        "wrong_schema": rewrite_header(valid, lambda h: h.update(schema_version=999)),
        "wrong_shape": records.encode(make_record(4, 2, 64, record_id="bad-shape")),
        "nan": valid.replace(sentinel, nan),
        "oversized": valid + b"\x00" * (records.MAX_MESSAGE_BYTES + 1 - len(valid)),
    }


class _Saboteur(threading.Thread):
    """Once the learner has trained a step, publishes bad records into the records topic
    and a malformed request into the requests topic of the running demo, then collects
    what reaches the dead-letter subscription."""

    def __init__(self, workdir: Path, expect: int):
        super().__init__(daemon=True)
        self.workdir, self.expect, self.dead, self.error = workdir, expect, [], None

    def run(self):
        try:
            deadline = time.monotonic() + 300
            while not (self.workdir / "logs" / "learner" / scalars.JSONL).exists():
                assert time.monotonic() < deadline, "the learner never trained"
                time.sleep(0.5)
            stack = json.loads((self.workdir / "emulator.json").read_text())
            pub, sub = pubsub_io.publisher_client(stack["host"]), pubsub_io.subscriber_client(stack["host"])
            for data in _bad_records().values():
                pubsub_io.publish(pub, stack["topics"]["records"], data).result(timeout=30)
            pubsub_io.publish(pub, stack["topics"]["requests"], b"{not json").result(timeout=30)
            while len(self.dead) < self.expect and time.monotonic() < deadline:
                got = pubsub_io.pull(sub, stack["subscriptions"]["dead"], 10, timeout_s=1.0)
                self.dead += [dict(m.message.attributes) for m in got]
                pubsub_io.ack(sub, stack["subscriptions"]["dead"], [m.ack_id for m in got])
        except Exception as e:  # reported by the test, not lost in the thread
            self.error = e


@pytest.mark.timeout(600)
def test_pipeline_and_learner_close_the_loop(tmp_path):
    workdir = tmp_path / "demo"
    saboteur = _Saboteur(workdir, expect=len(_bad_records()) + 1)
    saboteur.start()
    args = config.build(
        DemoConfig,
        workdir=str(workdir),
        max_steps=10,
        publish_every=3,
        tool_latency="fixed:0.02",
        policy_poll_s=0.2,
        timeout_s=400,
        warmstart_steps=0,
        eval_n=16,
        batch_records=2,
        group_size=4,
        filter_zero_signal=False,  # random init: nearly every group is all-zero reward
        # The learner's own credits: the plan's window (sized for a busy learner) would
        # hold all 10 steps' trajectories at once, all from v0. The sync test runs the plan.
        plan="off",
    )
    s = run_local(args)
    saboteur.join(timeout=30)

    assert s.learner.steps >= 10
    assert len(s.learner.policy_versions_published) >= 3  # v0 plus at least two trained versions
    store = PolicyStore(str(workdir / "policy-store"))
    assert store.latest_version() == s.learner.policy_versions_published[-1]
    assert store.latest_version() in store.versions()  # gc never removes the current version
    by_version = {int(v): n for v, n in s.learner.records_by_max_policy_version.items()}
    assert any(v >= 1 and n > 0 for v, n in by_version.items()), f"no record from a reloaded policy: {by_version}"
    assert s.learner.declared_record_shapes == ["1x1024"]  # the default layout
    assert s.learner.record_shapes == {"1x1024": s.learner.records_consumed}
    assert s.learner.records_consumed >= 10 * 2  # records_rejected: the saboteur's, checked below
    assert s.learner.tokens_consumed > 0 and s.learner.trajectories > 0
    assert s.learner.compiled_train_steps == 1  # fixed shapes: one compile for every step
    assert 0.0 <= s.learner.mean_reward <= 1.0
    acc = s.learner.accounting  # every requested trajectory is somewhere
    assert acc.balanced, acc
    assert acc.trained > 0 and acc.requested == (s.learner.requests_published + s.learner.requests_redone) * 4
    assert s.learner.trajectories_tokens_verified == acc.trained  # trained exactly what was sampled
    rec = s.reconciliation  # the rollout workers' own counts, joined to the learner's
    assert rec.reconciled, rec
    assert rec.episodes >= rec.packed >= acc.received - acc.foreign > 0
    assert rec.bad_requests == 1  # the saboteur's malformed request, below
    report = Path(s.report).read_text()
    assert "Where every trajectory went" in report and "The rollout workers' counts, joined" in report
    # The evaluator scored v0 and the final version, in both modes, beside the learner;
    # the summary's success is its row's, the share of the episodes that scored: 16 tasks,
    # sampled 8 times each at the ends (a final version first scored once a task, before it
    # was known to be the final, has that row too, and the last row is the summary's).
    rows = scalars.read_rows(workdir / "eval.jsonl")
    for mode, samples in (("sampled", 8), ("greedy", 1)):
        held = s.held_out[mode]
        assert held["first"]["version"] == 0 and held["last"]["version"] == s.learner.policy_versions_published[-1]
        row = [r for r in rows if r["mode"] == mode and r["version"] == held["last"]["version"]][-1]
        assert (row["tasks"], row["samples"], row["n"]) == (16, samples, 16 * samples)
        wins = round(row["success"] * row["n"])
        assert held["last"]["success"] == row["success"] == pytest.approx(wins / row["n"])
        assert wins <= row["status"].get("finished", 0)
    assert s.pass_at["first"]["sampled"]["pass_at"].keys() == {"1", "2", "4", "8"}

    for pid in s.pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _processes_mentioning(str(workdir)) == []  # emulator, pipeline and learner all gone
    _assert_run_files(workdir, s)

    # Bad input on the live path: every bad record dead-lettered with its reason, counted,
    # and the run trained on; the malformed request dead-lettered by the rollout job.
    assert saboteur.error is None, saboteur.error
    assert s.learner.records_rejected == len(_bad_records())
    record_letters = [d for d in saboteur.dead if "source_subscription" in d]
    assert len(record_letters) == len(_bad_records()) and all(d["error"] for d in record_letters)
    reasons = " | ".join(d["error"] for d in record_letters)
    for why in ("bad magic", "truncated", "schema_version", "not a declared bucket shape", "non-finite", "over MAX_"):
        assert why in reasons, reasons
    (request_letter,) = [d for d in saboteur.dead if "source_subscription" not in d]
    assert "request" in request_letter["error"].lower() or "json" in request_letter["error"].lower()
    (rollout_dir,) = (workdir / "logs").glob("rollout-*")
    assert scalars.read_rows(rollout_dir / scalars.JSONL)[-1]["rollout/bad_requests"] == 1


def _scalars(run_dir) -> dict[str, list]:
    """TensorBoard's own reader over one run's event files: tag -> [(step, value)]."""
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _assert_run_files(workdir, s) -> None:
    """What a user opens after a run: TensorBoard runs for the learner, each rollout worker
    and the evaluator; their JSONL twins; one trace with spans from every process; the
    report with its plots."""
    logs = workdir / "logs"
    learner = _scalars(logs / "learner")
    for tag in ("losses/policy_loss", "perf/duty_cycle", "perf/trained_tokens_per_s_recent", "staleness/mean"):
        assert [step for step, _ in learner[tag]] == list(range(1, s.learner.steps + 1)), tag
    rows = scalars.read_rows(logs / "learner" / scalars.JSONL)
    assert [r["step"] for r in rows] == list(range(1, s.learner.steps + 1))
    assert rows[-1]["data/records_received"] == s.learner.records_consumed
    assert rows[-1]["policy/version"] == s.learner.policy_versions_published[-1]
    (rollout_dir,) = logs.glob("rollout-*")
    rollout = _scalars(rollout_dir)
    assert max(v for _, v in rollout["rollout/episodes"]) >= s.learner.trajectories  # every trajectory was an episode
    assert max(v for _, v in rollout["rollout/records"]) >= s.learner.records_consumed
    assert {"rollout/episodes_per_s", "rollout/env_latency_ms_p95", "rollout/fill_mean"} <= set(rollout)
    last = scalars.read_rows(rollout_dir / scalars.JSONL)[-1]
    assert sum(last["rollout/env_latency_hist"]["counts"]) == last["rollout/episodes"]
    evals = _scalars(logs / "evaluator")
    assert {v for _, v in evals["eval/version"]} >= {0, s.learner.policy_versions_published[-1]}
    assert "eval/sampled_success" in evals and "eval/greedy_success" in evals

    doc = json.loads((workdir / "trace.json").read_text())
    procs = {e["pid"]: e["args"]["name"].split(" ")[0] for e in doc["traceEvents"] if e["name"] == "process_name"}
    names = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            names.setdefault(procs[e["pid"]], set()).add(e["name"])
    assert {"train step", "wait for data", "publish", "checkpoint"} <= names["learner"]
    assert {"episode", "model turn", "tool call", "policy reload", "pubsub publish"} <= names["rollout"]
    assert {"load policy", "evaluate"} <= names["evaluator"]
    steps = [e for e in doc["traceEvents"] if e["name"] == "train step"]
    assert len(steps) == s.learner.steps

    report_md = Path(s.report).read_text()
    assert "trace.json" in report_md and "ui.perfetto.dev" in report_md
    pngs = re.findall(r"\((report/[\w.]+\.png)\)", report_md)
    assert {"report/success.png", "report/learner.png", "report/timeline.png"} <= set(pngs)
    for png in pngs:
        img = mpimg.imread(workdir / png)
        assert img.shape[0] > 100 and img.shape[1] > 100 and len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 10


@pytest.mark.timeout(600)
def test_synchronous_baseline_trains_only_on_its_own_version(tmp_path):
    """--sync: the same code path as the async run, in rounds. Every trained record was
    generated by the learner's current version, no rollout is thrown away, and the run
    neither deadlocks nor leaves processes behind."""
    workdir = tmp_path / "sync"
    args = config.build(
        DemoConfig,
        workdir=str(workdir),
        max_steps=4,
        publish_every=1,
        warmstart_steps=0,
        tool_latency="none",
        policy_poll_s=0.1,
        timeout_s=400,
        sync=True,
        **{"learner.keep_versions": 2},
        eval_n=0,
        trace=False,
        batch_records=2,
        group_size=4,
        filter_zero_signal=False,
    )
    s = run_local(args)
    assert s.learner.schedule == "sync" and s.learner.steps == 4
    # One version per round; a round whose records fill more than its step is trained in extra steps.
    assert s.learner.policy_versions_published == list(range(s.learner.sync.rounds + 1))
    assert 1 <= s.learner.sync.rounds <= 4
    assert set(s.learner.staleness_histogram) == {"0"}
    assert s.learner.records_dropped_stale == 0 and s.learner.trajectories_dropped_stale == 0  # no rollout wasted
    assert s.learner.sync.lost_trajectories == 0
    assert s.learner.accounting.balanced, s.learner.accounting
    assert s.reconciliation.reconciled, s.reconciliation
    # The capacity plan ran first (the demo's default); the pipeline and the learner took it.
    slots = s.plan["settings"]["engine_slots"]
    assert f"rollout worker ready: {slots} slots" in (workdir / "pipeline.log").read_text()
    last = s.learner.policy_versions_published[-1]
    assert PolicyStore(str(workdir / "policy-store")).versions() == [last - 1, last]  # old versions collected
    assert _processes_mentioning(str(workdir)) == []
    # --no-trace: no spans anywhere, and the report says the timeline is missing (and why).
    assert not (workdir / "trace").exists() and not (workdir / "trace.json").exists()
    report_md = Path(s.report).read_text()
    assert "timeline.png" not in report_md and "not traced" in report_md
    assert (workdir / "report" / "learner.png").exists()


def _processes_writing_under(path) -> list[int]:
    """Pids with a file open under path: the emulator's JVM names no workdir on its command
    line, but its output goes to a log there."""
    import os
    from pathlib import Path

    found = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd).startswith(str(path)) for fd in fd_dir.iterdir()):
                found.append(int(fd_dir.parent.name))
        except OSError:
            continue  # gone, or not ours to read
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_demo_stops_everything_it_started(tmp_path, sig):
    """A job timeout or a closed terminal (SIGTERM: the demo's own teardown runs), or a
    kill -9 or the OOM killer (SIGKILL: its watchdog stops what it started): nothing survives."""
    import signal
    import subprocess
    import time

    workdir = tmp_path / "term"
    settings = {"warmstart_steps": 0, "eval_n": 0, "max_steps": 1000, "plan": "off", "timeout_s": 600}
    settings |= {"filter_zero_signal": False, "batch_records": 1}  # random init: a first step soon, not never
    demo = subprocess.Popen(commands.demo(workdir=str(workdir), **settings))
    try:
        deadline = time.monotonic() + 180
        # Emulator, learner and pipeline all started; for SIGTERM, the learner has trained a step.
        rows = workdir / "logs" / "learner" / scalars.JSONL
        ready = (lambda: scalars.read_rows(rows)) if sig == "SIGTERM" else (workdir / "pipeline.log").exists
        while not ready():
            assert demo.poll() is None and time.monotonic() < deadline, "demo did not get as far as the pipeline"
            time.sleep(0.5)
        assert _processes_mentioning(str(workdir)) and _processes_writing_under(workdir)  # they are running
        signum = getattr(signal, sig)
        demo.send_signal(signum)
        assert demo.wait(timeout=60) == (128 + signum if sig == "SIGTERM" else -signum)
        if sig == "SIGTERM":  # the learner's teardown still summarised the run, accounting included
            learner = json.loads((workdir / "summary.json").read_text())
            assert learner["exit_code"] == 143 and learner["steps"] >= 1 and learner["accounting"]["balanced"]
        deadline = time.monotonic() + 10
        while (
            _processes_mentioning(str(workdir)) or _processes_writing_under(workdir)
        ) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _processes_mentioning(str(workdir)) == [] and _processes_writing_under(workdir) == []
        deadline = time.monotonic() + 5  # the watchdog exits once the groups are gone (or at a normal exit)
        while _processes_mentioning(f"--parent={demo.pid}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_mentioning(f"--parent={demo.pid}") == []
    finally:
        if demo.poll() is None:
            demo.kill()
