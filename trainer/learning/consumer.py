"""Pulls packed records from Pub/Sub, validates them, dead-letters what is invalid."""

from __future__ import annotations

import logging

from trainer.contracts import pubsub_io
from trainer.contracts.records import KIND_ATTRIBUTE, KIND_DROPPED, PackedRecord, RecordError, decode

log = logging.getLogger(__name__)


class RecordConsumer:
    """Every pulled message ends in exactly one counter: accepted, duplicate or rejected.
    A rejected message is published to the dead-letter topic (when configured) with the
    reason, then acked: it never reaches the learner and never blocks the subscription."""

    def __init__(self, subscription: str, shapes: set[tuple[int, int]], dead_letter_topic: str | None = None):
        self.subscription = subscription
        self.shapes = set(shapes)  # one per length bucket
        self.dead_letter_topic = dead_letter_topic
        self.subscriber = pubsub_io.subscriber_client()
        self.publisher = pubsub_io.publisher_client() if dead_letter_topic else None
        self.seen_ids: set[str] = set()
        self.accepted = self.duplicates = self.rejected = 0
        self.dropped_trajectories: dict[str, int] = {}  # by reason, from the pipeline's drop notices
        self._unreleased_drops = 0

    def poll(self, max_messages: int = 10, timeout_s: float = 1.0) -> list[PackedRecord]:
        received = pubsub_io.pull(self.subscriber, self.subscription, max_messages, timeout_s)
        out = []
        for rm in received:
            kind = rm.message.attributes.get(KIND_ATTRIBUTE)
            if kind is not None:
                self._notice(rm.message, kind)
                continue
            try:
                rec = decode(rm.message.data)
                if rec.shape not in self.shapes:
                    raise RecordError(f"record shape {rec.shape} is not a declared bucket shape {sorted(self.shapes)}")
            except RecordError as e:
                self._reject(rm.message, str(e))
                continue
            if rec.record_id in self.seen_ids:  # Pub/Sub delivers at least once
                self.duplicates += 1
                continue
            self.seen_ids.add(rec.record_id)
            self.accepted += 1
            out.append(rec)
        pubsub_io.ack(self.subscriber, self.subscription, [rm.ack_id for rm in received])
        return out

    def take_dropped(self) -> int:
        """Trajectories the pipeline reported as deliberately not packed since the last
        call: their feeder credits are due back."""
        n, self._unreleased_drops = self._unreleased_drops, 0
        return n

    def _notice(self, message, kind: str) -> None:
        try:
            if kind != KIND_DROPPED:
                raise ValueError(f"unknown message kind {kind!r}")
            n = int(message.attributes["trajectories"])
            if not 0 < n <= 1_000_000:
                raise ValueError(f"trajectories={n} out of range")
        except (KeyError, ValueError) as e:
            self._reject(message, f"bad notice: {e}")
            return
        reason = message.attributes.get("reason", "unknown")[:64]
        self.dropped_trajectories[reason] = self.dropped_trajectories.get(reason, 0) + n
        self._unreleased_drops += n

    def _reject(self, message, error: str) -> None:
        self.rejected += 1
        log.error("rejected record message %s: %s", message.message_id, error)
        if self.publisher is not None:
            pubsub_io.publish(
                self.publisher,
                self.dead_letter_topic,
                message.data,
                error=error[:1000],
                source_subscription=self.subscription,
            ).result(timeout=30)

    def close(self) -> None:
        self.subscriber.close()
