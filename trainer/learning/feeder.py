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

    def __post_init__(self):
        if self.max_batches_ahead < 0 or self.batch_records < 1 or self.group_size < 1:
            raise ValueError(f"need max_batches_ahead >= 0, batch_records >= 1, group_size >= 1: {self}")

    @property
    def window(self) -> int:
        per_batch = self.batch_records * self.shape.max_trajectories
        return (self.max_batches_ahead + 1) * per_batch + self.group_size


class TrajectoryCredits:
    def __init__(self, window: int):
        self.window = window
        self.outstanding = 0
        self._cond = threading.Condition()

    def acquire(self, n: int, stop: threading.Event, poll_s: float = 0.1) -> bool:
        """Blocks until n more trajectories fit in the window; False if stopped."""
        with self._cond:
            while self.outstanding + n > self.window:
                if stop.is_set():
                    return False
                self._cond.wait(poll_s)
            self.outstanding += n
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self.outstanding = max(0, self.outstanding - n)
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
        self.published = start
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
