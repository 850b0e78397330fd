"""The run's timeline as a picture: a window of trace.json (Chrome trace events, as
core.telemetry.trace writes them) drawn as a Gantt chart, one row per (process, track).
The report embeds it; the busy and starved pictures of docs/OPERATING.md come from it:

    python -m localstack.reports.report WORKDIR --timeline_out PNG [--start_s S --window_s W]
"""

from __future__ import annotations

import json
import math
import re
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

DPI = 100
MAX_TIMELINE_ROWS = 24  # more rows than this and the labels stop being legible
SKIP_COMPILE_S = 10.0  # the default timeline window starts this long after the first train step
# A fixed colour per span name, so every report reads the same; other names get a stable tab10 one.
COLOURS = {"train step": "#2ca02c", "wait for data": "#f4a6a6", "poll": "#9e9e9e", "publish": "#1f77b4"}
COLOURS |= {"checkpoint": "#9467bd", "warm start or restore": "#17becf", "compile": "#e377c2"}
COLOURS |= {"episode": "#e8d3a9", "model turn": "#ff7f0e", "tool call": "#4682b4", "wait for policy": "#d6616b"}
COLOURS |= {"policy reload": "#8c564b", "pubsub publish": "#393b79", "load policy": "#c7c77a", "evaluate": "#808000"}


def _num(v) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def read_trace(path) -> list[dict]:
    """The events of a Chrome trace JSON (object or bare-array form); [] if absent or unreadable."""
    try:
        data = json.loads(Path(path).read_text(errors="replace"))
    except (OSError, ValueError):
        return []
    events = data.get("traceEvents") if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def timeline_window(events: list[dict], start_s: float | None = None, window_s: float = 20.0):
    """(start, end) in unix seconds, None without spans. start_s counts from the trace's first
    event (as Perfetto's ruler does); by default the window starts SKIP_COMPILE_S after the
    first "train step", leaving out start-up compiles, or at it when the run is shorter."""
    spans = [e for e in events if e.get("ph") in ("X", "i") and _num(e.get("ts")) is not None]
    if not spans:
        return None
    first, last = min(e["ts"] for e in spans) / 1e6, max(e["ts"] + (_num(e.get("dur")) or 0) for e in spans) / 1e6
    train = [e["ts"] / 1e6 for e in spans if e.get("name") == "train step" and e["ph"] == "X"]
    t0 = first + start_s if start_s is not None else min(train) if train else first
    if start_s is None and train and t0 + SKIP_COMPILE_S + window_s <= last:
        t0 += SKIP_COMPILE_S
    return t0, t0 + window_s


def _row_labels(events: list[dict]) -> dict[tuple, str]:
    """(pid, tid) -> "process: track"; the pid stays in the label only when two processes share a name."""
    meta = [e for e in events if e.get("ph") == "M" and isinstance(e.get("args"), dict)]
    full = {e.get("pid"): str(e["args"].get("name")) for e in meta if e.get("name") == "process_name"}
    short = {pid: re.sub(r" \(pid \d+\)$", "", n) for pid, n in full.items()}
    proc = {pid: full[pid] if list(short.values()).count(n) > 1 else n for pid, n in short.items()}
    # A track nobody named (no thread_name event) still gets a row: "process: track <tid>".
    keys = {(e.get("pid"), e.get("tid")): f"track {e.get('tid')}" for e in events if e.get("ph") in ("X", "i")}
    keys |= {(e.get("pid"), e.get("tid")): str(e["args"].get("name")) for e in meta if e.get("name") == "thread_name"}
    return {(pid, tid): f"{proc.get(pid, pid)}: {track}" for (pid, tid), track in keys.items()}


def _row_key(label: str) -> tuple:
    """Learner rows, then evaluator rows, then episode lanes by number, then the rest (packer, pubsub, policy)."""
    proc, _, track = label.partition(": ")
    lane = re.fullmatch(r"episode (\d+)", track)
    rank = 0 if proc.startswith("learner") else 1 if proc.startswith("evaluator") else 2 if lane else 3
    return rank, proc, int(lane.group(1)) if lane else 0, track


def _pick_rows(labels, max_rows: int = MAX_TIMELINE_ROWS) -> tuple[list[str], int]:
    """At most max_rows rows in display order: every learner/evaluator row, the other rows (up to
    a third of the room when lanes compete for it) and as many episode lanes as then fit.
    Also returns how many lanes were left out."""
    ranked = sorted(labels, key=_row_key)
    head = [lb for lb in ranked if _row_key(lb)[0] < 2][:max_rows]
    lanes, rest = ([lb for lb in ranked if _row_key(lb)[0] == r] for r in (2, 3))
    n_rest = min(len(rest), max(max_rows - len(head) - len(lanes), max_rows // 3), max_rows - len(head))
    n_lanes = max(0, min(len(lanes), max_rows - len(head) - n_rest))
    return head + lanes[:n_lanes] + rest[:n_rest], len(lanes) - n_lanes


def _with_depth(spans: list[tuple]) -> list[tuple]:
    """(ts, end, name) spans of one track -> (ts, end, name, depth), depth = how many spans enclose it."""
    out, open_ends = [], []
    for ts, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while open_ends and open_ends[-1] <= ts:
            open_ends.pop()
        out.append((ts, end, name, len(open_ends)))
        open_ends.append(end)
    return out


def _colour(name: str):
    return COLOURS.get(name) or plt.get_cmap("tab10")(zlib.crc32(name.encode()) % 10)


def _window_events(events: list[dict], t0: float, t1: float) -> tuple[dict, dict]:
    """Row label -> spans (with depth) overlapping [t0, t1] µs, and row label -> instants in it."""
    labels, spans, ticks = _row_labels(events), {}, {}
    for e in events:
        row, ts = labels.get((e.get("pid"), e.get("tid"))), _num(e.get("ts"))
        if row is not None and ts is not None and e.get("ph") == "X":
            spans.setdefault(row, []).append((ts, ts + (_num(e.get("dur")) or 0.0), str(e.get("name"))))
        elif row is not None and ts is not None and e.get("ph") == "i" and t0 <= ts <= t1:
            ticks.setdefault(row, []).append((ts - t0) / 1e6)
    spans = {row: [s for s in _with_depth(ss) if s[1] >= t0 and s[0] <= t1] for row, ss in spans.items()}
    return {k: v for k, v in spans.items() if v}, ticks


def render_timeline(trace_path, out_png, start_s: float | None = None, window_s: float = 20.0) -> Path | None:
    """A Gantt chart of a window of the trace: one row per (process, track), a bar per span
    coloured by name, nested spans thinner and on top, instants as ticks. None without spans."""
    events = read_trace(trace_path)
    window = timeline_window(events, start_s, window_s)
    if window is None:
        return None
    t0, t1 = window[0] * 1e6, window[1] * 1e6
    spans, ticks = _window_events(events, t0, t1)
    rows, lanes_left = _pick_rows(set(spans) | set(ticks))
    if not rows:  # nothing happened in the window
        return None
    fig, ax = plt.subplots(figsize=(14, max(3.0, 0.32 * len(rows) + 1.8)))
    min_w, drawn = window_s / 1400, {}  # ~1 px at 14 in x 100 dpi, so a 50 µs publish stays visible
    for y, row in enumerate(rows):
        groups = {}
        for ts, end, name, depth in spans.get(row, []):
            a, b = (max(ts, t0) - t0) / 1e6, (min(end, t1) - t0) / 1e6
            groups.setdefault((name, min(depth, 3)), []).append((a, max(b - a, min_w)))
        for (name, depth), ranges in groups.items():
            h, drawn[name] = 0.8 * 0.6**depth, _colour(name)
            ax.broken_barh(ranges, (y - h / 2, h), facecolors=drawn[name], linewidth=0, zorder=2 + depth)
        if ticks.get(row):
            ax.vlines(ticks[row], y - 0.4, y + 0.4, colors="black", lw=0.7, zorder=9)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set(xlim=(0, window_s), ylim=(len(rows) - 0.5, -0.5), xlabel="s from the window start")
    ax.grid(axis="x", alpha=0.3)
    train = [e["ts"] for e in events if e.get("ph") == "X" and e.get("name") == "train step"]
    where = f", {(t0 - min(train)) / 1e6:+.1f} s from the first train step" if train else ""
    more = f"; {lanes_left} more episode lanes not shown" if lanes_left else ""
    ax.set_title(f"Timeline: a {window_s:g} s window{where}{more}")
    handles = [Patch(color=drawn[n], label=n) for n in sorted(drawn, key=lambda n: (list(COLOURS) + [n]).index(n))]
    handles += [Line2D([], [], color="black", marker="|", ls="", label="instant")] if ticks else []
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=8, fontsize=8)
    fig.savefig(out_png, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return Path(out_png)
