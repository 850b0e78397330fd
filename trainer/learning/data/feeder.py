"""The prompt feeder: publishes rollout requests, bounded by trajectory credits.

Credits are counted in trajectories: the feeder may have at most `window` trajectories
requested but not yet received by the learner. Every received record returns the
credits of the trajectories it holds. Because a record holds at most
rows * max_segments_per_row trajectories and the packer always flushes within its
maximum wait, a window of (ahead + 1) * batch_records * rows * max_segments_per_row
+ group_size can never deadlock: what is outstanding always fills another batch.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import threading
import time
import uuid

from google.api_core import exceptions as gexc

from core.config import configclass, knob
from core.contracts import pubsub_io
from core.contracts.record_shape import RecordShape
from core.contracts.rollout_request import RolloutRequest

log = logging.getLogger(__name__)


@configclass
class CreditConfig:
    max_batches_ahead: int = knob(1, "feeder credits, in batches beyond the one being filled", ge=0)
    group_size: int = knob(4, "episodes per request (the GRPO group)", ge=1)
    # The user's knob for the asynchronous window: trajectories in flight (Little's law:
    # the learner's consumption rate x episode latency). None: from max_batches_ahead.
    max_in_flight: int | None = knob(
        None, "feeder credits, in trajectories requested and not yet back (overrides --max_batches_ahead)"
    )
    # Above any honest episode latency: a redo of a slow request doubles its cost. None:
    # never (the sync baseline's round timeout does it per round).
    request_timeout_s: float | None = knob(
        300.0, "a rollout request not back within this is written off and asked again (async only)", gt=0
    )


@dataclasses.dataclass(frozen=True)
class CreditWindow:
    """The window the credits allow: the credit knobs against what the learner consumes,
    `batch_records` records of the layout's largest `shape` a step. Synchronous rounds
    (`sync`): the window is the largest round, the trajectories that fill `steps_per_round`
    batches of full records (whole groups); SyncSchedule sizes each round within it from
    the packing it sees (max_batches_ahead unused). Built where the credits are
    (trainer/learning/builder.py) and checked by the job's config (the deadlock rule)."""

    cfg: CreditConfig
    batch_records: int
    shape: RecordShape
    sync: bool = False
    steps_per_round: int = 1

    def check(self) -> None:
        """Refuses a window that could deadlock (tests/test_credits.py)."""
        if self.cfg.max_in_flight is not None and not self.sync and self.cfg.max_in_flight < self.min_window:
            raise ValueError(
                f"max_in_flight={self.cfg.max_in_flight!r} could deadlock: the learner's next batch may need "
                f"{self.min_window} trajectories in flight (batch_records x rows x segments + group_size)"
            )

    @property
    def request_timeout(self) -> float | None:
        """The timeout the credits apply: none in synchronous rounds (the round timeout does it)."""
        return None if self.sync else self.cfg.request_timeout_s

    @property
    def per_batch(self) -> int:
        return self.batch_records * self.shape.max_trajectories

    @property
    def min_window(self) -> int:
        """The smallest window that always fills the next batch (tests/test_credits.py)."""
        return self.per_batch + self.cfg.group_size

    @property
    def window(self) -> int:
        group = self.cfg.group_size
        if self.sync:
            return math.ceil(self.steps_per_round * self.per_batch / group) * group
        if self.cfg.max_in_flight is not None:
            return self.cfg.max_in_flight
        return (self.cfg.max_batches_ahead + 1) * self.per_batch + group

    @property
    def batches_ahead(self) -> float:
        """The window as full batches beyond the one being filled (a derived view)."""
        return (self.window - self.cfg.group_size) / self.per_batch - 1


class TrajectoryCredits:
    """At most `window` trajectories requested and not yet back. With rounds=True, the
    window is also all that one round may request: after that, acquire blocks until
    open_round() (the synchronous baseline requests nothing before the next version).

    Credits are also tracked per request (`opened` / `returned`, by trajectory id
    "<request_id>/<i>"), so a request that never comes back (a rollout worker killed with it,
    a dead-lettered request) can be written off and redone (`expire`) instead of holding its
    credits for ever; a late arrival of a written-off request releases nothing twice."""

    def __init__(self, window: int, rounds: bool = False, request_timeout_s: float | None = None, clock=time.monotonic):
        self.window, self.rounds, self.clock = window, rounds, clock
        self.request_timeout_s = request_timeout_s  # CreditConfig's; None: never give up on a request
        self.outstanding = 0
        self._round_left = window
        self._cond = threading.Condition()
        self._open: dict[str, list] = {}  # request id -> [trajectories not back, opened at, request]
        self._written_off_ids: set[str] = set()
        self.written_off = 0  # trajectories given up on (timed out, or a sync round's write-off)
        self.late = 0  # trajectories that came back after their request was written off
        self.foreign = 0  # trajectories of requests this run never made (from before a restart)

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

    def resize(self, window: int) -> None:
        """A new window (the lag controller's): a smaller one admits nothing new until the
        outstanding drop below it; nothing already requested is taken back."""
        with self._cond:
            if self.rounds:
                raise ValueError("a synchronous round's window is its round: not resized")
            self.window = int(window)
            self._cond.notify_all()

    def release(self, n: int) -> None:
        with self._cond:
            self.outstanding = max(0, self.outstanding - n)
            self._cond.notify_all()

    def opened(self, request: RolloutRequest) -> None:
        """`request` (its credits acquired) is about to be published."""
        with self._cond:
            self._open[request.request_id] = [request.group_size, self.clock(), request]

    def returned(self, trajectory_ids) -> None:
        """These trajectories came back (in a record, or a drop notice): their credits too."""
        with self._cond:
            for tid in trajectory_ids:
                rid = str(tid).rpartition("/")[0]
                entry = self._open.get(rid)
                if entry is None:
                    if rid in self._written_off_ids:
                        self.late += 1
                    else:
                        self.foreign += 1
                    continue
                entry[0] -= 1
                self.outstanding = max(0, self.outstanding - 1)
                if entry[0] <= 0:
                    del self._open[rid]
            self._cond.notify_all()

    def expire(self, timeout_s: float | None = None, requeue=None) -> list[RolloutRequest]:
        """Requests open for longer than `timeout_s` (default: request_timeout_s): written off
        (their credits back) and returned, to be redone. `requeue(requests)` runs before the
        credits can be taken again, so a waiting feeder spends them on the redo, not on a new
        prompt."""
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        if timeout_s is None:
            return []
        now, out = self.clock(), []
        with self._cond:
            for rid, (left, opened_at, request) in list(self._open.items()):
                if now - opened_at > timeout_s:
                    self._write_off(rid, left)
                    out.append(request)
            if out and requeue is not None:
                requeue(out)
            self._cond.notify_all()
        return out

    def _write_off(self, rid: str, left: int) -> None:
        del self._open[rid]
        self._written_off_ids.add(rid)
        self.written_off += left
        self.outstanding = max(0, self.outstanding - left)

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
        """A timed-out round: what did not come back is written off."""
        with self._cond:
            for rid, (left, _, _) in list(self._open.items()):
                self._write_off(rid, left)
            self.written_off += self.outstanding  # acquired, never opened through a request
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
        self._redo: collections.deque = collections.deque()  # tasks of written-off requests
        self.redone = 0  # requests made again (not a step in the prompt stream)
        self.publish_errors = 0
        self._sequence = itertools.count(start)

    def redo_timed_out(self) -> int:
        """Writes off requests older than the credits' request_timeout_s and queues their tasks
        again; the number of requests written off."""
        expired = self.credits.expire(requeue=lambda reqs: self._redo.extend(r.task for r in reqs))
        for req in expired:
            timeout_s = self.credits.request_timeout_s
            log.warning("request %s not back after %.0f s: written off, asked again", req.request_id, timeout_s)
        return len(expired)

    def run(self) -> None:
        publisher = pubsub_io.publisher_client()
        try:
            while self.credits.acquire(self.group_size, self.stop_event):
                redo = self._redo.popleft() if self._redo else None
                req = RolloutRequest(
                    request_id=f"{self._run_id}-{next(self._sequence):07d}",
                    env=self.env,
                    task=redo if redo is not None else next(self.tasks).to_json_dict(),
                    group_size=self.group_size,
                    env_config=self.env_config,
                    min_policy_version=self.min_version(),
                )
                self.credits.opened(req)
                if not self._publish(publisher, req):
                    return  # stopped while Pub/Sub was unreachable
                if redo is None:
                    self.published += 1  # the prompt stream's position: what a resumed learner skips
                else:
                    self.redone += 1
        except pubsub_io.PermanentError as e:
            self.error = e
            log.error("feeder stopped: %s", e)
        except BaseException as e:
            self.error = e
            log.exception("feeder failed")

    def _publish(self, publisher, req: RolloutRequest) -> bool:
        """Publishes `req`, retrying with backoff while Pub/Sub is unreachable (an outage, a
        restarting emulator); False if stopped first. A publish that timed out may still have
        gone through: the copy runs twice and the pipeline's dedup keeps one."""
        for attempt in itertools.count():
            try:
                pubsub_io.publish(publisher, self.topic, req.to_bytes()).result(timeout=30)
                return True
            except (gexc.GoogleAPICallError, gexc.RetryError, TimeoutError) as e:
                if (fatal := pubsub_io.permanent_error(e, f"requests topic {self.topic}")) is not None:
                    raise fatal from None  # run() records it as the feeder's error: the learner stops
                self.publish_errors += 1
                wait_s = min(0.5 * 2**attempt, 10.0)
                log.warning("publishing request %s failed (%s); retrying in %.1f s", req.request_id, e, wait_s)
                if self.stop_event.wait(wait_s):
                    return False

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
