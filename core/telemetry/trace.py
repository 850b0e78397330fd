"""Spans on a wall-clock timeline, one file per process, merged into one trace per run.

Each process appends Chrome trace events (`ph: "X"` complete events, `"C"` counters,
`"M"` track names) to `<trace_dir>/<source>-<pid>.trace.jsonl`, one JSON array per line,
flushed every couple of seconds from a background thread, so a crash loses at most that much. `merge()` joins
every file of a run into one `{"traceEvents": [...]}` JSON that ui.perfetto.dev and
chrome://tracing open: one process per file, one track per named lane.

A span costs two clock reads, a dict and a list append (about 4 µs on this machine,
docs/BENCHMARKS.md "Tracing"); a disabled tracer (`NULL`) returns one shared no-op span,
so instrumented code never checks.
Timestamps are wall-clock microseconds (perf_counter, anchored once to time.time), so
the processes of one machine line up.
"""

from __future__ import annotations

import atexit
import heapq
import json
import os
import threading
import time
from pathlib import Path

SUFFIX = ".trace.jsonl"


class _Span:
    __slots__ = ("args", "name", "start", "tid", "tracer")

    def __init__(self, tracer: Tracer, name: str, tid: int, args: dict):
        self.tracer, self.name, self.tid, self.args = tracer, name, tid, args

    def __enter__(self) -> _Span:
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc) -> None:
        self.tracer._complete(self.name, self.tid, self.start, time.perf_counter_ns(), self.args)


class _NullSpan:
    @property
    def args(self) -> dict:
        return {}  # a fresh dict: callers may add to it

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc) -> None:
        pass


_NULL_SPAN = _NullSpan()


class Tracer:
    """Records spans for one process. Thread-safe; `span()` is a context manager, and
    `complete()` records a span whose ends were measured elsewhere (perf_counter_ns)."""

    enabled = True

    def __init__(self, trace_dir: str | os.PathLike, source: str, flush_every_s: float = 2.0):
        self.source, self.pid = source, os.getpid()
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(trace_dir) / f"{source}-{self.pid}{SUFFIX}"
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()  # the flusher thread, close() and a signal handler
        self._file = None
        self._events: list[dict] = []
        self._tracks: dict[str, int] = {}
        self.spans = 0
        self._meta("process_name", 0, {"name": f"{source} (pid {self.pid})"})
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_loop, args=(flush_every_s,), name="trace-flush", daemon=True
        )
        self._flusher.start()
        atexit.register(self.close)

    # -- recording -----------------------------------------------------------------------
    def track(self, name: str) -> int:
        """The lane id of a named track (created, and named in the trace, on first use)."""
        tid = self._tracks.get(name)
        if tid is None:
            with self._lock:
                tid = self._tracks.setdefault(name, len(self._tracks) + 1)
            self._meta("thread_name", tid, {"name": name})
            self._meta("thread_sort_index", tid, {"sort_index": tid})
        return tid

    def span(self, name: str, track: str = "main", **args) -> _Span:
        return _Span(self, name, self.track(track), args)

    def complete(self, name: str, track: str, start_ns: int, end_ns: int, **args) -> None:
        self._complete(name, self.track(track), start_ns, end_ns, args)

    def counter(self, name: str, **values: float) -> None:
        self._append({"name": name, "ph": "C", "ts": self._us(time.perf_counter_ns()), "pid": self.pid, "args": values})

    def instant(self, name: str, track: str = "main", **args) -> None:
        ev = {"name": name, "ph": "i", "s": "t", "ts": self._us(time.perf_counter_ns()), "pid": self.pid}
        self._append({**ev, "tid": self.track(track), "args": args})

    def _complete(self, name, tid, start_ns, end_ns, args) -> None:
        ev = {"name": name, "ph": "X", "ts": self._us(start_ns), "dur": (end_ns - start_ns) / 1e3}
        ev["pid"], ev["tid"] = self.pid, tid
        if args:
            ev["args"] = args
        self.spans += 1
        self._append(ev)

    def _meta(self, kind: str, tid: int, args: dict) -> None:
        self._append({"name": kind, "ph": "M", "pid": self.pid, "tid": tid, "args": args})

    def _us(self, perf_ns: int) -> float:
        return (perf_ns + self._offset_ns) / 1e3

    def _append(self, ev: dict) -> None:
        with self._lock:
            self._events.append(ev)

    # -- writing -------------------------------------------------------------------------
    def flush(self) -> None:
        with self._lock:
            pending, self._events = self._events, []
        if pending:  # one line per flush, a JSON array: one encoder call for the lot
            with self._file_lock:
                if self._file is None:
                    self._file = self.path.open("a")  # kept open: opening it was most of a flush
                self._file.write(json.dumps(pending, separators=(",", ":")) + "\n")
                self._file.flush()

    def _flush_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self.flush()
        with self._file_lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class NullTracer:
    """Tracing off: every call is a no-op."""

    enabled = False
    spans = 0

    def track(self, name: str) -> int:
        return 0

    def span(self, name: str, track: str = "main", **args) -> _NullSpan:
        return _NULL_SPAN

    def complete(self, *a, **k) -> None:
        pass

    def counter(self, *a, **k) -> None:
        pass

    def instant(self, *a, **k) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


NULL = NullTracer()
_current: Tracer | NullTracer = NULL


def install(tracer: Tracer | NullTracer) -> Tracer | NullTracer:
    """This process's tracer, for code that cannot be handed one (Beam DoFns, which are
    pickled before they run)."""
    global _current
    _current = tracer
    return tracer


def current() -> Tracer | NullTracer:
    return _current


def make_tracer(trace_dir: str | None, source: str) -> Tracer | NullTracer:
    return Tracer(trace_dir, source) if trace_dir else NULL


class Lanes:
    """Track names for concurrent work (episodes): the lowest free lane is reused, so a
    timeline shows as many lanes as were ever busy at once, not one per episode."""

    def __init__(self, prefix: str):
        self.prefix, self._free, self._next = prefix, [], 0

    def take(self) -> str:
        if self._free:
            return f"{self.prefix} {heapq.heappop(self._free)}"
        self._next += 1
        return f"{self.prefix} {self._next - 1}"

    def give_back(self, lane: str) -> None:
        heapq.heappush(self._free, int(lane.rsplit(" ", 1)[1]))


def read_events(path: str | os.PathLike) -> list[dict]:
    """The events of one process's file (a JSON array per line); a line cut short by a
    crash is skipped."""
    events = []
    for line in Path(path).read_text().splitlines():
        try:
            batch = json.loads(line)
        except json.JSONDecodeError:
            continue
        events.extend(e for e in (batch if isinstance(batch, list) else [batch]) if isinstance(e, dict) and "ph" in e)
    return events


def merge(trace_dir: str | os.PathLike, out: str | os.PathLike) -> dict:
    """Every process's file in `trace_dir` -> one trace JSON at `out`; returns counts."""
    events, sources = [], {}
    for path in sorted(Path(trace_dir).glob(f"*{SUFFIX}")):
        evs = read_events(path)
        events.extend(evs)
        sources[path.name[: -len(SUFFIX)]] = sum(e["ph"] == "X" for e in evs)
    # Metadata first, then by time: viewers do not need it, but diffs and tests read better.
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0)))
    Path(out).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return {"events": len(events), "spans_by_process": sources}
