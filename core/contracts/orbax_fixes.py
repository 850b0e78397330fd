"""A leak under every Orbax save and restore, worked around.

tensorstore 0.1.86's `experimental_collect_matching_metrics` never frees what it returns:
20,000 calls here left 300,000 objects (a list per metric) and 184 MB behind. Orbax 0.12.8
calls it twice for each save and each restore (`get_tensorstore_raw_bytes`), only to log a
"raw throughput" line. So every policy version a rollout worker or the evaluator loaded,
and every version and checkpoint the learner wrote, leaked a dozen lists: found by diffing
gc-tracked objects by type around repeated loads (`core/process_memory.py`).

`apply()` replaces that function with one that reads no metric and answers 0, which Orbax
takes as "nothing to report" (it skips the line). Saves and restores are unchanged.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def _no_raw_bytes(*_args, **_kwargs) -> int:
    return 0


def apply() -> bool:
    """Idempotent; False (and a debug line) where this Orbax has no such function."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    if not hasattr(tensorstore_utils, "get_tensorstore_raw_bytes"):
        log.debug("orbax has no get_tensorstore_raw_bytes: nothing to work around")
        return False
    tensorstore_utils.get_tensorstore_raw_bytes = _no_raw_bytes
    return True
