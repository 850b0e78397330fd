"""The prompt feeder: publishes rollout requests, bounded by trajectory credits.

Credits are counted in trajectories: the feeder may have at most `window` trajectories
requested but not yet received by the learner. Every received record returns the
credits of the trajectories it holds. Because a record holds at most
rows * max_segments_per_row trajectories and the packer always flushes within its
maximum wait, a window of (ahead + 1) * batch_records * rows * max_segments_per_row
+ group_size can never deadlock: what is outstanding always fills another batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
import uuid

from trainer.contracts import pubsub_io
from trainer.contracts.record_shape import RecordShape
from trainer.contracts.rollout_request import RolloutRequest

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CreditConfig:
    max_batches_ahead: int
    batch_records: int
    shape: RecordShape
    group_size: int
    # Synchronous rounds: the window is the largest round, the trajectories that fill
    # `steps_per_round` batches of full records (whole groups); SyncSchedule sizes each
    # round within it from the packing it sees. max_batches_ahead unused.
    sync: bool = False
    steps_per_round: int = 1
    # The user's knob for the asynchronous window: trajectories in flight (Little's law:
    # the learner's consumption rate x episode latency). None: from max_batches_ahead.
    max_in_flight: int | None = None

    def __post_init__(self):
        if self.max_batches_ahead < 0 or self.batch_records < 1 or self.group_size < 1 or self.steps_per_round < 1:
            raise ValueError(
                f"need max_batches_ahead >= 0, batch_records >= 1, group_size >= 1, steps_per_round >= 1: {self}"
            )
        if self.max_in_flight is not None and not self.sync:
            if type(self.max_in_flight) is not int or self.max_in_flight < self.min_window:
                raise ValueError(
                    f"max_in_flight={self.max_in_flight!r} could deadlock: the learner's next batch may need "
                    f"{self.min_window} trajectories in flight (batch_records x rows x segments + group_size)"
                )

    @property
    def per_batch(self) -> int:
        return self.batch_records * self.shape.max_trajectories

    @property
    def min_window(self) -> int:
        """The smallest window that always fills the next batch (tests/test_credits.py)."""
        return self.per_batch + self.group_size

    @property
    def window(self) -> int:
        if self.sync:
            return math.ceil(self.steps_per_round * self.per_batch / self.group_size) * self.group_size
        if self.max_in_flight is not None:
            return self.max_in_flight
        return (self.max_batches_ahead + 1) * self.per_batch + self.group_size

    @property
    def batches_ahead(self) -> float:
        """The window as full batches beyond the one being filled (a derived view)."""
        return (self.window - self.group_size) / self.per_batch - 1


class TrajectoryCredits:
    """At most `window` trajectories requested and not yet back. With rounds=True, the
    window is also all that one round may request: after that, acquire blocks until
    open_round() (the synchronous baseline requests nothing before the next version)."""

    def __init__(self, window: int, rounds: bool = False):
        self.window, self.rounds = window, rounds
        self.outstanding = 0
        self._round_left = window
        self._cond = threading.Condition()

    def acquire(self, n: int, stop: threading.Event, poll_s: float = 0.1) -> bool:
        """Blocks until n more trajectories fit in the window; False if stopped."""
        with self._cond:
            while self.outstanding + n > self.window or (self.rounds and self._round_left < n):
                if stop.is_set():
                    return False
                self._cond.wait(poll_s)
            self.outstanding += n
            if self.rounds:
                self._round_left -= n
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self.outstanding = max(0, self.outstanding - n)
            self._cond.notify_all()

    def round_requested(self) -> bool:
        with self._cond:
            return self.rounds and self._round_left == 0

    def round_complete(self) -> bool:
        """Every trajectory of the round requested, and every one of them back."""
        with self._cond:
            return self.rounds and self._round_left == 0 and self.outstanding == 0

    def open_round(self, size: int | None = None) -> None:
        """The next round may request `size` trajectories (default: the window), no more
        than the window the credit rule allows."""
        with self._cond:
            self._round_left = self.window if size is None else max(1, min(size, self.window))
            self._cond.notify_all()

    def forget_outstanding(self) -> None:
        """A timed-out round: what did not come back is written off (and counted by the caller)."""
        with self._cond:
            self.outstanding = 0
            self._cond.notify_all()


class Feeder(threading.Thread):
    def __init__(
        self,
        topic: str,
        tasks,
        credits: TrajectoryCredits,
        group_size: int,
        env: str,
        env_config: dict | None = None,
        min_version=lambda: 0,
        start: int = 0,
    ):
        super().__init__(name="feeder", daemon=True)
        self.min_version = min_version  # () -> the oldest policy version a new request may use
        self.topic, self.credits, self.group_size = topic, credits, group_size
        self.env, self.env_config = env, env_config or {}
        # A resumed learner continues the prompt stream where its checkpoint left it.
        self.tasks = itertools.islice(itertools.cycle(tasks), start % max(len(tasks), 1), None)
        self.stop_event = threading.Event()
        self.published = self.start_position = start  # requests made before a restart are not this run's
        self.error: BaseException | None = None
        self._run_id = uuid.uuid4().hex[:8]

    def run(self) -> None:
        publisher = pubsub_io.publisher_client()
        try:
            while self.credits.acquire(self.group_size, self.stop_event):
                task = next(self.tasks)
                req = RolloutRequest(
                    request_id=f"{self._run_id}-{self.published:07d}",
                    env=self.env,
                    task=task.to_json_dict(),
                    group_size=self.group_size,
                    env_config=self.env_config,
                    min_policy_version=self.min_version(),
                )
                pubsub_io.publish(publisher, self.topic, req.to_bytes()).result(timeout=30)
                self.published += 1
        except BaseException as e:
            self.error = e
            log.exception("feeder failed")

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
