"""The learner's data plane: everything between Pub/Sub and the train step, in one object.

It owns the record consumer (and its delivery ledger), the feeder and its trajectory
credits, the batch buffer, the staleness control and the schedule (asynchronous, or
synchronous rounds). The loop in trainer/task.py asks it for the next batch, tells it a
batch was trained (`settle`), when to publish, and which record ids the checkpoint must
hold; the credits a record returns, the requests written off and asked again, and a sync
round's batches not yet trained are its own business. At the end it says where every
trajectory went (`summary`, trainer/learning/data/accounting.py).
"""

from __future__ import annotations

import logging
import time

from core.contracts.record_shape import RecordLayout
from core.contracts.run_summary import Accounting, RunSummary
from trainer.learning.data.accounting import trajectory_accounting
from trainer.learning.data.batches import BatchBuffer
from trainer.learning.data.consumer import RecordConsumer
from trainer.learning.data.feeder import Feeder, TrajectoryCredits
from trainer.learning.data.lag_control import LagController
from trainer.learning.data.schedule import AsyncSchedule, SyncSchedule
from trainer.learning.data.staleness import StalenessControl
from trainer.learning.data.starvation import StarvationWatch
from trainer.learning.run_stats import RunStats

log = logging.getLogger("learner")
POLL_MAX_MESSAGES, POLL_TIMEOUT_S = 100, 1.0


class DataPlane:
    def __init__(
        self,
        layout: RecordLayout,
        group_size: int,
        staleness: StalenessControl,
        credits: TrajectoryCredits,
        consumer: RecordConsumer,
        batches: BatchBuffer,
        schedule: AsyncSchedule | SyncSchedule,
        feeder: Feeder | None,  # None off the primary process
        stats: RunStats,
        telemetry=None,  # LearnerTelemetry: poll spans
        watch: StarvationWatch | None = None,  # says why no record comes, stops a run that cannot train
        lag: LagController | None = None,  # resizes the credit window to hold the lag at a target
    ):
        self.layout, self.group_size = layout, group_size
        self.staleness, self.credits, self.consumer = staleness, credits, consumer
        self.batches, self.schedule, self.feeder = batches, schedule, feeder
        self.stats, self.telemetry, self.watch, self.lag = stats, telemetry, watch, lag

    # ------------------------------------------------------------------ the loop's calls
    def start(self) -> None:
        if self.feeder:
            self.feeder.start()

    @property
    def error(self) -> BaseException | None:
        """Why the feeder thread died, or why no step can ever happen, if so."""
        if self.watch is not None and self.watch.stopped:
            return RuntimeError(self.watch.stopped)
        return self.feeder.error if self.feeder else None

    def next_batch(self, version: int) -> list | None:
        """The next batch to train at `version`; else one poll (up to a second) for records,
        then the next batch if that made one ready. None: nothing to train yet."""
        batch = self.schedule.next_batch(version)
        if batch is not None:
            return batch
        self._poll(version)
        return self.schedule.next_batch(version)

    def settle(self, batch: list, metrics: dict, step_s: float, flops: float, version: int | None = None) -> None:
        """`batch` was trained at `version` (in `step_s` seconds, `flops` FLOPs): its records'
        fate is decided, and a checkpoint from now on covers them."""
        self.consumer.settle(batch)
        if self.lag is not None and version is not None:
            self.lag.observe(self.staleness.staleness(r, version) for r in batch if r.trajectories)
        self.stats.on_step(batch, metrics, step_s, flops)
        if self.watch is not None:
            self.watch.progressed()

    def publish_due(self, steps: int) -> bool:
        return self.schedule.publish_due(steps)

    @property
    def feeder_position(self) -> int:
        """Where the prompt stream stands: what a resumed learner skips."""
        return self.feeder.published if self.feeder else 0

    def checkpoint_ids(self, version: int, step: int) -> dict[str, int]:
        """Checkpoint `step`'s save is about to begin: the dedup ids it must hold."""
        return self.consumer.checkpoint_ids(version, step)

    def published(self, version: int | None = None) -> None:
        """`version` was published and checkpointed: a sync run may open its next round; the
        lag controller judges the version's lag and may resize the window."""
        self.schedule.next_round()
        if self.lag is not None and version is not None and (window := self.lag.on_version(version)) is not None:
            self.credits.resize(window)

    def stop(self) -> None:
        """Stops requesting (first in the teardown)."""
        if self.feeder:
            self.feeder.stop()

    def close(self) -> None:
        """Acks what the last checkpoint covers and nacks the rest (after the checkpointer closed)."""
        self.consumer.close()

    # ------------------------------------------------------------------ inside
    def _poll(self, version: int) -> None:
        polled_at = time.perf_counter_ns()
        received = self.consumer.poll(max_messages=POLL_MAX_MESSAGES, timeout_s=POLL_TIMEOUT_S)
        if self.telemetry is not None:
            self.telemetry.polled(polled_at, len(received))
        for rec in received:
            self.credits.returned(t.trajectory_id for t in rec.trajectories)  # back: so are their credits
            self.stats.on_record(rec)
            self.batches.add(rec, version)
        self.credits.returned(self.consumer.take_dropped())  # drop notices return credits too
        if self.feeder:
            self.feeder.redo_timed_out()  # a request lost with a rollout worker is asked again
        if self.watch is not None:
            line = self.watch.check(len(received), self.accounting())
            if line:
                log.warning("%s", line)
            if self.telemetry is not None:
                self.telemetry.waiting(self.watch.stopped or self.watch.waiting)

    # ------------------------------------------------------------------ the end
    def accounting(self) -> Accounting:
        """The run's trajectory balances, from the parts' counters."""
        queued = [r for q in self.batches.queues.values() for r in q] + self.schedule.pending_records()
        feeder, credits = self.feeder, self.credits
        requested = (feeder.published - feeder.start_position + feeder.redone) * self.group_size if feeder else 0
        return trajectory_accounting(
            requested=requested,
            received=self.stats.trajectories_received,
            trained=self.stats.trained_trajectories,
            dropped_stale=self.staleness.dropped_trajectories,
            buffered=sum(len(r.trajectories) for r in queued),
            dropped_by_pipeline=self.consumer.dropped_trajectories,
            written_off=credits.written_off,
            late=credits.late,
            foreign=credits.foreign,
            in_flight=credits.outstanding,
        )

    def summary(self, learner, start, publisher, exit_code: int = 0) -> RunSummary:
        return self.stats.summary(
            learner,
            start,
            publisher,
            self.consumer,
            self.feeder,
            self.staleness,
            self.layout,
            schedule=self.schedule.name,
            sync=self.schedule.summary(),
            accounting=self.accounting(),
            lag_control=self.lag.summary() if self.lag is not None else None,
            exit_code=exit_code,
        )
