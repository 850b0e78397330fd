"""A per-run report, WORKDIR/report.md with PNGs under WORKDIR/report/, from the files a finished
run leaves: run_summary.json (or an older run's summary.json), eval.jsonl, logs/*/metrics.jsonl and
trace.json. Every input is optional: a missing one, or a JSONL line cut short by a killed run,
costs its plot a one-line note, never the report. Nothing here reaches the network.

    python -m localstack.reports.report WORKDIR [--timeline_out PNG --start_s S --window_s W]
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt

from core import config
from core.config import configclass, knob
from core.contracts.run_summary import Accounting
from core.telemetry.scalars import read_rows as read_jsonl  # tolerant of a line cut short
from localstack.reports.heldout import held_out_summary
from localstack.reports.pass_at import SWEEP, format_pass_at, pass_at_summary, plot_pass_at
from localstack.reports.reconcile import Reconciliation, format_reconciliation
from localstack.reports.summary import DemoSummary, read_summary
from localstack.reports.timeline import render_timeline
from localstack.reports.tracking import reward_tracking, tracking_text
from trainer.learning.data.accounting import format_accounting

DPI = 100
DEFAULT_TARGET = 0.9
PERFETTO = "it opens in https://ui.perfetto.dev (Open trace file) or chrome://tracing"


class _Missing(Exception):
    """An input a plot needs is absent: the report says so in one line instead."""


# -- reading -----------------------------------------------------------------------------
def _num(v) -> float | None:
    """A finite number, else None (bools, strings and NaN in a partial row are not data)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _series(rows: list[dict], xkey: str, ykey: str) -> tuple[list[float], list[float]]:
    pts = [(x, y) for r in rows if (x := _num(r.get(xkey))) is not None and (y := _num(r.get(ykey))) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


@dataclass
class Run:
    workdir: Path
    summary: DemoSummary | None  # None: no readable summary (`summary_note` says why)
    evals: list[dict]  # rows with a numeric success
    learner: list[dict]
    rollouts: dict[str, list[dict]]  # worker dir name -> rows
    target: float
    summary_note: str = ""


def _target(summary: DemoSummary | None) -> float:
    # held_out carries it at its top or once per mode ({"greedy": {"target": 0.9, ...}}).
    held = summary.held_out if summary is not None else {}
    found = [held.get("target")] + [v.get("target") for v in held.values() if isinstance(v, dict)]
    return next((t for t in map(_num, found) if t is not None), DEFAULT_TARGET)


def load_run(workdir) -> Run:
    wd, logs = Path(workdir), Path(workdir) / "logs"
    summary, note = read_summary(wd)  # the demo's, else the learner's own
    rollouts = {p.parent.name: read_jsonl(p) for p in sorted(logs.glob("rollout-*/metrics.jsonl"))}
    # Rows the evaluator wrote whole: a number for each field the summary and plots read.
    fields = ("success", "version", "published_at")
    evals = [
        {"step": None, **r}
        for r in read_jsonl(wd / "eval.jsonl")
        if isinstance(r.get("mode"), str) and all(_num(r.get(k)) is not None for k in fields)
    ]
    learner = read_jsonl(logs / "learner" / "metrics.jsonl")
    rollouts = {k: v for k, v in rollouts.items() if v}
    return Run(wd, summary, evals, learner, rollouts, _target(summary), note)


# -- summary -----------------------------------------------------------------------------
def _fmt(v) -> str:
    if v is None or v == "":
        return "n/a"
    return (f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}") if isinstance(v, float) else str(v)


def _by_mode(evals: list[dict]) -> dict[str, list[dict]]:
    """Eval rows per mode in version order, sampled then greedy then any other."""
    modes = {str(r.get("mode")) for r in evals} - {SWEEP}  # v0's temperature sweep: its own figure
    modes = sorted(modes, key=lambda m: ({"sampled": 0, "greedy": 1}.get(m, 2), m))
    key = lambda r: (_num(r.get("version")) or 0, _num(r.get("evaluated_at")) or 0)
    return {m: sorted((r for r in evals if str(r.get("mode")) == m), key=key) for m in modes}


def _v0_time(evals: list[dict]) -> float | None:
    """When policy v0 was published (the success plot's zero); the earliest publish without a v0 row."""
    times = [t for r in evals if (t := _num(r.get("published_at"))) is not None]
    v0 = [t for r in evals if r.get("version") == 0 and (t := _num(r.get("published_at"))) is not None]
    return min(v0 or times) if times else None


def _held_out_rows(run: Run) -> list[tuple[str, str]]:
    if not run.evals:
        return [("held-out success", "n/a (no eval.jsonl rows)")]
    held, rows, reached = held_out_summary(run.evals, run.target), [], []
    for mode in _by_mode(run.evals):  # sampled first, as the plots
        first, last, hit = held[mode]["first"], held[mode]["last"], held[mode]["first_at_target"]
        rows.append(
            (
                f"held-out success, {mode} (first → last version)",
                f"{_fmt(first['success'])} (v{first['version']}) → {_fmt(last['success'])} (v{last['version']})",
            )
        )
        reached.append(f"{mode}: v{hit['version']}, {hit['rl_s']:.0f} s after v0" if hit else f"{mode}: not reached")
    rows += [(f"first version reaching target {run.target:g}", "; ".join(reached))]
    return rows + [("pass@k", line) for line in format_pass_at(pass_at_summary(run.evals))]


def summary_rows(run: Run) -> list[tuple[str, str]]:
    s = run.summary
    L = s.learner if s else None
    get = lambda obj, name: getattr(obj, name) if obj is not None else None
    slash = lambda *names: " / ".join(_fmt(get(s if n == "demo_wall_s" else L, n)) for n in names)
    versions = L.policy_versions_published if L else []
    status = L.episode_status if L else {}
    tracking = ("train reward vs held-out sampled, per version", tracking_text(run.learner, run.evals))
    return [
        ("schedule", _fmt(get(L, "schedule"))),
        ("learner steps", _fmt(get(L, "steps"))),
        ("policy versions published", f"{len(versions)} (v{min(versions)}–v{max(versions)})" if versions else "n/a"),
        ("trajectories", _fmt(get(L, "trajectories"))),
        ("mean reward", _fmt(get(L, "mean_reward"))),
        ("episode status", ", ".join(f"{k} {v}" for k, v in status.items()) or "n/a"),
        ("whole demo wall s / warm start s / learner wall s", slash("demo_wall_s", "warmstart_s", "wall_s")),
        ("learner duty cycle (whole run / steady)", slash("learner_duty_cycle", "steady_duty_cycle")),
        ("trained tokens/s (whole run / steady)", slash("trained_tokens_per_s", "steady_trained_tokens_per_s")),
        (
            "records consumed / rejected / duplicates / dropped stale",
            slash("records_consumed", "records_rejected", "records_duplicate", "records_dropped_stale"),
        ),
    ] + [*_held_out_rows(run), tracking]


# -- plots -------------------------------------------------------------------------------
def _save(fig, out) -> Path:
    fig.savefig(out, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return Path(out)


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, color="grey")


def _lines(ax, rows: list[dict], xkey: str, keys: dict[str, str], **labels) -> None:
    """One line per ykey of rows (keys: ykey -> legend label); a "no data" note when none has any."""
    drawn = False
    for (key, label), style in zip(keys.items(), ("-", ":")):
        xs, ys = _series(rows, xkey, key)
        if xs:
            ax.plot(xs, ys, style, marker=".", ms=3, label=label)
            drawn = True
    if drawn:
        ax.legend(fontsize="small")
    else:
        _no_data(ax, " or ".join(keys))
    ax.set(**labels)
    ax.grid(alpha=0.3)


def plot_success(run: Run, out: Path) -> Path:
    t0 = _v0_time(run.evals)
    if t0 is None:
        raise _Missing("no eval.jsonl rows with a publish time")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, evs in _by_mode(run.evals).items():
        xs, ys = _series(evs, "published_at", "success")
        ax.plot([x - t0 for x in xs], ys, marker="o", ms=4, label=mode)
    ax.axhline(run.target, ls="--", color="grey", label=f"target {run.target:g}")
    ax.set(title="Held-out success per published policy version", ylim=(-0.02, 1.05), ylabel="held-out success")
    ax.set_xlabel("wall s since policy v0 was published (each point at its version's publish time)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out)


def plot_pass_k(run: Run, out: Path) -> Path:
    if plot_pass_at(run.evals, out) is None:
        raise _Missing("no eval.jsonl row with pass@k (the evaluator's --samples)")
    return out


def plot_learner(run: Run, out: Path) -> Path:
    if not run.learner:
        raise _Missing("no logs/learner/metrics.jsonl rows")
    fig, (a1, a2) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    duty = {"perf/duty_cycle_recent": "recent", "perf/duty_cycle": "whole run"}
    _lines(a1, run.learner, "perf/wall_s", duty, title="Learner duty cycle and throughput", ylabel="duty cycle")
    a1.set_ylim(0, 1.05)
    tokens = {"perf/trained_tokens_per_s_recent": "recent", "perf/trained_tokens_per_s": "whole run"}
    _lines(a2, run.learner, "perf/wall_s", tokens, ylabel="trained tokens/s", xlabel="learner wall s (perf/wall_s)")
    return _save(fig, out)


def plot_staleness(run: Run, out: Path) -> Path:
    hist = run.summary.learner.staleness_histogram if run.summary else {}
    hist = {int(k): v for k, v in hist.items() if k.isdigit()}
    if not hist and not run.learner:
        raise _Missing("no staleness_histogram in the summary and no learner rows")
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 4))
    if hist:  # keys are versions behind; every bucket up to the largest is drawn, empty ones too
        a1.bar([str(k) for k in range(max(hist) + 1)], [hist.get(k, 0) for k in range(max(hist) + 1)])
    else:
        _no_data(a1, "staleness_histogram")
    a1.set(title="Staleness of consumed records", xlabel="policy versions behind", ylabel="records")
    labels = {"title": "Staleness per learner step", "xlabel": "learner step", "ylabel": "versions behind"}
    _lines(a2, run.learner, "step", {"staleness/mean": "mean", "staleness/max": "max"}, **labels)
    labels = {"title": "Does train reward track held-out?", "xlabel": "policy version", "ylabel": "success / reward"}
    keys = {"train_reward": "train batch reward", "held_out": "held-out sampled"}
    _lines(a3, reward_tracking(run.learner, run.evals), "version", keys, **labels)
    return _save(fig, out)


def plot_fill(run: Run, out: Path) -> Path:
    learner = _series(run.learner, "step", "data/fill")[1]
    roll = [y for rows in run.rollouts.values() for y in _series(rows, "step", "rollout/fill_mean")[1]]
    if not learner and not roll:
        raise _Missing("no data/fill learner rows and no rollout/fill_mean rollout rows")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = {"title": "Packing fill per learner batch", "xlabel": "learner step", "ylabel": "data/fill"}
    _lines(a1, run.learner, "step", {"data/fill": "learner batch"}, **labels)
    a1.set_ylim(0, 1.05)
    # Densities, so a few hundred rollout rows and a few dozen learner steps share one axis.
    both = ((learner, "learner batches (data/fill)", "#2ca02c"), (roll, "rollout rows (rollout/fill_mean)", "#ff7f0e"))
    for vals, label, colour in both:
        if vals:
            a2.hist(vals, bins=np.linspace(0, 1, 21), density=True, alpha=0.6, color=colour, label=label)
    a2.set(title="Fill distribution", xlabel="fill (used / capacity tokens)", ylabel="density")
    a2.legend(fontsize="small")
    return _save(fig, out)


def _summed_rate(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Episodes/s summed over workers, from the first rollout row: each worker's rate
    interpolated onto one 1 s grid (workers report at their own moments), 0 when not running."""
    per = [_series(rows, "wall_time", "rollout/episodes_per_s") for rows in run.rollouts.values()]
    per = [(np.asarray(x), np.asarray(y)) for x, y in per if x]
    if not per:
        return np.array([]), np.array([])
    t0 = min(x[0] for x, _ in per)
    grid = np.arange(0.0, max(x[-1] for x, _ in per) - t0 + 1.0, 1.0)
    return grid, sum(np.interp(grid, x - t0, y, left=0.0, right=0.0) for x, y in per)


def _latency_hist(run: Run) -> tuple[list[float], np.ndarray] | None:
    """Each worker's last env-latency histogram (cumulative since it started), summed."""
    edges, total = None, None
    for rows in run.rollouts.values():
        h = next((r["rollout/env_latency_hist"] for r in reversed(rows) if "rollout/env_latency_hist" in r), None)
        if not isinstance(h, dict) or len(h.get("counts", [])) != len(h.get("edges_ms", [])) + 1:
            continue
        if edges is None:
            edges, total = list(h["edges_ms"]), np.zeros(len(h["counts"]))
        if list(h["edges_ms"]) == edges:  # workers of one run share the edges
            total += np.asarray(h["counts"], dtype=float)
    return (edges, total) if edges else None


def _ms(v: float) -> str:
    return f"{v / 1000:g}s" if v >= 1000 else f"{v:g}ms"


def plot_rollout(run: Run, out: Path) -> Path:
    if not run.rollouts:
        raise _Missing("no logs/rollout-*/metrics.jsonl rows")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4))
    grid, rate = _summed_rate(run)
    if len(grid):
        a1.plot(grid, rate, color="black")
    else:
        _no_data(a1, "rollout/episodes_per_s")
    title = f"Rollout episodes per second, summed over {len(run.rollouts)} worker(s)"
    a1.set(title=title, xlabel="wall s since the first rollout row", ylabel="episodes/s")
    a1.grid(alpha=0.3)
    hist = _latency_hist(run)
    if hist:  # bucket i holds edges[i-1] <= ms < edges[i] (searchsorted side="right")
        edges, counts = hist
        labels = [f"<{_ms(edges[0])}"] + [f"{_ms(a)}–{_ms(b)}" for a, b in itertools.pairwise(edges)]
        a2.bar(labels + [f"≥{_ms(edges[-1])}"], counts, color="#4682b4")
        a2.tick_params(axis="x", rotation=45)
    else:
        _no_data(a2, "rollout/env_latency_hist")
    a2.set(title="Env latency, whole run (last row of each worker)", xlabel="latency", ylabel="env calls")
    return _save(fig, out)


def plot_timeline(run: Run, out: Path, start_s: float | None = None, window_s: float = 20.0) -> Path:
    if not (run.workdir / "trace.json").exists():
        raise _Missing("no trace.json (the run was not traced: the demo's --trace)")
    if render_timeline(run.workdir / "trace.json", out, start_s, window_s) is None:
        raise _Missing("trace.json has no readable spans")
    return out


# -- the report --------------------------------------------------------------------------
PLOTS = [  # (file name, section title, plot(run, out_png))
    ("success", "Held-out success", plot_success),
    ("pass_at_k", "Held-out pass@k: learning or sharpening?", plot_pass_k),
    ("learner", "Learner duty cycle and throughput", plot_learner),
    ("staleness", "Staleness", plot_staleness),
    ("fill", "Packing fill", plot_fill),
    ("rollout", "Rollout throughput and env latency", plot_rollout),
]


def _section(run: Run, name: str, title: str, plot, lead: str = "") -> list[str]:
    lines = [f"## {title}", "", *([lead, ""] if lead else [])]
    try:
        plot(run, run.workdir / "report" / f"{name}.png")
    except _Missing as why:
        return lines + [f"_Skipped: {why}._", ""]
    except Exception as err:  # a report must never fail the run it describes
        plt.close("all")
        return lines + [f"_Skipped: the plot failed ({type(err).__name__}: {err})._", ""]
    return lines + [f"![{title}](report/{name}.png)", ""]


def _files_section(wd: Path) -> list[str]:
    lines = ["## Files", ""]
    if (wd / "logs").is_dir():
        lines.append(f"- `logs/`: TensorBoard scalars, one run per process: `tensorboard --logdir {wd / 'logs'}`")
        metrics = sorted(wd.glob("logs/*/metrics.jsonl"))
        lines += [f"- `{p.relative_to(wd)}` ({len(read_jsonl(p))} rows)" for p in metrics]
    else:
        lines.append("- `logs/`: missing (this run wrote no TensorBoard logs or metrics.jsonl)")
    for name in ("eval.jsonl", "run_summary.json", "summary.json", "trace.json"):
        rows = f" ({len(read_jsonl(wd / name))} rows)" if name.endswith(".jsonl") else ""
        lines += [f"- `{name}`{rows}"] if (wd / name).exists() else [f"- `{name}`: missing"]
    return lines + [""]


def _accounting_section(acc: Accounting | None, joined: Reconciliation | None = None) -> list[str]:
    """The learner's two trajectory balances (trainer/learning/data/accounting.py) and, joined to
    them, the rollout side's counts (localstack/reports/reconcile.py); a mismatch in bold."""
    lines = ["## Where every trajectory went", ""]
    if not acc:
        return lines + ["_Skipped: no summary to take the accounting from._", ""]
    bold = lambda line: f"- **{line}**" if line.startswith("MISMATCH") else f"- {line}"
    lines += [bold(line) for line in format_accounting(acc)]
    if joined:
        lines += ["", "The rollout workers' counts, joined:", ""]
        lines += [bold(line) for line in format_reconciliation(joined, acc)]
    return lines + [""]


def write_report(workdir, start_s: float | None = None, window_s: float = 20.0) -> Path:
    """WORKDIR/report.md and its PNGs under WORKDIR/report/; returns report.md's path."""
    run = load_run(workdir)
    (run.workdir / "report").mkdir(parents=True, exist_ok=True)
    lines = [f"# Run report: {run.workdir}", "", "## Summary", ""]
    if not run.summary:
        lines += [f"_{run.summary_note}: the learner's figures are missing._", ""]
    lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in summary_rows(run)), ""]
    s = run.summary
    lines += _accounting_section(s and s.learner.accounting, s and s.reconciliation)
    for name, title, plot in PLOTS:
        lines += _section(run, name, title, plot)
    traced = (run.workdir / "trace.json").exists()
    lead = f"[trace.json](trace.json) holds every process's spans: {PERFETTO}." if traced else ""
    timeline = lambda run, out: plot_timeline(run, out, start_s, window_s)
    lines += _section(run, "timeline", "Timeline", timeline, lead)
    path = run.workdir / "report.md"
    path.write_text("\n".join(lines + _files_section(run.workdir)))
    return path


@configclass
class ReportFlags:
    timeline_out: str | None = knob(None, "write only this timeline PNG, from WORKDIR/trace.json")
    start_s: float | None = knob(None, "timeline start, s since the trace's first event")
    window_s: float = knob(20.0, "timeline window length, s")


def main(argv=None) -> None:
    p = config.make_parser(ReportFlags, "Write WORKDIR/report.md (and PNGs) for a finished run.")
    p.add_argument("workdir", help="a finished run's directory")
    ns = p.parse_args(argv)
    args = config.from_namespace(ReportFlags, ns)
    if args.timeline_out:
        trace = Path(ns.workdir) / "trace.json"
        print(render_timeline(trace, args.timeline_out, args.start_s, args.window_s) or f"no spans in {trace}")
    else:
        print(write_report(ns.workdir, args.start_s, args.window_s))


if __name__ == "__main__":
    main()
