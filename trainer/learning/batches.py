"""Records admitted for training, waiting to be batched: one queue per record shape."""

from __future__ import annotations

from trainer.contracts.record_shape import RecordShape
from trainer.learning.staleness import StalenessControl


class BatchBuffer:
    """A batch is `batch_records` records of one shape (one compiled step per bucket),
    oldest first, handed out once the staleness control lets it train. Records that went
    stale while buffered (the version moved on) are dropped, and counted, on the way."""

    def __init__(self, shapes: tuple[RecordShape, ...], batch_records: int, staleness: StalenessControl):
        self.batch_records, self.staleness = batch_records, staleness
        self.queues: dict[tuple[int, int], list] = {s.key: [] for s in shapes}

    def add(self, record, version: int) -> bool:
        """Queues `record` if it is fresh enough for `version`; False when dropped as stale."""
        if not self.staleness.admit(record, version):
            return False
        self.queues[record.shape].append(record)
        return True

    def take(self, version: int) -> list | None:
        n = self.batch_records
        for queue in self.queues.values():
            queue[:] = [r for r in queue if self.staleness.admit_again(r, version)]
            if len(queue) >= n and not self.staleness.should_wait(queue[:n], version):
                batch = queue[:n]
                del queue[:n]
                return batch
        return None

    def take_all(self, version: int) -> list[list]:
        """Every queued record still fresh enough, one list per shape (a synchronous round)."""
        out = []
        for queue in self.queues.values():
            fresh = [r for r in queue if self.staleness.admit_again(r, version)]
            queue.clear()
            if fresh:
                out.append(fresh)
        return out
