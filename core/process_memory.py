"""Where a long-running process's memory goes: the numbers that tell a leak's kind apart.

`sample()` returns `mem/...` gauges for a telemetry row: resident size, glibc's heap (in
use against free but kept: fragmentation looks like growth in RSS alone), Python's memory
blocks (objects), JAX's live arrays and, with tracemalloc on, Python's traced allocations.
The gauges never walk `gc.get_objects()`: on CPython before 3.13 that list takes a reference
to a tuple another thread is still building from a generator, and that thread's
`tuple(...)` then raises SystemError (python/cpython#39117). On 2026-12-06 it failed a
learner's Orbax checkpoint write, and the learner with it. The growth report below does
walk it, so it runs only when asked for (diagnosis, never production). With
`AGENTIC_RL_TRACEMALLOC=FRAMES` in the environment, `write_growth(path)` writes the
allocation sites that grew most since the first sample, and the gc-tracked object types whose
counts grew most (a growth in objects with flat bytes names its type here, not in the
sites; `AGENTIC_RL_GC_TYPES=1` alone writes the types only, at no tracing cost);
benchmarks/soak.py turns it on.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import reprlib
import sys
import threading
import tracemalloc
from collections import Counter
from pathlib import Path

from core import heap

MB = 1 << 20
_FIRST: list[tracemalloc.Snapshot] = []
_FIRST_TYPES: list[Counter] = []
_FIRST_IDS: set[int] = set()  # the lists and dicts alive at the first sample


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _mallinfo() -> _MallInfo2 | None:
    libc = heap._libc()
    fn = getattr(libc, "mallinfo2", None) if libc is not None else None
    if fn is None:
        return None
    fn.restype = _MallInfo2
    return fn()


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def start_tracing() -> bool:
    """Starts tracemalloc when AGENTIC_RL_TRACEMALLOC asks (its value: frames per site)."""
    frames = int(os.environ.get("AGENTIC_RL_TRACEMALLOC", "0") or 0)
    if frames > 0 and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    return tracemalloc.is_tracing()


def sample(extra: dict | None = None) -> dict:
    """This process's memory now, as `mem/...` gauges (MB, counts)."""
    row = {"mem/rss_mb": round(_rss_mb(), 1), "mem/threads": threading.active_count()}
    if (info := _mallinfo()) is not None:
        row["mem/heap_in_use_mb"] = round((info.uordblks + info.hblkhd) / MB, 1)
        row["mem/heap_free_kept_mb"] = round(info.fordblks / MB, 1)
    row["mem/py_blocks"] = sys.getallocatedblocks()  # objects and their buffers, no object exposed
    if "jax" in sys.modules:  # never imports JAX itself
        arrays = sys.modules["jax"].live_arrays()
        row["mem/jax_live_arrays"] = len(arrays)
        row["mem/jax_live_mb"] = round(sum(a.nbytes for a in arrays) / MB, 1)
    if tracemalloc.is_tracing():
        row["mem/traced_mb"] = round(tracemalloc.get_traced_memory()[0] / MB, 1)
    row.update(extra or {})
    return row


class Periodic:
    """A long-lived process's `mem/*` gauges at most every `every_s` (counting Python's
    objects takes ms, so not every row), with the growth report written beside them."""

    def __init__(self, every_s: float = 30.0):
        self.every_s, self._at = every_s, -float("inf")

    def row(self, now: float, report_dir: Path | None) -> dict:
        """The gauges if `every_s` has passed since the last ones, else {}; `report_dir`: where
        write_growth puts tracemalloc.txt (None: nowhere)."""
        if now - self._at < self.every_s:
            return {}
        self._at = now
        row = sample()
        if report_dir is not None:
            write_growth(Path(report_dir) / "tracemalloc.txt")
        return row


def _type_counts() -> Counter:
    gc.collect()  # live objects only: uncollected cycles would read as growth until the next full pass
    named: Counter = Counter()
    for t, n in Counter(map(type, gc.get_objects())).items():  # a name per type, not per object
        named[f"{t.__module__}.{t.__qualname__}"] += n
    return named


def _new_containers(n: int) -> list[str]:
    """The lists and dicts made since the first sample, grouped by shape (a dict's keys, a
    list's element types), most common first, each with the types that hold one of them."""
    new = [o for o in gc.get_objects() if type(o) in (list, dict) and id(o) not in _FIRST_IDS]
    shapes: dict[str, list] = {}
    for o in new:
        shapes.setdefault(_shape(o), []).append(o)
    short = reprlib.Repr()
    short.maxother, short.maxstring = 80, 60
    top = sorted(shapes.items(), key=lambda kv: -len(kv[1]))[:n]
    ones = [group[len(group) // 2] for _, group in top]
    # One walk of every object for all of them (get_referrers walks the whole heap per call).
    own = {id(new), id(shapes), id(ones), *(id(group) for _, group in top)}
    holders: dict[int, list[str]] = {id(one): [] for one in ones}
    for r in gc.get_referrers(*ones):
        if id(r) in own:
            continue
        for x in gc.get_referents(r):
            if id(x) in holders:
                holders[id(x)].append(type(r).__qualname__)
    return [
        f"{len(group)} x {shape}: {short.repr(one)}  <- {holders[id(one)][:4]}"
        for (shape, group), one in zip(top, ones)
    ]


def _shape(o) -> str:
    if type(o) is dict:
        return "dict " + ",".join(sorted(str(k)[:20] for k in itertools.islice(o, 8)))
    return f"list[{len(o) if len(o) < 4 else '4+'}] of " + ",".join(sorted({type(x).__name__ for x in o[:8]}))


def write_growth(path: str | Path, top: int = 15) -> None:
    """The `top` allocation sites (with tracemalloc on) and gc-tracked object types (also with
    AGENTIC_RL_GC_TYPES=1, which costs no tracing) grown most since the first call."""
    tracing = tracemalloc.is_tracing()
    if not (tracing or os.environ.get("AGENTIC_RL_GC_TYPES") == "1"):
        return
    snap = tracemalloc.take_snapshot() if tracing else None
    if not _FIRST_TYPES:
        _FIRST[:] = [snap] if snap is not None else []
        _FIRST_TYPES[:] = [_type_counts()]
        _FIRST_IDS.clear()
        _FIRST_IDS.update(id(o) for o in gc.get_objects() if type(o) in (list, dict))
        return
    lines = []
    if snap is not None and _FIRST:
        # Not this report's own bookkeeping. Dropped after grouping, not by filter_traces: that
        # matches every trace's frames in Python, 5 s of 8 in a process with torch loaded.
        own = {tracemalloc.__file__, __file__}
        diffs = [s for s in snap.compare_to(_FIRST[0], "traceback") if not own & {f.filename for f in s.traceback}]
        lines = [
            f"{s.size_diff / MB:+.2f} MB in {s.count_diff:+d} blocks\n  " + "\n  ".join(s.traceback.format())
            for s in diffs[:top]
        ]
    grown = _type_counts()
    grown.subtract(_FIRST_TYPES[0])
    lines.append("\ngc-tracked objects by type, grown most since the first sample:")
    lines += [f"{n:+d} {name}" for name, n in grown.most_common(top) if n > 0]
    lines += ["", "lists and dicts made since then, by shape, with what holds one of each:", *_new_containers(8)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")
