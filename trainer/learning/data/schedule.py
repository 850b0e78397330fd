"""When the learner trains and publishes: asynchronously, or in synchronous rounds.

One code path, two settings (docs/ARCHITECTURE.md). `AsyncSchedule` trains whenever a batch is
ready and publishes every `publish_every` steps while the feeder keeps its credit window
full. `SyncSchedule` is the honest synchronous baseline: the feeder requests exactly one
round of trajectories at version v and then stops; once every one of them is back
(packed into records, or dropped by the pipeline with a notice) the learner trains on
all of it, publishes v+1 and only then opens the next round. It never makes a rollout
that it throws away: nothing it trains on is stale, and nothing is requested early.
"""

from __future__ import annotations

import logging
import math
import time

from core.contracts.records import PackedRecord, empty_record_arrays
from core.contracts.run_summary import SyncRounds
from trainer.learning.data.batches import BatchBuffer
from trainer.learning.data.feeder import TrajectoryCredits

log = logging.getLogger(__name__)
PADDING_ID = "padding"


def padding_record(shape: tuple[int, int]) -> PackedRecord:
    """An all-padding record (no loss token): fills a short synchronous batch."""
    return PackedRecord(record_id=PADDING_ID, **empty_record_arrays(*shape), trajectories=[])


def split_round(records: list[PackedRecord], batch_records: int, steps: int) -> list[list[PackedRecord]]:
    """A round's records (one shape) over max(steps, ceil(n / batch_records)) batches of
    batch_records each, spread evenly and padded: every record is trained exactly once."""
    if not records:
        return []
    n_batches = max(steps, math.ceil(len(records) / batch_records))
    batches = [records[i::n_batches] for i in range(n_batches)]
    shape = records[0].shape
    return [b + [padding_record(shape) for _ in range(batch_records - len(b))] for b in batches if b]


class AsyncSchedule:
    name = "async"

    def __init__(self, batches: BatchBuffer, publish_every: int):
        self.batches, self.publish_every = batches, publish_every

    def next_batch(self, version: int) -> list | None:
        return self.batches.take(version)

    def publish_due(self, steps: int) -> bool:
        return steps % self.publish_every == 0

    def next_round(self) -> None:
        pass

    def pending_records(self) -> list:
        """Records taken from the buffer and not yet trained: none (a batch is trained once taken)."""
        return []

    def summary(self) -> SyncRounds | None:
        return None


class SyncSchedule:
    """Rounds sized to fill `steps_per_round` batches, the learner steps per version of
    the asynchronous run (more only when a round's records do not fit, counted in
    `extra_steps`; fewer records are padded). A round requests whole groups: as many as
    fill the steps at the trajectories per record seen so far (the plan's estimate, or
    the densest packing, before any record arrived)."""

    name = "sync"

    def __init__(
        self,
        batches: BatchBuffer,
        credits: TrajectoryCredits,
        steps_per_round: int,
        round_timeout_s: float,
        group_size: int = 1,
        per_record: float | None = None,
        clock=time.monotonic,
    ):
        if not credits.rounds:
            raise ValueError("SyncSchedule needs round credits (TrajectoryCredits(..., rounds=True))")
        self.batches, self.credits, self.steps = batches, credits, steps_per_round
        self.group_size, self.per_record = group_size, per_record
        self.round_timeout_s, self.clock = round_timeout_s, clock
        self.seen_records = self.seen_trajectories = 0
        self.round_sizes: list[int] = []
        self.pending: list[list] = []
        self.rounds = self.extra_steps = self.padding_records = self.timed_out_rounds = 0
        self.lost_trajectories = 0  # never came back within the round's timeout
        self._open_round()  # sizes the first round and starts its clock

    def round_size(self) -> int:
        """Trajectories of the next round: whole groups that fill steps_per_round batches."""
        per_record = self.per_record
        if self.seen_records:
            per_record = self.seen_trajectories / self.seen_records
        if per_record is None:
            return self.credits.window
        # One record short of the steps, rounded down: the packer's max-wait flushes make
        # some records part-full, and a round that overflows its steps would train an extra
        # step on this version (a short one is padded: learner time, not rollouts, counted).
        room = self.steps * self.batches.batch_records - (1 if self.seen_records else 0)
        groups = max(1, math.floor(room * per_record / self.group_size))
        return min(self.credits.window, groups * self.group_size)

    def _round_over(self) -> bool:
        if self.credits.round_complete():
            return True
        if self.clock() - self.round_started > self.round_timeout_s and self.credits.round_requested():
            lost = self.credits.outstanding
            log.warning("sync round timed out with %d trajectories outstanding: training on what came", lost)
            self.timed_out_rounds += 1
            self.lost_trajectories += lost
            self.credits.forget_outstanding()
            return True
        return False

    def next_batch(self, version: int) -> list | None:
        if not self.pending and self._round_over():
            for queue in self.batches.take_all(version):
                self.seen_records += len(queue)
                self.seen_trajectories += sum(len(r.trajectories) for r in queue)
                self.pending += split_round(queue, self.batches.batch_records, self.steps)
            if not self.pending:  # the whole round was filtered out: ask again at this version
                self._open_round()
                return None
            self.extra_steps += max(0, len(self.pending) - self.steps)
            self.padding_records += sum(r.record_id == PADDING_ID for b in self.pending for r in b)
        return self.pending.pop(0) if self.pending else None

    def publish_due(self, steps: int) -> bool:
        return not self.pending  # the round's last step

    def next_round(self) -> None:
        """After the round's version is published: the feeder may request the next one."""
        self.rounds += 1
        self._open_round()

    def _open_round(self) -> None:
        self.round_started = self.clock()
        size = self.round_size()
        self.round_sizes.append(size)
        self.credits.open_round(size)

    def pending_records(self) -> list:
        """The round's records taken from the buffer and not yet trained."""
        return [r for batch in self.pending for r in batch]

    def summary(self) -> SyncRounds:
        return SyncRounds(
            rounds=self.rounds,
            extra_steps=self.extra_steps,
            padding_records=self.padding_records,
            timed_out_rounds=self.timed_out_rounds,
            lost_trajectories=self.lost_trajectories,
            round_sizes=sorted(set(self.round_sizes)),
        )
