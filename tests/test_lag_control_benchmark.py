"""benchmarks/lag_control.py's world changes without a demo: the phase bookkeeping, and extra
rollout jobs started and stopped as copies of the running one (real processes, `sleep`
standing in for the job)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import lag_control

from core import config
from localstack.launch import demo
from localstack.launch.processes import ProcessGroup


def test_phases_carry_each_phase_s_tools_and_jobs_and_settle_by_the_band():
    lags = {0: 1.0, 1: 2.0, 2: 2.1, 3: 1.9, 4: 0.5, 5: 2.0, 6: 2.0, 7: 2.2}
    out = lag_control.phases([{"version": 4}], ["fixed:2", "fixed:2"], [1, 2], lags, target=2.0)
    assert [(p["latency"], p["jobs"], p["from_version"], p["to_version"]) for p in out] == [
        ("fixed:2", 1, 0, 4),
        ("fixed:2", 2, 4, None),
    ]
    assert out[0]["versions_to_settle"] == 1  # v1-v3 within ±15 % of 2: settled from v1
    assert out[1]["versions_to_settle"] == 1  # v4 is out (0.5), v5-v7 in
    assert out[0]["mean_lag"] == pytest.approx((1.0 + 2.0 + 2.1 + 1.9) / 4, abs=1e-3)


def test_jobs_must_name_one_count_per_phase():
    for jobs in ("1", "1,0", "1,a"):  # refused when the config is built, before any demo starts
        with pytest.raises(ValueError, match="one count >= 1 per phase"):
            config.build(lag_control.LagBenchConfig, latencies="fixed:2,fixed:2", jobs=jobs)
    assert config.build(lag_control.LagBenchConfig, latencies="fixed:2,fixed:2", jobs="1,2").job_counts == [1, 2]
    assert config.build(lag_control.LagBenchConfig, latencies="fixed:2,fixed:2").job_counts == [1, 1]


def _alive(group: ProcessGroup) -> bool:
    return group.poll() is None


def test_a_second_job_joins_as_a_copy_of_the_running_one_and_leaves_when_its_phase_ends(tmp_path, monkeypatch):
    own = ProcessGroup(["sleep", "60"], tmp_path / "own.log").start()
    monkeypatch.setitem(demo.RUNNING, "rollout job", own)
    metrics = tmp_path / "metrics.jsonl"
    switch = lag_control.WorldSwitch(tmp_path / "latency", ["fixed:2"] * 3, [1, 2, 1], 2, metrics, None)
    try:
        switch.start()
        for version in (1, 2, 4):  # the learner publishes v1, v2 (phase 1: 2 jobs), v4 (phase 2)
            with metrics.open("a") as f:
                f.write(json.dumps({"policy/version": version, "perf/wall_s": float(version)}) + "\n")
            deadline = time.monotonic() + 10
            while len(switch.switches) < version // 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            if version == 2:
                assert len(switch.extra) == 1 and _alive(switch.extra[0])
                joined = switch.extra[0]
                assert joined.cmd == own.cmd and joined.pid != own.pid
        assert [(s["version"], s["jobs"]) for s in switch.switches] == [(2, 2), (4, 1)]
        assert switch.extra == [] and not _alive(joined) and _alive(own)  # the demo's own job stays
    finally:
        switch.stop()
        own.stop()
