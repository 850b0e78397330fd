"""The Pub/Sub emulator's JVM heap, after a full collection (`jcmd`, JDK 17).

RSS alone cannot tell a JVM that keeps data from one that has not collected yet or has
grown its heap lazily (no -Xmx is set: the default maximum is a quarter of RAM). A
`GC.run` followed by `GC.heap_info` gives the live heap: if that climbs over a soak, the
emulator keeps something per message (acked messages, per-subscription state); if it is
flat while RSS climbs, the growth is the heap's committed size, bounded by -Xmx.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import psutil

_HEAP = re.compile(r"heap\s+total (\d+)K, used (\d+)K")
_META = re.compile(r"Metaspace\s+used (\d+)K, committed (\d+)K")


def java_pid(seen: dict[tuple[int, float], str]) -> int | None:
    """The emulator's JVM among the run's processes (role `emulator`, executable java)."""
    for (pid, _), role in seen.items():
        if role != "emulator":
            continue
        try:
            if psutil.Process(pid).name() == "java":
                return pid
        except psutil.NoSuchProcess:
            continue
    return None


def _jcmd(pid: int, command: str, timeout_s: float = 30.0) -> str:
    done = subprocess.run(["jcmd", str(pid), command], capture_output=True, text=True, timeout=timeout_s)
    return done.stdout


def heap_after_gc(pid: int) -> dict[str, float]:
    """Force a full GC, then read the heap: {} when jcmd is missing or the JVM is gone."""
    if shutil.which("jcmd") is None:
        return {}
    try:
        _jcmd(pid, "GC.run")
        text = _jcmd(pid, "GC.heap_info")
    except (subprocess.SubprocessError, OSError):
        return {}
    row = {}
    if m := _HEAP.search(text):
        row["jvm/heap_committed_mb"] = int(m.group(1)) / 1024
        row["jvm/heap_live_after_gc_mb"] = int(m.group(2)) / 1024
    if m := _META.search(text):
        row["jvm/metaspace_used_mb"] = int(m.group(1)) / 1024
    try:
        row["jvm/rss_after_gc_mb"] = psutil.Process(pid).memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        pass
    return {k: round(v, 2) for k, v in row.items()}
