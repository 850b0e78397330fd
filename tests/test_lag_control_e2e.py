"""The lag controller on the real stack: a window far too large for the target is brought
down by the loop, the credits the feeder uses follow every change, and the tools' latency
changes mid-run (a latency file the rollout workers read) without the run losing a
trajectory. Whether the lag re-settles within 5 versions is benchmarks/lag_control.py's
question (docs/BENCHMARKS.md, "Lag control"); here, that the loop is wired end to end."""

import threading
import time

import pytest

from core import config
from core.telemetry import scalars
from localstack.launch.demo import run_local
from localstack.launch.demo_config import DemoConfig

pytestmark = pytest.mark.e2e


class _SwitchAt(threading.Thread):
    """Writes `spec` into the latency file once the learner has published `version`."""

    def __init__(self, path, metrics, version: int, spec: str):
        super().__init__(daemon=True)
        self.path, self.metrics, self.version, self.spec = path, metrics, version, spec
        self.switched_at: int | None = None
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            rows = scalars.read_rows(self.metrics) if self.metrics.exists() else []
            if rows and rows[-1].get("policy/version", 0) >= self.version:
                self.path.write_text(self.spec)
                self.switched_at = rows[-1]["policy/version"]
                return
            time.sleep(0.2)


@pytest.mark.timeout(600)
def test_the_loop_brings_a_too_large_window_to_the_target_and_the_credits_follow_it(tmp_path):
    workdir, latency = tmp_path / "demo", tmp_path / "latency"
    latency.write_text("fixed:0.02")
    metrics = workdir / "logs" / "learner" / scalars.JSONL
    switch = _SwitchAt(latency, metrics, version=6, spec="fixed:0.3")
    switch.start()
    args = config.build(
        DemoConfig,
        workdir=str(workdir),
        max_steps=16,
        publish_every=1,
        tool_latency=f"file:{latency}",
        policy_poll_s=0.2,
        timeout_s=400,
        # A random model makes almost no well-formed tool call, so its episodes would never
        # meet the latency that changes: a short warm start on calling demonstrations does.
        warmstart_steps=150,
        warmstart_direct_frac=0.0,
        eval_n=0,
        batch_records=2,
        group_size=4,
        filter_zero_signal=False,  # random init: nearly every group is all-zero reward
        plan="off",
        live="off",
        report=False,
        **{
            "learner.lag_target": 1.0,
            "learner.max_staleness": 3,
            "learner.max_in_flight": 400,  # about 10x what a lag of 1 needs at 2 records a version
            "learner.lag_min_records": 2,
        },
    )
    s = run_local(args)
    switch.done.set()

    lag = s.learner.lag_control
    assert lag is not None and lag["target"] == 1.0
    changes = lag["changes"]
    assert changes, lag
    first = changes[0]
    assert first["new"] < first["old"] <= 400 and "against target 1" in first["reason"]  # too large: down
    assert all(lag["floor"] <= c["new"] <= lag["ceiling"] for c in changes)
    # The credits follow: the window the feeder used at each step is the loop's last word by then.
    rows = [r for r in scalars.read_rows(metrics) if "feeder/window" in r]
    for r in rows:
        decided = [c for c in changes if c["version"] <= r["policy/version"]]
        want = decided[-1]["new"] if decided else min(max(400, lag["floor"]), lag["ceiling"])
        assert r["feeder/window"] == want, (r["policy/version"], r["feeder/window"], changes)
    assert rows[-1]["lag/target"] == 1.0 and "lag/measured" in rows[-1]
    assert switch.switched_at is not None and switch.switched_at < rows[-1]["policy/version"]
    # The latency changed under it: the rollout workers' tool waits grew, and nothing was lost.
    (rollout_dir,) = (workdir / "logs").glob("rollout-*")
    rows = scalars.read_rows(rollout_dir / scalars.JSONL)
    # The tools' declared waits, per episode that called one: free of the host's load, which
    # the episodes' wall time (env_latency_ms) is not, and not diluted by episodes that made
    # no call (most of a random model's), which the p95 over all episodes was.
    waits = [r["rollout/tool_wait_ms_p95"] for r in rows if r.get("rollout/tool_wait_ms_p95") is not None]
    assert waits and min(waits) < 250 and max(waits) >= 300, waits  # 20 ms a call, then 300 ms
    assert s.learner.accounting.balanced, s.learner.accounting
