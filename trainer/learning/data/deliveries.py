"""Where every accepted record message stands until it is acknowledged: at-least-once
delivery without loss, and a dedup state that stays bounded.

A record's life on the learner:
    held      pulled and accepted, not acked; its ack deadline is extended while held
    settled   its fate is decided (trained, or dropped as stale); still held
    covered   settled before checkpoint step S's save began; acked once step S is durable
              (its manifest written), whatever saves are in flight after it
    consumed  its id is in the dedup set (and in every checkpoint from then on)

So a learner killed at any point loses nothing: a record is acked only after a durable
checkpoint holds both its effect on the weights and its id. Everything still held comes
back from Pub/Sub (at once after a clean exit, which nacks it; after the ack deadline
after a crash), and the restored learner trains it exactly once: the checkpoint's dedup
set says which records it already has.

The dedup set is bounded by staleness, not by time: an id whose record's oldest policy
version is more than `max_staleness` behind the learner can be forgotten, because a
redelivery of that record would be dropped as stale on arrival anyway (staleness only
grows). Records without a generated token (min_policy_version -1) are never stale, so
their ids are kept.
"""

from __future__ import annotations

import dataclasses
import time

from core.config import configclass, knob
from trainer.learning.data.staleness import StalenessConfig


@configclass
class DeliveryConfig:
    # Pub/Sub accepts 10..600 s. What each extension asks for: long enough that a first
    # compile (tens of seconds on CPU) between two polls does not let a deadline lapse.
    ack_deadline_s: int = knob(
        120, "ack deadline asked for records held until a checkpoint covers them (10..600)", ge=10, le=600
    )
    # Under half the deadline, so one late poll is no loss.
    extend_every_s: float = knob(30.0, "how often held records' deadlines are extended", flag="ack_extend_every_s")

    def __post_init__(self):
        if not 0 < self.extend_every_s < self.ack_deadline_s / 2:
            raise ValueError(
                f"extend_every_s must be in (0, ack_deadline_s / 2 = {self.ack_deadline_s / 2}): a held message "
                f"would otherwise be redelivered while it waits for its checkpoint, got {self.extend_every_s}"
            )


@dataclasses.dataclass
class _Held:
    ack_ids: list[str]
    min_version: int
    settled: bool = False
    covered_by: int | None = None  # the checkpoint step whose save holds its effect and id


class Deliveries:
    """The ledger; it talks to nobody. RecordConsumer turns its answers into acks, nacks
    and deadline extensions."""

    def __init__(
        self,
        cfg: DeliveryConfig,
        consumed: dict[str, int] | None = None,
        clock=time.monotonic,
        *,
        max_staleness: int = StalenessConfig.max_staleness,
    ):
        """max_staleness: the staleness the learner applies, the dedup set's horizon."""
        self.cfg, self.clock, self.max_staleness = cfg, clock, max_staleness
        self.held: dict[str, _Held] = {}
        self.consumed: dict[str, int] = dict(consumed or {})  # record id -> its oldest policy version
        self.redelivered = self.expired = 0
        self.peak_consumed = len(self.consumed)
        self._extended_at = clock()

    def accept(self, record_id: str, ack_id: str, min_version: int) -> str:
        """'new' (train it), 'held' (a redelivery of a record we still hold: its new ack id
        is kept with it, so acking it early cannot ack the record before its checkpoint) or
        'consumed' (already in a checkpoint's dedup set: ack it now)."""
        held = self.held.get(record_id)
        if held is not None:
            held.ack_ids.append(ack_id)
            self.redelivered += 1
            return "held"
        if record_id in self.consumed:
            return "consumed"
        self.held[record_id] = _Held([ack_id], min_version)
        return "new"

    def settle(self, record_ids) -> None:
        """Trained, or dropped as stale: the record's fate no longer changes."""
        for rid in record_ids:
            held = self.held[rid]
            held.settled = True
            self.consumed[rid] = held.min_version
        self.peak_consumed = max(self.peak_consumed, len(self.consumed))

    def checkpoint(self, learner_version: int, step: int) -> dict[str, int]:
        """Checkpoint `step`'s save is about to begin: what is settled now and not covered by
        an earlier save is covered by this one. Forgets ids past the staleness horizon;
        returns the dedup set the checkpoint must hold."""
        for held in self.held.values():
            if held.settled and held.covered_by is None:
                held.covered_by = step
        floor = learner_version - self.max_staleness
        old = [rid for rid, v in self.consumed.items() if 0 <= v < floor and rid not in self.held]
        for rid in old:
            del self.consumed[rid]
        self.expired += len(old)
        return dict(self.consumed)

    def take_covered(self, durable_step: int | None) -> list[str]:
        """Ack ids of every record covered by checkpoint `durable_step` or an earlier one:
        that step is durable, so they are (None: no step is durable yet)."""
        if durable_step is None:
            return []
        return self._take(lambda h: h.covered_by is not None and h.covered_by <= durable_step)

    def take_settled(self) -> list[str]:
        """Ack ids of every settled record, covered or not: for a learner without checkpoints,
        where a record is as durable as it will ever be once it is settled."""
        return self._take(lambda h: h.settled)

    def _take(self, done) -> list[str]:
        """Forgets the held records `done(held)` picks; returns their ack ids."""
        rids = [rid for rid, h in self.held.items() if done(h)]
        return [a for rid in rids for a in self.held.pop(rid).ack_ids]

    def due_for_extension(self) -> list[str]:
        """Every held ack id, when the last extension is extend_every_s old; else []."""
        now = self.clock()
        if now - self._extended_at < self.cfg.extend_every_s:
            return []
        self._extended_at = now
        return [a for h in self.held.values() for a in h.ack_ids]

    def release_all(self) -> list[str]:
        """Ack ids of everything still held, forgotten here: to nack at a clean exit, so the
        next learner gets them at once. Settled ones among them were not in a durable
        checkpoint, so the next learner (restored from that checkpoint) must train them again."""
        ids = [a for h in self.held.values() for a in h.ack_ids]
        self.held.clear()
        return ids
