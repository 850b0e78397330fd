"""The soak report's verdicts (benchmarks/_soak_report.py) on fabricated samples: no processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _soak_report as report


def samples(minutes: float = 20, every_s: float = 5) -> list[dict]:
    """A run where the learner's RSS is flat (with wobble), the rollout's leaks 5 MB/min,
    threads are flat, the rollout's fds climb, and some fields exist only part of the time."""
    rows = []
    for i in range(int(minutes * 60 / every_s)):
        t = i * every_s
        m = t / 60
        row = {
            "t": t,
            "rss_mb/learner": 900 + (3 if i % 2 else -3),  # allocator wobble, no trend
            "rss_mb/rollout": 600 + 5 * m,  # 50 MB per 10 min: a leak
            "threads/learner": 40 + (i % 3 == 0),  # a short-lived thread now and then
            "fds/rollout": 30 + int(m),  # one socket a minute never closed
            "counter/learner_steps": i,
            "counter/dead_letters_learner": 0,
            "counter/dropped_stale": int(m > 15),  # one drop late in the run
        }
        if m < 5:
            row["rss_mb/planner"] = 300  # a process that exits early: no second half
        if i % 4 == 0:
            row["backlog/records_waiting"] = 3  # a field some samples lack
        rows.append(row)
    return rows


def verdicts(rows) -> dict[str, str]:
    return {r["key"]: r["verdict"] for r in report.summarize(rows)}


def test_flat_series_are_flat_and_growing_ones_grow():
    v = verdicts(samples())
    assert v["rss_mb/learner"] == "flat"
    assert v["rss_mb/rollout"] == "grows"
    assert v["threads/learner"] == "flat"
    assert v["fds/rollout"] == "grows"
    assert v["counter/learner_steps"] == "advances"
    assert v["counter/dead_letters_learner"] == "flat"
    assert v["counter/dropped_stale"] == "grows"


def test_slope_and_quartile_medians():
    rows = {r["key"]: r for r in report.summarize(samples())}
    rollout = rows["rss_mb/rollout"]
    assert abs(rollout["slope_per_min"] - 5.0) < 1e-6
    assert rollout["q1_median"] < 600 + 5 * 5 < 600 + 5 * 15 < rollout["q4_median"]


def test_small_rss_growth_within_thresholds_is_flat():
    rows = [{"t": t, "rss_mb/learner": 2000 + t / 60} for t in range(0, 1200, 5)]  # 1 MB/min
    assert verdicts(rows)["rss_mb/learner"] == "flat"
    rows = [{"t": t, "rss_mb/learner": 2000 + 3 * t / 60} for t in range(0, 1200, 5)]  # 30 MB / 10 min
    assert verdicts(rows)["rss_mb/learner"] == "grows"


def test_missing_fields_are_absent_not_zero():
    rows = samples()
    v = verdicts(rows)
    assert v["rss_mb/planner"].startswith("n/a")  # gone before the second half
    assert v["backlog/records_waiting"] == "flat"  # a quarter of the samples, all 3
    stats = {r["key"]: r for r in report.summarize(rows)}["backlog/records_waiting"]
    assert stats["q1_median"] == 3 and stats["q4_median"] == 3  # not dragged to 0 by the gaps
    rows[5]["counter/learner_steps"] = None  # a null in a row is skipped too
    assert verdicts(rows)["counter/learner_steps"] == "advances"
    assert "dedup/learner_dedup_ids" not in v  # never reported: no row at all
    assert report.summarize([]) == []


def test_report_plot_and_cut_short_samples_file(tmp_path):
    rows = samples(minutes=4)
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"t": 240, "rss_mb/lea'  # a kill mid-line
    (tmp_path / "soak_samples.jsonl").write_text(text)
    loaded = report.load_samples(tmp_path / "soak_samples.jsonl")
    assert loaded == rows
    meta = {"command": "x", "workdir": "w", "every_s": 5, "ending": {"how": "test", "survivors": []}}
    md = report.write_report(tmp_path, loaded, meta)
    assert "| rss_mb | rollout |" in md and "grows" in md and "nothing (no process of the run" in md
    assert (tmp_path / "soak_report.md").read_text() == md
    assert report.plot(tmp_path, loaded).stat().st_size > 0


def test_the_floor_slope_sees_through_swings_that_tilt_the_fitted_line():
    """A learner whose floor rises 0.3 MB/min, with 150 MB save spikes that come more often
    late in the half: the least-squares line says it shrinks, the floor says what stays."""
    rows = []
    for t in range(0, 3600, 5):
        m = t / 60
        saving = (t % 60 < 20) if m < 45 else (t % 60 >= 40)  # the spike's place in each minute moves
        spike = 150 if saving and m < 50 else 0
        rows.append({"t": t, "rss_mb/learner": 700 + 0.3 * m + spike})
    st = {r["key"]: r for r in report.summarize(rows)}["rss_mb/learner"]
    assert abs(st["floor_slope_per_min"] - 0.3) < 0.01
    assert abs(st["slope_per_min"] - 0.3) > 0.3  # the fitted line is pulled off by the spikes
