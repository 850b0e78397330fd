"""Host processes of sandboxed runs (internals of `environments.sandbox`).

Hands out a throwaway unprivileged uid per run (RLIMIT_NPROC is per real uid, and root is
exempt from it), counts the tasks a uid already has, and kills a run's processes: the
launched one, its process group in the fallback, or everything a throwaway uid owns.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading

UID_BASE, UID_SPAN = 1_900_000_000, 1_000_000  # far above any real account

_uid_lock = threading.Lock()
_uid_next = random.SystemRandom().randrange(UID_SPAN)  # random start: fewer cross-process clashes
_uid_first = _uid_next


def alloc_uid() -> int:
    global _uid_next
    with _uid_lock:
        _uid_next += 1
        return UID_BASE + _uid_next % UID_SPAN


def uids_handed_out() -> set[int]:
    """The throwaway uids this process has handed out: its sandboxes' processes run as
    these (another process's sandboxes, e.g. a second rollout worker's, run as others)."""
    with _uid_lock:
        return {UID_BASE + k % UID_SPAN for k in range(_uid_first + 1, _uid_next + 1)}


def kill(proc, group: bool) -> None:
    proc.kill()  # a no-op once reaped, so it cannot hit a recycled pid
    if group:  # the fallback's strays; their membership keeps the pgid from being reused
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_uid(uid: int, python: str) -> None:
    """Kill every process of `uid`: kill(-1) sent AS that uid reaches exactly those."""
    subprocess.run(
        [python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"],
        user=uid,
        group=uid,
        extra_groups=[],
        env={},
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=10,
        check=False,
    )


def tasks_of_uid(uid: int) -> int:
    """Threads owned by `uid` now (RLIMIT_NPROC counts them all, per real uid)."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as fh:
                st = dict(line.split(":", 1) for line in fh if ":" in line)
            if int(st["Uid"].split()[0]) == uid:
                n += int(st["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return n
