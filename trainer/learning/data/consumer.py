"""Pulls packed records from Pub/Sub, validates them, dead-letters what is invalid, and
acks a record only once it can no longer be lost (trainer/learning/data/deliveries.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable

from google.api_core import exceptions as gexc

from core.contracts import pubsub_io
from core.contracts.records import KIND_ATTRIBUTE, KIND_DROPPED, PackedRecord, RecordError, decode
from trainer.learning.data.deliveries import Deliveries, DeliveryConfig
from trainer.learning.data.schedule import PADDING_ID
from trainer.learning.data.staleness import StalenessConfig

log = logging.getLogger(__name__)

MAX_NOTICE_TRAJECTORIES = 100_000  # a drop notice covers one group or one trajectory: far fewer
_TRANSIENT = (gexc.GoogleAPICallError, gexc.RetryError)  # Pub/Sub unreachable, restarting, overloaded


class RecordConsumer:
    """Every pulled message ends in exactly one counter: accepted, duplicate or rejected.
    A rejected message is published to the dead-letter topic (when configured) with the
    reason, then acked: it never reaches the learner and never blocks the subscription.

    An accepted record is held, not acked, until `settle` says it was trained or dropped
    and a durable checkpoint covers it: the step its save began at is at most `durable()`,
    the newest durable checkpoint step, whatever saves are in flight after it. With
    `durable=None` (a learner without checkpoints) a settled record is acked at once."""

    def __init__(
        self,
        subscription: str,
        shapes: set[tuple[int, int]],
        dead_letter_topic: str | None = None,
        *,
        delivery: DeliveryConfig = DeliveryConfig(),
        max_staleness: int = StalenessConfig.max_staleness,
        consumed: dict[str, int] | None = None,
        durable: Callable[[], int | None] | None = None,
        max_trajectory_len: int | None = None,
    ):
        self.subscription = subscription
        self.shapes = set(shapes)  # one per length bucket
        # The layout's longest trajectory: the learner's banded attention sees no further back.
        self.max_trajectory_len = max_trajectory_len
        self.dead_letter_topic = dead_letter_topic
        self.subscriber = pubsub_io.subscriber_client()
        self.publisher = pubsub_io.publisher_client() if dead_letter_topic else None
        self.deliveries = Deliveries(delivery, consumed, max_staleness=max_staleness)
        self.durable = durable
        self.accepted = self.duplicates = self.rejected = 0
        # Failed pulls, acks, extensions and dead-letter publishes. A failed ack is not retried:
        # the message comes back, and the dedup set (or its held entry) absorbs it.
        self.pubsub_errors = 0
        self.dropped_trajectories: dict[str, int] = {}  # by reason, from the pipeline's drop notices
        self._unreleased_drops: list[str] = []
        self._backoff_s = 0.0

    def poll(self, max_messages: int = 10, timeout_s: float = 1.0) -> list[PackedRecord]:
        self._acknowledge()
        try:
            received = pubsub_io.pull(self.subscriber, self.subscription, max_messages, timeout_s)
        except _TRANSIENT as e:
            if (fatal := pubsub_io.permanent_error(e, f"subscription {self.subscription}")) is not None:
                raise fatal from None  # a wrong name or a missing grant: no retry fixes it
            self._failed("pull", e)
            return []
        self._backoff_s = 0.0
        out, ack_now = [], []
        for rm in received:
            kind = rm.message.attributes.get(KIND_ATTRIBUTE)
            if kind is not None:
                self._notice(rm.message, kind)
                ack_now.append(rm.ack_id)
                continue
            try:
                rec = decode(rm.message.data)
                if rec.shape not in self.shapes:
                    raise RecordError(f"record shape {rec.shape} is not a declared bucket shape {sorted(self.shapes)}")
                self._check_lengths(rec)
            except RecordError as e:
                if self._reject(rm.message, str(e)):
                    ack_now.append(rm.ack_id)  # else it comes back, to be dead-lettered again
                continue
            fate = self.deliveries.accept(rec.record_id, rm.ack_id, rec.min_policy_version)
            if fate == "new":
                self.accepted += 1
                out.append(rec)
                continue
            self.duplicates += 1  # Pub/Sub delivers at least once
            if fate == "consumed":
                ack_now.append(rm.ack_id)
        self._call("ack", pubsub_io.ack, ack_now)
        return out

    def _check_lengths(self, rec: PackedRecord) -> None:
        """A segment longer than the layout's trajectory length would be mis-attended (the
        learner attends within that span only): refused. Positions count 0.. along each
        contiguous segment (validated), so the longest segment is the largest position + 1."""
        longest = int(rec.positions.max()) + 1
        if self.max_trajectory_len is not None and longest > self.max_trajectory_len:
            raise RecordError(
                f"a segment of {longest} tokens is longer than the layout's max_trajectory_len "
                f"{self.max_trajectory_len}"
            )

    def settle(self, records: Iterable[PackedRecord]) -> None:
        """These records were trained, or dropped as stale (a sync round's padding records
        never came from Pub/Sub: nothing to settle)."""
        self.deliveries.settle(r.record_id for r in records if r.record_id != PADDING_ID)

    def checkpoint_ids(self, learner_version: int, step: int) -> dict[str, int]:
        """Call as checkpoint `step`'s save begins: the dedup set it must hold (record id ->
        oldest policy version); what is settled now is acked once that step is durable."""
        return self.deliveries.checkpoint(learner_version, step)

    def _acknowledge(self) -> None:
        d = self.deliveries
        acks = d.take_settled() if self.durable is None else d.take_covered(self.durable())
        self._call("ack", pubsub_io.ack, acks)
        extend = d.due_for_extension()
        self._call("extend", pubsub_io.modify_ack_deadline, extend, d.cfg.ack_deadline_s)

    def _call(self, what: str, fn, ack_ids: list[str], *args) -> None:
        """An ack or extension that fails is not retried here: the message comes back and
        the dedup set (or the held entry) absorbs the redelivery."""
        if not ack_ids:
            return
        try:
            fn(self.subscriber, self.subscription, ack_ids, *args)
        except _TRANSIENT as e:
            self._failed(what, e)

    def _failed(self, what: str, e: Exception) -> None:
        self.pubsub_errors += 1
        self._backoff_s = min(max(2 * self._backoff_s, 0.25), 8.0)
        log.warning("Pub/Sub %s failed (%s); backing off %.2f s", what, type(e).__name__, self._backoff_s)
        time.sleep(self._backoff_s)

    def take_dropped(self) -> list[str]:
        """Ids of the trajectories the pipeline reported as deliberately not packed since the
        last call: their feeder credits are due back."""
        ids, self._unreleased_drops = self._unreleased_drops, []
        return ids

    def _notice(self, message, kind: str) -> None:
        try:
            if kind != KIND_DROPPED:
                raise ValueError(f"unknown message kind {kind!r}")
            n = int(message.attributes["trajectories"])
            if not 0 < n <= MAX_NOTICE_TRAJECTORIES:
                raise ValueError(f"trajectories={n} out of range")
            if len(message.data) > 256 * n + 64:
                raise ValueError(f"{len(message.data)} bytes for {n} trajectory ids")
            ids = json.loads(message.data)["trajectory_ids"]
            if not (isinstance(ids, list) and len(ids) == n and all(isinstance(i, str) and i for i in ids)):
                raise ValueError(f"trajectory_ids must be {n} non-empty strings")
        except (KeyError, TypeError, ValueError) as e:  # JSONDecodeError is a ValueError
            self._reject(message, f"bad notice: {e}")  # a notice is acked either way: it holds no data
            return
        reason = message.attributes.get("reason", "unknown")[:64]
        self.dropped_trajectories[reason] = self.dropped_trajectories.get(reason, 0) + n
        self._unreleased_drops += ids

    def _reject(self, message, error: str) -> bool:
        """Dead-letters `message`; False when the dead-letter topic could not be reached."""
        self.rejected += 1
        log.error("rejected record message %s: %s", message.message_id, error)
        if self.publisher is None:
            return True
        try:
            pubsub_io.publish(
                self.publisher,
                self.dead_letter_topic,
                message.data,
                error=error[:1000],
                source_subscription=self.subscription,
            ).result(timeout=30)
        except (*_TRANSIENT, TimeoutError) as e:
            if (fatal := pubsub_io.permanent_error(e, f"dead-letter topic {self.dead_letter_topic}")) is not None:
                raise fatal from None
            self.rejected -= 1  # counted when it is dead-lettered for good
            self._failed("dead-letter publish", e)
            return False
        return True

    def close(self) -> None:
        """Acks what a durable checkpoint covers and nacks everything else still held, so
        the next learner gets it at once instead of after the ack deadline."""
        self._acknowledge()
        self._call("nack", pubsub_io.modify_ack_deadline, self.deliveries.release_all(), 0)
        self.subscriber.close()
