"""The soak's verdicts, report and plot, from its samples (benchmarks/soak.py).

A sample is one flat dict: `t` (seconds since the demo started), `wall_time`, and
`family/series` numbers, e.g. `rss_mb/learner`, `threads/emulator`, `backlog/records_waiting`,
`counter/learner_steps`. A series missing from a sample (a process not started yet, a
telemetry field this version does not write) is absent there, never zero.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# -- thresholds: what "flat" means over the second half of the run (the first half holds
# start-up: JIT compiles, the JVM warming, buffers filling) --------------------------------
# RSS: allocators and JAX caches wobble by a few MB; a leak of 2 MB/min is 240 MB over two
# hours, which matters on a small worker, so both a relative and an absolute bound.
RSS_MAX_REL_GROWTH = 0.05  # fitted growth over the second half / its starting level
RSS_MAX_MB_PER_10MIN = 20.0
# Threads and fds are integers that must come back: a thread pool or a socket per request
# that is never closed shows as a steady climb; +2 allows one in-flight connection or worker.
COUNT_MAX_GROWTH = 2.0
# Backlogs and id sets are bounded by design (credits, staleness bound, a dedup window):
# growth beyond a batch or two, or a quarter of the early level, means one side falls behind.
BACKLOG_MAX_GROWTH_ABS = 10.0
BACKLOG_MAX_GROWTH_REL = 0.25
# Error counters should not move once the run is steady; any increase is worth a look.
ERROR_COUNTERS = ("dropped_stale", "duplicates", "dead_letters", "bad_requests", "pubsub_errors")
MIN_POINTS = 4  # fewer points in the second half: no slope worth a verdict

FAMILIES = ("rss_mb", "jvm", "threads", "fds", "cpu_pct", "procs", "backlog", "dedup", "counter")
TITLES = {
    "rss_mb": "RSS per role (MB)",
    "jvm": "emulator JVM after a forced full GC (MB)",
    "threads": "threads per role",
    "fds": "open files (fds) per role",
    "cpu_pct": "CPU % per role (100 = one core)",
    "procs": "processes per role",
    "backlog": "backlog",
    "dedup": "dedup set sizes",
    "counter": "counters (cumulative)",
}


def load_samples(path: str | Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if isinstance(row, dict) and "t" in row:
            rows.append(row)
    return rows


def _num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def series(samples: list[dict], key: str) -> list[tuple[float, float]]:
    return [(s["t"], float(s[key])) for s in samples if _num(s.get(key))]


def metric_keys(samples: list[dict]) -> list[str]:
    keys = {k for s in samples for k in s if "/" in k}
    order = {f: i for i, f in enumerate(FAMILIES)}
    return sorted(keys, key=lambda k: (order.get(k.split("/", 1)[0], len(order)), k))


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b t; returns (slope per second, intercept)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    b = sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0
    return b, my - b * mt


def floor_slope(points: list[tuple[float, float]]) -> float | None:
    """Per minute: the Theil-Sen slope (the median of pairwise slopes) of each minute's
    minimum. A process's RSS swings with its saves and evaluations (150 MB for the learner's
    checkpoint), and a least-squares line follows where in the half the swings fall; the
    floor under them moves only with what stays."""
    floors: dict[int, float] = {}
    for t, y in points:
        floors[int(t // 60)] = min(y, floors.get(int(t // 60), math.inf))
    pts = sorted(floors.items())
    slopes = [(y2 - y1) / (m2 - m1) for i, (m1, y1) in enumerate(pts) for m2, y2 in pts[i + 1 :]]
    return _median(slopes) if len(pts) >= MIN_POINTS else None


def stats(points: list[tuple[float, float]], t_end: float) -> dict:
    """Q1-of-run and Q4-of-run medians, and the fit over the second half of [0, t_end]."""
    q1 = _median([y for t, y in points if t < t_end / 4])
    q4 = _median([y for t, y in points if t >= 3 * t_end / 4])
    half = [(t, y) for t, y in points if t >= t_end / 2]
    out = {"q1_median": q1, "q4_median": q4, "n_half": len(half), "slope_per_min": None, "growth_half": None}
    if len(half) >= MIN_POINTS:
        b, a = _fit(half)
        t0, t1 = half[0][0], half[-1][0]
        out.update(slope_per_min=b * 60, growth_half=b * (t1 - t0), base=a + b * t0, minutes_half=(t1 - t0) / 60)
        out["floor_slope_per_min"] = floor_slope(half)
    return out


def verdict(key: str, st: dict) -> str:
    family, name = key.split("/", 1)
    if family == "cpu_pct":
        return "info"
    if st["growth_half"] is None:
        return "n/a (too few points)"
    g, base = st["growth_half"], st.get("base") or 0.0
    if family == "rss_mb" or family == "jvm":
        rel = g / base if base > 0 else math.inf if g > 0 else 0.0
        return "flat" if rel < RSS_MAX_REL_GROWTH and st["slope_per_min"] * 10 < RSS_MAX_MB_PER_10MIN else "grows"
    if family in ("threads", "fds", "procs"):
        return "flat" if g <= COUNT_MAX_GROWTH else "grows"
    if family in ("backlog", "dedup"):
        early = abs(st["q1_median"] or 0.0)
        return "flat" if g <= max(BACKLOG_MAX_GROWTH_ABS, BACKLOG_MAX_GROWTH_REL * early) else "grows"
    if family == "counter":
        if any(e in name for e in ERROR_COUNTERS):
            return "flat" if g <= 0.5 else "grows"  # a fitted half-count is noise, one error is not
        return "advances" if st["slope_per_min"] > 0 else "stalled"
    return "info"


THRESHOLDS = (
    f"- RSS: flat when the fitted growth over the second half is < {RSS_MAX_REL_GROWTH:.0%} of its level "
    f"and the slope is < {RSS_MAX_MB_PER_10MIN:.0f} MB per 10 min.\n"
    "- threads, open files, processes: flat when the fitted growth over the second half is "
    f"≤ +{COUNT_MAX_GROWTH:.0f}.\n"
    f"- backlog, dedup sets: flat when the fitted growth over the second half is ≤ "
    f"max({BACKLOG_MAX_GROWTH_ABS:.0f}, {BACKLOG_MAX_GROWTH_REL:.0%} of the first-quartile median).\n"
    "- error counters (dropped stale, duplicates, dead letters, bad requests, Pub/Sub errors): flat when "
    "they do not move in the second half; progress counters: `advances` when their slope is > 0, else `stalled`.\n"
    f"- a series with fewer than {MIN_POINTS} points in the second half gets no verdict; CPU is `info` only."
)


def summarize(samples: list[dict]) -> list[dict]:
    """One row per series: its stats and verdict."""
    if not samples:
        return []
    t_end = max(s["t"] for s in samples)
    rows = []
    for key in metric_keys(samples):
        st = stats(series(samples, key), t_end)
        rows.append({"key": key, **st, "verdict": verdict(key, st)})
    return rows


def _f(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| metric | series | Q1 median | Q4 median | slope/min (2nd half) | floor slope/min | growth (2nd half) "
        "| verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        family, name = r["key"].split("/", 1)
        d = 2 if family in ("threads", "fds", "procs") else 1
        lines.append(
            f"| {family} | {name} | {_f(r['q1_median'])} | {_f(r['q4_median'])} | "
            f"{_f(r['slope_per_min'], d)} | {_f(r.get('floor_slope_per_min') if family == 'rss_mb' else None, 2)} | "
            f"{_f(r['growth_half'], d)} | {r['verdict']} |"
        )
    return "\n".join(lines)


def write_report(out: str | Path, samples: list[dict], meta: dict) -> str:
    out = Path(out)
    rows = summarize(samples)
    grows = [r["key"] for r in rows if r["verdict"] in ("grows", "stalled")]
    t_end = max((s["t"] for s in samples), default=0.0)
    ending = meta.get("ending", {})
    survivors = ending.get("survivors")
    lines = [
        "# Soak report",
        "",
        f"- command: `{meta.get('command', '?')}`",
        f"- workdir: `{meta.get('workdir', '?')}`",
        f"- sampled: {len(samples)} samples over {t_end / 60:.1f} min (every {meta.get('every_s', '?')} s)",
        f"- ending: {ending.get('how', 'unknown (no ending recorded)')}",
        "- left running after the run: "
        + (
            "unknown"
            if survivors is None
            else "nothing (no process of the run, none naming the workdir)"
            if not survivors
            else f"**{len(survivors)} processes** (killed by the soak): {survivors}"
        ),
        f"- verdict: {'**' + ', '.join(grows) + '** grow or stall' if grows else 'everything with a verdict is flat'}",
        "",
        "Q1/Q4 median: the median over the first/last quarter of the run; slope and growth: a least-squares "
        "line over the second half; floor slope (RSS): the Theil-Sen slope of each minute's minimum over the "
        "second half, which the swings of saves and evaluations do not move. Roles sum their processes; `all` is "
        "the whole process tree.",
        "",
        table(rows),
        "",
        "## Thresholds",
        THRESHOLDS,
        "",
        "![soak](soak.png)",
        "",
    ]
    text = "\n".join(lines)
    (out / "soak_report.md").write_text(text)
    return text


def plot(out: str | Path, samples: list[dict]) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = metric_keys(samples)
    families = [f for f in FAMILIES if any(k.startswith(f + "/") for k in keys)]
    if not families:
        return None
    cols = 2
    nrows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(13, 3.2 * nrows), squeeze=False)
    for ax, family in zip(axes.flat, families):
        for k in (k for k in keys if k.startswith(family + "/")):
            pts = series(samples, k)
            ax.plot([t / 60 for t, _ in pts], [y for _, y in pts], label=k.split("/", 1)[1], lw=1.2)
        if family == "counter":
            ax.set_yscale("symlog")  # steps and episodes differ by orders of magnitude
        ax.set_title(TITLES[family], fontsize=10)
        ax.set_xlabel("minutes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(families) :]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(out) / "soak.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
