"""Staleness control, declared in one object.

A record's staleness = learner version - the oldest policy version that generated any
of its tokens. Three bounds work together:
  * records staler than `max_staleness` are dropped on arrival (counted; acked once a checkpoint covers them);
  * while the mean staleness of the data ready to train exceeds `max_mean_staleness`,
    the learner does not train on it and waits for fresher records;
  * the feeder stamps every request with `min_policy_version = learner version -
    max_staleness`, and workers wait for that version before running it, so rollouts
    never start further behind than the bound.
The synchronous baseline (`--sync`, trainer/learning/data/schedule.py) runs with
max_staleness 0: every request waits for the newest policy, and the learner trains only
on its own version.
"""

from __future__ import annotations

import collections

from core.config import configclass, knob


@configclass
class StalenessConfig:
    max_staleness: int = knob(2, "drop records older than this many versions (--sync: always 0)", ge=0)
    max_mean_staleness: float | None = knob(
        None, "wait for fresher data while the ready data is staler than this on average (unset: never wait)"
    )

    def __post_init__(self):
        if self.max_mean_staleness is not None and not 0 <= self.max_mean_staleness <= self.max_staleness:
            # Above max_staleness it could never bind; below 0 the learner would wait forever.
            raise ValueError(
                f"max_mean_staleness must lie in [0, max_staleness={self.max_staleness}], got {self.max_mean_staleness}"
            )

    def min_request_version(self, learner_version: int) -> int:
        return max(0, learner_version - self.max_staleness)


class StalenessControl:
    def __init__(self, cfg: StalenessConfig):
        self.cfg = cfg
        self.histogram = collections.Counter()  # staleness of every admitted record
        self.dropped_records = 0
        self.dropped_trajectories = 0
        self.waits = 0

    @staticmethod
    def staleness(record, learner_version: int) -> int:
        oldest = record.min_policy_version
        return learner_version - oldest if oldest >= 0 else 0  # no generated token: nothing to be stale

    def admit(self, record, learner_version: int) -> bool:
        s = self.staleness(record, learner_version)
        if s > self.cfg.max_staleness:
            self.dropped_records += 1
            self.dropped_trajectories += len(record.trajectories)
            return False
        self.histogram[s] += 1
        return True

    def admit_again(self, record, learner_version: int) -> bool:
        """Re-check a buffered record after the version moved on (not re-histogrammed)."""
        if self.staleness(record, learner_version) <= self.cfg.max_staleness:
            return True
        self.dropped_records += 1
        self.dropped_trajectories += len(record.trajectories)
        return False

    def should_wait(self, ready: list, learner_version: int) -> bool:
        """True when the ready data is on average too stale to train on now."""
        if self.cfg.max_mean_staleness is None or not ready:
            return False
        mean = sum(self.staleness(r, learner_version) for r in ready) / len(ready)
        if mean > self.cfg.max_mean_staleness:
            self.waits += 1
            return True
        return False
