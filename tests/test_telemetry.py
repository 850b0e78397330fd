"""Telemetry files: spans (trace.py), scalars (scalars.py), the rollout and learner rows."""

from __future__ import annotations

import json
import math
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from core.telemetry import scalars, trace
from rollout.telemetry import LATENCY_EDGES_MS, RolloutTelemetry
from trainer.learning.telemetry import LearnerTelemetry


def test_spans_from_threads_are_all_written_and_merge_into_one_trace(tmp_path):
    tracer = trace.Tracer(tmp_path / "t", "learner", flush_every_s=0.05)

    def work(i):
        for j in range(50):
            with tracer.span("outer", f"lane {i}", j=j):
                with tracer.span("inner", f"lane {i}"):
                    pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tracer.close()
    other = trace.Tracer(tmp_path / "t", "rollout")
    other.complete("episode", "episode 0", 1_000, 2_000_000, status="finished")
    other.close()

    counts = trace.merge(tmp_path / "t", tmp_path / "trace.json")
    doc = json.loads((tmp_path / "trace.json").read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 4 * 50 * 2 + 1 == sum(counts["spans_by_process"].values())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"lane 0", "lane 1", "lane 2", "lane 3", "episode 0"}
    procs = {e["args"]["name"].split(" ")[0] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {"learner", "rollout"}
    # Each inner span lies within an outer span of its own lane: the viewer nests them.
    by_lane = {}
    for e in spans:
        by_lane.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in by_lane.values():
        outers = [e for e in evs if e["name"] == "outer"]
        for inner in (e for e in evs if e["name"] == "inner"):
            assert any(o["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= o["ts"] + o["dur"] for o in outers)
    ep = next(e for e in spans if e["name"] == "episode")
    assert ep["dur"] == pytest.approx(1999.0) and ep["args"] == {"status": "finished"}


def test_spans_carry_wall_clock_microseconds(tmp_path):
    import time

    before = time.time() * 1e6
    tracer = trace.Tracer(tmp_path, "p")
    with tracer.span("x"):
        time.sleep(0.01)
    tracer.close()
    (ev,) = [e for e in trace.read_events(tracer.path) if e["ph"] == "X"]
    assert before <= ev["ts"] <= time.time() * 1e6 and 9_000 <= ev["dur"] < 1_000_000


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path):
    tracer = trace.Tracer(tmp_path, "p")
    with tracer.span("kept"):
        pass
    tracer.close()
    with tracer.path.open("a") as f:
        f.write('[{"name": "cut", "ph": "X", "ts": 1')  # no newline, no closing brackets
    names = [e["name"] for e in trace.read_events(tracer.path)]
    assert "kept" in names and "cut" not in names


def test_tracing_off_is_the_null_tracer_and_its_span_args_are_not_shared():
    with trace.NULL.span("x", "t", a=1) as span:
        span.args.update(b=2)
    assert trace.NULL.span("y").args == {}
    assert trace.make_tracer(None, "p") is trace.NULL


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=80))
def test_lanes_are_never_shared_and_never_more_than_were_busy_at_once(ops):
    lanes, busy, peak = trace.Lanes("episode"), [], 0
    for take in ops:
        if take or not busy:
            lane = lanes.take()
            assert lane not in busy
            busy.append(lane)
            peak = max(peak, len(busy))
        else:
            lanes.give_back(busy.pop(len(busy) // 2))
        assert max(int(b.split()[1]) for b in busy) < peak if busy else True


def test_scalars_reach_tensorboard_and_jsonl_alike(tmp_path):
    w = scalars.ScalarWriter(tmp_path, "learner")
    for step in range(1, 4):
        w.write(step, {"losses/policy_loss": 0.5 / step, "perf/duty_cycle": 0.1 * step, "data/hist": [1, 2]})
    w.write(4, {"losses/policy_loss": math.nan})
    w.close()
    acc = EventAccumulator(str(tmp_path / "learner"))
    acc.Reload()
    assert {"losses/policy_loss", "perf/duty_cycle"} <= set(acc.Tags()["scalars"])
    loss = acc.Scalars("losses/policy_loss")
    assert [e.step for e in loss] == [1, 2, 3]  # the NaN stays out of TensorBoard
    assert loss[1].value == pytest.approx(0.25)
    rows = scalars.read_rows(tmp_path / "learner" / scalars.JSONL)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["data/hist"] == [1, 2] and rows[3]["losses/policy_loss"] is None
    assert all(isinstance(r["wall_time"], float) for r in rows)
    # Strict JSON (no NaN literal), so jq and other tools read it too.
    for line in (tmp_path / "learner" / scalars.JSONL).read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def _traj(status="finished", generated=10, latency_s=0.3, reward=1.0, tool_wait_s=0.0):
    return SimpleNamespace(
        status=status, loss_mask=np.ones(generated), env_latency_s=latency_s, reward=reward, tool_wait_s=tool_wait_s
    )


WRITE_SCALARS_THEN_TORCH = """
import sys, tempfile
from core.telemetry import scalars
w = scalars.ScalarWriter(tempfile.mkdtemp(), "learner")
w.write(1, {"losses/policy_loss": 0.5})
w.close()
print("torch" in sys.modules)
import torch  # still importable by whatever needs it afterwards
print(float(torch.ones(2).sum()))
"""


@pytest.mark.e2e  # a Python process of ours: only a fresh one shows what importing costs
def test_writing_scalars_does_not_import_torch_and_leaves_it_importable():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", WRITE_SCALARS_THEN_TORCH], cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "2.0"]


def test_rollout_rows_turn_counts_into_rates_and_a_latency_histogram():
    now = [100.0]
    rows = []
    writer = SimpleNamespace(write=lambda step, row: rows.append((step, row)), close=lambda: None, local_dir=None)
    tel = RolloutTelemetry(writer, trace.NULL, clock=lambda: now[0])
    busy = [0.0]
    tel.source = lambda: {"policy_version": 3, "engine_busy_s": busy[0]}
    tel.on_group([_traj(latency_s=0.005), _traj(latency_s=0.3, tool_wait_s=0.25), _traj("truncated", latency_s=50.0)])
    tel.on_record(0.75, 400, "max_wait")
    now[0], busy[0] = 102.0, 1.0
    tel.write_row()
    step, row = rows[-1]
    assert step == 2
    assert row["rollout/episodes"] == 3 and row["rollout/episodes_truncated"] == 1
    assert row["rollout/episodes_per_s"] == pytest.approx(1.5)
    assert row["rollout/generated_tokens_per_s"] == pytest.approx(15.0)
    assert row["rollout/engine_busy"] == pytest.approx(0.5)
    assert row["rollout/fill_mean"] == pytest.approx(0.75) and row["rollout/flush_latency_ms_p95"] == 400
    assert row["rollout/policy_version"] == 3 and row["rollout/flush_max_wait"] == 1
    hist = row["rollout/env_latency_hist"]
    assert hist["edges_ms"] == list(LATENCY_EDGES_MS) and sum(hist["counts"]) == 3
    assert hist["counts"][0] == 1 and hist["counts"][-1] == 1  # 5 ms and 50 s: the two ends
    # The tools' declared waits count only episodes that called one: 250 ms, not diluted by the others.
    assert row["rollout/tool_wait_ms_p50"] == 250 and row["rollout/tool_wait_ms_p95"] == 250
    now[0] = 104.0
    tel.write_row()  # nothing new: rates fall to zero, cumulative counts stay
    _, row = rows[-1]
    assert row["rollout/episodes_per_s"] == 0 and row["rollout/episodes"] == 3
    assert "rollout/fill_mean" not in row and row["rollout/engine_busy"] == 0


def test_learner_rows_report_recent_and_whole_run_duty_cycle():
    now = [0.0]
    rows = []
    writer = SimpleNamespace(write=lambda step, row: rows.append(row), close=lambda: None)
    tel = LearnerTelemetry(writer, trace.NULL, started=0.0, recent_s=10.0, clock=lambda: now[0])
    rec = SimpleNamespace(num_tokens=512, tokens=np.zeros((4, 256)), trajectories=[SimpleNamespace(reward=1.0)])
    staleness = SimpleNamespace(staleness=lambda r, v: 1, dropped_records=0, histogram={0: 3, 2: 1})
    parts = SimpleNamespace(
        staleness=staleness,
        credits=SimpleNamespace(outstanding=7, window=24),
        consumer=SimpleNamespace(
            rejected=0, duplicates=0, pubsub_errors=0, deliveries=SimpleNamespace(held={"r": 1}, consumed={"a": 0})
        ),
        batches=SimpleNamespace(queues={(4, 256): [rec]}),
        feeder=None,
    )
    stats = SimpleNamespace(step_time_s=0.0, trained_tokens=0, records=0, trajectories_received=0)
    for t in (1.0, 2.0, 20.0):  # two steps early, then a long starved gap
        now[0] = t
        stats.step_time_s += 0.5
        stats.trained_tokens += 512
        tel.on_step(len(rows) + 1, 1, stats, [rec], {"losses/policy_loss": 0.0}, 0.5, parts)
    first, last = rows[0], rows[-1]
    assert first["mem/rss_mb"] > 0 and "mem/rss_mb" not in rows[1] and "mem/rss_mb" not in last  # every 30 s
    assert first["perf/duty_cycle_recent"] == pytest.approx(0.5)  # 0.5 s of 1 s so far
    assert last["perf/duty_cycle"] == pytest.approx(1.5 / 20)
    assert last["perf/duty_cycle_recent"] == pytest.approx(0.5 / 10)  # only the last step is recent
    now[0] = 100.0  # a step far longer than the window: it fills the window, no more
    tel.on_step(len(rows) + 1, 1, stats, [rec], {"losses/policy_loss": 0.0}, 60.0, parts)
    assert rows[-1]["perf/duty_cycle_recent"] == pytest.approx(1.0)
    assert rows[-1]["perf/trained_tokens_per_s_recent"] == pytest.approx(rec.num_tokens * 10 / 60 / 10, abs=0.1)
    assert last["data/fill"] == pytest.approx(0.5) and last["staleness/max"] == 1
    assert last["data/records_buffered"] == 1 and last["feeder/in_flight"] == 7
    assert (last["staleness/records_0"], last["staleness/records_2"]) == (3, 1) and "staleness/records_1" not in last
    assert last["feeder/window"] == 24 and "lag/target" not in last  # no lag controller: no lag/ keys
    parts.lag = SimpleNamespace(cfg=SimpleNamespace(target=2.4), changes=[object()], last_lag=3.125)
    tel.on_step(len(rows) + 1, 1, stats, [rec], {"losses/policy_loss": 0.0}, 0.5, parts)
    assert (rows[-1]["lag/target"], rows[-1]["lag/measured"], rows[-1]["lag/changes"]) == (2.4, 3.125, 1)


@pytest.mark.e2e
def test_a_gs_logdir_gets_both_files(tmp_path):
    """Vertex AI's AIP_TENSORBOARD_LOG_DIR is a gs:// path: event files and JSONL land there."""
    import uuid

    from etils import epath

    from localstack.emulators import gcs as gcs_emulator

    emu = gcs_emulator.shared()
    emu.apply_env()
    try:
        logdir = emu.uri(f"tb/{uuid.uuid4().hex[:8]}")
        w = scalars.ScalarWriter(logdir, "learner")
        for step in (1, 2):
            w.write(step, {"losses/policy_loss": 0.1 * step})
        w.close()
        rows = [json.loads(line) for line in epath.Path(f"{logdir}/learner/{scalars.JSONL}").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        events = [p for p in epath.Path(f"{logdir}/learner").iterdir() if "tfevents" in p.name]
        assert len(events) == 1
        local = tmp_path / "learner"
        local.mkdir()
        (local / events[0].name).write_bytes(events[0].read_bytes())
        acc = EventAccumulator(str(local))
        acc.Reload()
        assert [e.step for e in acc.Scalars("losses/policy_loss")] == [1, 2]
    finally:
        emu.restore_env()


def test_a_steps_staleness_counts_from_the_version_it_trained_on_not_the_one_it_published():
    rows = []
    writer = SimpleNamespace(write=lambda step, row: rows.append(row), close=lambda: None)
    tel = LearnerTelemetry(writer, trace.NULL, started=0.0, clock=lambda: 1.0)
    rec = SimpleNamespace(num_tokens=8, tokens=np.zeros((1, 16)), trajectories=[SimpleNamespace(reward=1.0)])
    parts = SimpleNamespace(
        staleness=SimpleNamespace(staleness=lambda r, v: v - 3, dropped_records=0, histogram={}),  # generated by v3
        credits=SimpleNamespace(outstanding=0, window=8),
        consumer=SimpleNamespace(
            rejected=0, duplicates=0, pubsub_errors=0, deliveries=SimpleNamespace(held={}, consumed={})
        ),
        batches=SimpleNamespace(queues={}),
        feeder=None,
    )
    stats = SimpleNamespace(step_time_s=0.5, trained_tokens=8, records=1, trajectories_received=1)
    tel.on_step(1, 5, stats, [rec], {}, 0.5, parts, trained_at=4)  # trained on v4, then published v5
    assert rows[-1]["staleness/mean"] == 1 and rows[-1]["policy/version"] == 5
    tel.on_step(2, 5, stats, [rec], {}, 0.5, parts)  # no publish: the same version
    assert rows[-1]["staleness/mean"] == 2
