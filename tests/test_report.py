"""The run report (localstack/reports/report.py) on small fabricated run directories: every plot it
references is a real, non-blank PNG, and missing or cut-short inputs cost a note, not the report."""

from __future__ import annotations

import json
import re

import matplotlib.image as mpimg
import numpy as np

from core.contracts.run_summary import RunSummary
from localstack.reports import report, timeline, tracking
from localstack.reports.summary import DemoSummary
from trainer.learning.data.accounting import trajectory_accounting

T0 = 1_800_000_000.0  # unix seconds the fabricated run starts at
FIRST_TRAIN_S = 6.0 + 1.2  # warm start 6 s, then 1.2 s waiting for the first batch
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_jsonl(path, rows, tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def _span(name, t_s, dur_s, pid, tid):
    return {"name": name, "ph": "X", "ts": (T0 + t_s) * 1e6, "dur": dur_s * 1e6, "pid": pid, "tid": tid}


def _meta(pid, tid, kind, name):
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def make_trace(steps: int = 21, lanes: int = 30) -> dict:
    """A learner stepping every 2 s after a 6 s warm start, a rollout worker with `lanes`
    episode lanes plus packer/pubsub/policy tracks, and an evaluator."""
    ev = [_meta(1, 0, "process_name", "learner (pid 1)"), _meta(1, 1, "thread_name", "learner")]
    ev.append(_span("warm start or restore", 0.0, 6.0, 1, 1))
    for k in range(steps):
        t = 6.0 + 2 * k
        ev += [_span("wait for data", t, 1.2, 1, 1), _span("poll", t, 0.5, 1, 1), _span("poll", t + 0.5, 0.6, 1, 1)]
        ev += [_span("train step", t + 1.2, 0.6, 1, 1), _span("publish", t + 1.8, 0.1, 1, 1)]
    ev.append(_meta(2, 0, "process_name", "rollout (pid 2)"))
    tracks = ["policy", "worker", "pubsub write", "requests", "packer 256"] + [f"episode {i}" for i in range(lanes)]
    ev += [_meta(2, tid, "thread_name", name) for tid, name in enumerate(tracks, start=1)]
    ev += [_span("policy reload", 1.0, 0.3, 2, 1), _span("compile", 0.5, 4.0, 2, 2)]
    for j in range(lanes):
        for t in np.arange(5.0 + 0.1 * j, 6.0 + 2 * steps, 3.0):
            ev += [_span("episode", t, 2.5, 2, 6 + j), _span("model turn", t, 1.0, 2, 6 + j)]
            ev += [_span("tool call", t + 1.0, 0.8, 2, 6 + j), _span("model turn", t + 1.8, 0.7, 2, 6 + j)]
    for t in np.arange(5.0, 6.0 + 2 * steps, 0.25):
        ev += [_span("pubsub publish", t, 0.00005, 2, 3), _span("wait for policy", t, 0.01, 2, 4)]
        ev.append({"name": "record flush", "ph": "i", "s": "t", "ts": (T0 + t) * 1e6, "pid": 2, "tid": 5, "args": {}})
    ev.append({"name": "groups in flight", "ph": "C", "ts": (T0 + 5) * 1e6, "pid": 2, "args": {"groups": 3}})
    ev += [_meta(3, 0, "process_name", "evaluator (pid 3)"), _meta(3, 1, "thread_name", "evaluator")]
    for t in np.arange(6.0, 2.0 * steps, 14.0):  # evaluations while the learner runs
        ev += [_span("load policy", t, 0.5, 3, 1), _span("evaluate", t + 0.5, 6.0, 3, 1)]
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def _eval_rows() -> list[dict]:
    rows = []
    for version, step, sampled, greedy in ((0, 0, 0.25, 0.1), (1, 5, 0.95, 0.6)):
        for mode, success in (("sampled", sampled), ("greedy", greedy)):
            row = {"version": version, "step": step, "mode": mode, "published_at": T0 + 6 + 20 * version}
            rows.append({**row, "evaluated_at": row["published_at"] + 5, "n": 32, "success": success})
    for row, at_4 in ((rows[0], 0.5), (rows[2], 1.0)):  # sampled: 8 tasks x 4, pass@k
        row.update(samples=4, tasks=8, temperature=1.0, success_se=0.05, pass_at={"1": row["success"], "4": at_4})
        row["pass_at_se"] = {"1": 0.05, "2": 0.06, "4": 0.07}
        row["pass_at"]["2"] = (row["success"] + at_4) / 2
    sweep = {
        **rows[0],
        "mode": "sweep",
        "temperature": 0.5,
        "success": 0.3,
        "evaluated_at": rows[0]["evaluated_at"] + 1,
    }
    return rows + [{**sweep, "pass_at": {"1": 0.3, "2": 0.35, "4": 0.4}}]


def _summary() -> RunSummary:
    return RunSummary(
        steps=10,
        policy_versions_published=[0, 1, 2],
        trajectories=320,
        mean_reward=0.5,
        wall_s=40.0,
        learner_duty_cycle=0.3,
        steady_duty_cycle=0.35,
        trained_tokens_per_s=1234.5,
        steady_trained_tokens_per_s=1500.0,
        records_consumed=40,
        records_rejected=1,
        records_duplicate=2,
        records_dropped_stale=3,
        staleness_histogram={"0": 30, "1": 8, "3": 2},
        episode_status={"finished": 300, "truncated": 20},
        schedule="async",
    )


CUT = '{"version": 9, "step": 9, "mode": "sam'  # a writer killed mid-line


def make_run(wd, logs: bool = True, trace: bool = True) -> None:
    """A finished run's directory: 10 learner rows, 5 rollout rows, 4 eval rows, a trace;
    every JSONL file ends in a line cut short, as a killed run leaves it."""
    _write_jsonl(wd / "eval.jsonl", _eval_rows(), tail=CUT)
    if not logs:  # a learner run without the demo: the learner's summary.json and eval.jsonl only
        (wd / "summary.json").write_text(_summary().to_json())
        return
    learner = _summary()
    learner.accounting = trajectory_accounting(
        requested=400,
        received=330,
        trained=320,
        dropped_stale=10,
        buffered=0,
        dropped_by_pipeline={"zero_signal": 40},
        written_off=0,
        in_flight=25,  # 5 requested trajectories are nowhere: the report must say so
    )
    summary = DemoSummary(learner, held_out={"greedy": {"target": 0.9}}, demo_wall_s=60.0, workdir=str(wd))
    (wd / "run_summary.json").write_text(summary.to_json())
    learner = [
        {"step": s, "wall_time": T0 + 7 + 2 * s, "perf/wall_s": 2.0 * s, "perf/duty_cycle": 0.03 * s}
        | {"perf/duty_cycle_recent": 0.05 * s, "perf/trained_tokens_per_s_recent": 100.0 * s}
        | {"perf/trained_tokens_per_s": 80.0 * s, "staleness/mean": s % 3 / 2, "staleness/max": s % 3}
        | {"data/fill": 0.5 + 0.04 * s, "data/batch_reward": 0.1 * s, "policy/version": s // 5}
        for s in range(1, 11)
    ]
    _write_jsonl(wd / "logs/learner/metrics.jsonl", learner, tail=CUT)
    edges = [10, 50, 100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000]
    rollout = [
        {"step": 2 * i, "wall_time": T0 + 5 + 2 * i, "rollout/episodes": 20 * i, "rollout/episodes_per_s": 10.0 * i}
        | {"rollout/fill_mean": 0.6 + 0.05 * i}
        | {"rollout/env_latency_hist": {"edges_ms": edges, "counts": [0, i, 5 * i, 3 * i, i, 0, 0, 0, 0, 0, 0, 0]}}
        for i in range(5)
    ]
    _write_jsonl(wd / "logs/rollout-vm-2/metrics.jsonl", rollout, tail=CUT)
    _write_jsonl(wd / "logs/evaluator/metrics.jsonl", [{"step": 0, "eval/success": 0.25}])
    if trace:
        (wd / "trace.json").write_text(json.dumps(make_trace()))


def _png_refs(text: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\((report/[^)]+\.png)\)", text)


def assert_legible_png(path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, (path, img.shape)
    rgb = (img[..., :3] * 255).astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], dtype=np.uint32)
    assert len(np.unique(rgb)) > 10, f"{path} is (nearly) one colour"


def test_full_run_report_embeds_every_plot(tmp_path):
    make_run(tmp_path)
    path = report.write_report(tmp_path)
    assert path == tmp_path / "report.md"
    text = path.read_text()
    assert f"# Run report: {tmp_path}" in text
    assert "[trace.json](trace.json)" in text and "https://ui.perfetto.dev" in text and "chrome://tracing" in text
    refs = _png_refs(text)
    names = {"success", "pass_at_k", "learner", "staleness", "fill", "rollout", "timeline"}
    assert sorted(refs) == sorted(f"report/{n}.png" for n in names)
    for ref in refs:
        assert_legible_png(tmp_path / ref)
    assert "Skipped" not in text
    assert "requested 400 = received 330 + dropped by the pipeline (zero_signal 40)" in text
    assert "**MISMATCH: 5 requested and 0 received trajectories are not accounted for**" in text
    # The summary table, from run_summary.json and eval.jsonl.
    assert "| learner steps | 10 |" in text
    assert "| policy versions published | 3 (v0–v2) |" in text
    assert "| records consumed / rejected / duplicates / dropped stale | 40 / 1 / 2 / 3 |" in text
    assert "| learner duty cycle (whole run / steady) | 0.3 / 0.35 |" in text
    assert "| held-out success, sampled (first → last version) | 0.25 (v0) → 0.95 (v1) |" in text
    assert "| first version reaching target 0.9 | sampled: v1, 20 s after v0; greedy: not reached |" in text
    # Versions 0 and 1 have both a train reward and a held-out score: too few for an r.
    assert "| train reward vs held-out sampled, per version | n/a (2 versions with both) |" in text
    assert f"tensorboard --logdir {tmp_path / 'logs'}" in text
    # Each file's cut-short last line was skipped.
    # pass@k at both ends, and v0's sweep (its row is not a mode of its own in the curves).
    assert "| pass@k | held-out at v1 (last): pass@1 0.950 ± 0.050, pass@4 1.000 ± 0.070" in text
    assert "v0 pass@1 by temperature: T=0.5 0.300 ± 0.050, T=1 0.250 ± 0.050" in text
    assert "is above v0's best pass@1 over temperatures (0.300 at T=0.5)" in text and "sweep (first" not in text
    assert "`logs/learner/metrics.jsonl` (10 rows)" in text and "`eval.jsonl` (5 rows)" in text
    assert "(v9)" not in text


def test_summary_and_eval_only_notes_what_is_missing(tmp_path):
    make_run(tmp_path, logs=False)
    text = report.write_report(tmp_path).read_text()
    # All three need only these two files.
    assert _png_refs(text) == ["report/success.png", "report/pass_at_k.png", "report/staleness.png"]
    for ref in _png_refs(text):
        assert_legible_png(tmp_path / ref)
    assert "_Skipped: no logs/learner/metrics.jsonl rows._" in text
    assert "_Skipped: no logs/rollout-*/metrics.jsonl rows._" in text
    assert "_Skipped: no data/fill learner rows" in text
    assert "_Skipped: no trace.json" in text and "[trace.json](trace.json)" not in text
    assert "`logs/`: missing" in text and "`trace.json`: missing" in text
    assert "| learner steps | 10 |" in text  # from the learner's summary.json
    assert not (tmp_path / "report" / "timeline.png").exists()


def test_empty_workdir_still_gets_a_report(tmp_path):
    text = report.write_report(tmp_path).read_text()
    assert _png_refs(text) == []
    assert text.count("_Skipped:") == 8  # seven plots and the accounting
    assert "No run_summary.json or summary.json" in text and "| learner steps | n/a |" in text


def test_a_summary_of_another_schema_version_is_noted_not_guessed_at(tmp_path):
    data = {**_summary().to_dict(), "schema_version": 99}
    (tmp_path / "summary.json").write_text(json.dumps(data))
    text = report.write_report(tmp_path).read_text()
    assert "summary.json could not be read: the run summary has schema_version 99" in text
    assert "| learner steps | n/a |" in text


def test_truncated_last_jsonl_line_is_skipped(tmp_path):
    rows = [{"step": 1, "data/fill": 0.5}, {"step": 2, "data/fill": 0.7}]
    _write_jsonl(tmp_path / "m.jsonl", rows, tail='{"step": 3, "data/fi')
    assert report.read_jsonl(tmp_path / "m.jsonl") == rows
    assert report.read_jsonl(tmp_path / "absent.jsonl") == []
    make_run(tmp_path)  # every file ends in a cut line (the full-report test renders this run)
    run = report.load_run(tmp_path)
    assert len(run.evals) == 5 and len(run.learner) == 10 and len(run.rollouts["rollout-vm-2"]) == 5
    assert max(r["version"] for r in run.evals) == 1


def test_timeline_window_starts_after_the_first_train_step(tmp_path):
    events = make_trace()["traceEvents"]
    start, end = timeline.timeline_window(events)
    assert start > T0 + FIRST_TRAIN_S  # the start-up compile and warm start are left out
    assert abs(start - (T0 + FIRST_TRAIN_S + timeline.SKIP_COMPILE_S)) < 1e-6 and abs(end - start - 20.0) < 1e-6
    short = make_trace(steps=5)["traceEvents"]  # 16 s of steps: too short to skip 10 s and show 20
    assert abs(timeline.timeline_window(short)[0] - (T0 + FIRST_TRAIN_S)) < 1e-6
    start, end = timeline.timeline_window(events, start_s=3.0, window_s=5.0)  # from the trace's first event
    assert abs(start - (T0 + 3.0)) < 1e-6 and abs(end - (T0 + 8.0)) < 1e-6
    assert timeline.timeline_window([]) is None
    assert timeline.render_timeline(tmp_path / "absent.json", tmp_path / "t.png") is None


def test_timeline_rows_are_capped_and_ordered():
    events = make_trace()["traceEvents"]
    labels = timeline._row_labels(events)
    assert labels[(1, 1)] == "learner: learner" and labels[(2, 9)] == "rollout: episode 3"
    assert timeline._row_labels(events + [_span("x", 1.0, 1.0, 1, 7)])[(1, 7)] == "learner: track 7"  # unnamed
    rows, left = timeline._pick_rows(labels.values())
    assert len(rows) == timeline.MAX_TIMELINE_ROWS and left == 30 - (24 - 2 - 5)
    assert rows[:3] == ["learner: learner", "evaluator: evaluator", "rollout: episode 0"]
    assert rows[-5:] == ["rollout: packer 256", "rollout: policy", "rollout: pubsub write", "rollout: requests"] + [
        "rollout: worker"
    ]
    # A poll inside a wait for data is one level deeper, so it is drawn thinner, on top.
    depth = {name: d for _, _, name, d in timeline._with_depth([(0, 10, "wait for data"), (1, 4, "poll")])}
    assert depth == {"wait for data": 0, "poll": 1}


def test_cli_writes_only_the_timeline_when_asked(tmp_path, capsys):
    make_run(tmp_path)
    out = tmp_path / "window.png"
    report.main([str(tmp_path), "--timeline_out", str(out), "--start_s", "30", "--window_s", "5"])
    assert_legible_png(out)
    assert not (tmp_path / "report.md").exists()
    assert str(out) in capsys.readouterr().out


def test_reward_tracking_pairs_each_versions_train_reward_with_its_held_out_score():
    steps = ((0, 0.2), (0, 0.4), (1, 0.5), (2, 0.9), (3, 1.0))
    learner = [{"policy/version": v, "data/batch_reward": r} for v, r in steps]
    learner.append({"perf/wall_s": 1.0})  # a row without a reward: not a step's
    evals = [{"version": v, "mode": "sampled", "success": x} for v, x in ((0, 0.1), (1, 0.4), (2, 0.7))]
    evals.append({"version": 3, "mode": "greedy", "success": 1.0})  # greedy: not the sampled curve
    pairs = tracking.reward_tracking(learner, evals)
    assert pairs == [
        {"version": 0, "train_reward": 0.3, "held_out": 0.1},
        {"version": 1, "train_reward": 0.5, "held_out": 0.4},
        {"version": 2, "train_reward": 0.9, "held_out": 0.7},
    ]
    assert tracking.tracking_r(pairs) > 0.95
    assert tracking.tracking_r([{**p, "held_out": 0.5} for p in pairs]) is None  # a flat curve has no r
