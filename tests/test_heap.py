"""core/heap.py on glibc: freed memory goes back to the OS, and threads share few arenas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core import heap

ROOT = Path(__file__).resolve().parents[1]

# Eight threads each allocate: glibc gives a thread its own arena (up to 8 per core) unless
# limited. malloc_info's XML has one <heap nr=...> per arena.
COUNT_ARENAS = """
import ctypes, os, sys, tempfile, threading
from core import heap
if int(sys.argv[1]):
    assert heap.limit_arenas(int(sys.argv[1]))
together = threading.Barrier(8)
def work():
    kept = [ctypes.create_string_buffer(4096) for _ in range(200)]
    together.wait()  # all eight alive and allocating at once
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
out = tempfile.TemporaryFile()
stream = ctypes.c_void_p(libc.fdopen(os.dup(out.fileno()), b"w"))
libc.malloc_info(0, stream)
libc.fflush(stream)
out.seek(0)
print(out.read().decode().count("<heap nr="))
"""


def _arenas(limit: int) -> int:
    run = subprocess.run([sys.executable, "-c", COUNT_ARENAS, str(limit)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return int(run.stdout)


@pytest.mark.e2e  # a Python process of ours
@pytest.mark.skipif(heap._libc() is None, reason="not glibc")
def test_limit_arenas_keeps_threads_to_that_many_arenas():
    assert _arenas(0) > 4  # unlimited: the threads got arenas of their own
    assert _arenas(2) <= 2


# 200 MB freed below a buffer still in use: free() cannot give it back from the heap's top.
FREED_BELOW_THE_TOP = """
import sys
from core import heap
def rss_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
chunks = [bytearray(2000) for _ in range(100_000)]  # malloc'ed buffers, not mmaps
pin = bytearray(2000)  # allocated last: the top of the heap stays in use
del chunks
before = rss_mb()
if int(sys.argv[1]):
    assert heap.release()
print(before - rss_mb())
"""


def _given_back_mb(release: bool) -> float:
    run = subprocess.run(
        [sys.executable, "-c", FREED_BELOW_THE_TOP, str(int(release))], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return float(run.stdout)


@pytest.mark.e2e  # a Python process of ours
@pytest.mark.skipif(heap._libc() is None, reason="not glibc")
def test_release_gives_freed_heap_back_to_the_os():
    assert _given_back_mb(release=False) < 20  # glibc kept it: the resident size still counts it
    assert _given_back_mb(release=True) > 150
