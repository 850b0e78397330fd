"""Giving freed heap back to the OS after the big one-off allocations of a start-up.

Loading a checkpoint (NumPy copies of every tensor) and compiling a step (XLA and LLVM's
working memory) free hundreds of MB that glibc keeps in its arenas, where the resident
size still counts them: at SmolLM2-135M that was 0.3-0.4 GB after each, and the learner's
peak RSS at 1 x 256 tokens fell from 3.21 to 2.89 GB once they were given back
(docs/MODELS.md). `malloc_trim` does it; elsewhere than glibc this is a no-op.

`limit_arenas`: glibc gives each thread that allocates its own arena, up to 8 per core.
Save threads, XLA's and Beam's pools spread freed memory over them, and the learner's
resident size crept up over hours with its heap in use flat (docs/RELIABILITY.md, "Soak"):
the learner, the rollout job and the evaluator keep two.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def limit_arenas(count: int) -> bool:
    """At most `count` malloc arenas from now on (call before threads start); True if set."""
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "mallopt") and libc.mallopt(M_ARENA_MAX, count))


def release() -> bool:
    """Returns freed heap memory to the OS; True if anything could be asked."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
