"""A learner of several JAX processes: process 0 owns the data plane, the others follow.

Process 0 runs the one consumer, feeder, credit ledger and dedup set, so the accounting is
a one-process learner's, unchanged. Each loop iteration it broadcasts what to do (stop,
nothing yet, or train this batch) and the batch's arrays; every process then runs the same
sharded step, whose gradients cross processes. Publishing is agreed the same way, since the
publish (a gather of the params) and the checkpoint (Orbax) are collectives.

Why broadcast rather than each process pulling its own share of the subscription
(`sharding.global_batch`, the path for hosts whose network binds): a share needs the
credits and dedup sets merged across processes, and a batch is small next to its step:
8 records of 1 x 1024 tokens are ~200 KB, against a step's 6 x params x 8,192 tokens of
compute. With one process nothing is broadcast and this is a pass-through.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from core.contracts.records import ARRAY_SPECS
from trainer.cloud.distributed import is_primary
from trainer.learning.step.learner import BATCH_FIELDS

STOP = "stop"  # the loop's end, decided by process 0 (max steps, a signal)
_STOP, _IDLE, _TRAIN = 0, 1, 2


class Lockstep:
    def __init__(self):
        self.multi = jax.process_count() > 1
        self.primary = is_primary()

    def _broadcast(self, tree):
        return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(tree, is_source=self.primary))

    def batch(self, stop: bool, next_batch: Callable[[], list | None]):
        """STOP, None (nothing to train yet) or the batch's records. `stop` and `next_batch`
        are process 0's; another process gets rows with the records' fields and shape."""
        records = None
        if self.primary:
            records = None if stop else next_batch()
        if not self.multi:
            return STOP if stop else records
        kind = _STOP if stop else _TRAIN if records else _IDLE
        n, (rows, seq) = (len(records), records[0].shape) if records else (0, (0, 0))
        kind, n, rows, seq = (int(x) for x in self._broadcast(np.array([kind, n, rows, seq], np.int32)))
        if kind != _TRAIN:
            return STOP if kind == _STOP else None
        shape = (n * rows, seq)
        if self.primary:
            arrays = {f: np.concatenate([getattr(r, f) for r in records]) for f in BATCH_FIELDS}
        else:
            arrays = {f: np.zeros(shape, ARRAY_SPECS[f]) for f in BATCH_FIELDS}
        arrays = self._broadcast(arrays)
        if self.primary:
            return records
        return [
            types.SimpleNamespace(shape=(rows, seq), **{f: a[i * rows : (i + 1) * rows] for f, a in arrays.items()})
            for i in range(n)
        ]

    def agree(self, flag: bool) -> bool:
        """Process 0's `flag`, on every process."""
        if not self.multi:
            return flag
        return bool(self._broadcast(np.array(flag, np.bool_)))


class FollowerPlane:
    """What the loop asks of the data plane, on a process that does not own it."""

    error = None
    feeder_position = 0

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    def published(self, version: int | None = None) -> None: ...

    def checkpoint_ids(self, version: int, step: int) -> dict[str, int]:
        return {}  # process 0's dedup set is the checkpoint's (Orbax writes its JSON)
