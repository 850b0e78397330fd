"""Records admitted for training, waiting to be batched: one queue per record shape."""

from __future__ import annotations

from collections.abc import Callable

from core.contracts.record_shape import RecordShape
from trainer.learning.data.staleness import StalenessControl


class BatchBuffer:
    """A batch is `batch_records` records of one shape (one compiled step per bucket),
    oldest first, handed out once the staleness control lets it train. Records that went
    stale while buffered (the version moved on) are dropped, and counted, on the way;
    `on_dropped` hears of every record dropped as stale (the consumer settles them)."""

    def __init__(
        self,
        shapes: tuple[RecordShape, ...],
        batch_records: int,
        staleness: StalenessControl,
        on_dropped: Callable[[list], None] = lambda records: None,
    ):
        self.batch_records, self.staleness, self.on_dropped = batch_records, staleness, on_dropped
        self.queues: dict[tuple[int, int], list] = {s.key: [] for s in shapes}

    def add(self, record, version: int) -> bool:
        """Queues `record` if it is fresh enough for `version`; False when dropped as stale."""
        if not self.staleness.admit(record, version):
            self.on_dropped([record])
            return False
        self.queues[record.shape].append(record)
        return True

    def take(self, version: int) -> list | None:
        n = self.batch_records
        for queue in self.queues.values():
            queue[:] = self._fresh(queue, version)
            if len(queue) >= n and not self.staleness.should_wait(queue[:n], version):
                batch = queue[:n]
                del queue[:n]
                return batch
        return None

    def take_all(self, version: int) -> list[list]:
        """Every queued record still fresh enough, one list per shape (a synchronous round)."""
        out = []
        for queue in self.queues.values():
            fresh = self._fresh(queue, version)
            queue.clear()
            if fresh:
                out.append(fresh)
        return out

    def _fresh(self, queue: list, version: int) -> list:
        fresh, stale = [], []
        for r in queue:
            (fresh if self.staleness.admit_again(r, version) else stale).append(r)
        if stale:
            self.on_dropped(stale)
        return fresh
