"""A closed loop on staleness: the credit window resized to hold the realised lag at a target.

The plan (localstack/launch/plan.py) picks a target lag by time to target and a window by
Little's law from rates measured once; on another host, with other tool latencies, or
with rollout workers joining and leaving, that window gives another lag (2026-12-06: plan
2.4, realised 3.12). This loop measures what it gets and corrects:

- measured: the mean lag of the records trained since the last decision (learner version
  at the step - the oldest policy version in the record);
- law: a window of W trajectories in flight gives a lag of about W / (trajectories trained
  a version) (Little), so W * target / measured is the window that gives the target, under
  the same rates. The step is bounded (`max_change`), nothing moves while the lag is within
  `tolerance` of the target (hysteresis), and the window stays in [floor, ceiling]: the
  floor is the credits' deadlock bound, the ceiling the window whose lag would reach the
  staleness cap (`max_staleness` stays a hard cap: staler records are still dropped);
- dead time: a change shows in the lag only once the trajectories requested after it are
  trained, about `target` versions later; the loop waits that long (`settle_versions`)
  before it judges again, or it would wind up.

Every change is logged with its reason and kept in `changes` (the run summary, the live
panel and TensorBoard's `credits/window`).
"""

from __future__ import annotations

import dataclasses
import logging
import math

from core.config import configclass, knob

log = logging.getLogger("learner")


@configclass
class LagControlConfig:
    target: float | None = knob(
        None,
        "hold the mean lag of trained records at this many versions by resizing the credit window "
        "(unset: the window stays where --max_in_flight put it; the demo's plan sets it)",
        gt=0,
    )
    tolerance: float = knob(0.08, "no change while the measured lag is within this share of the target", ge=0, lt=1)
    # Little's law makes target / measured the whole correction; the bound only guards
    # against one noisy version (a lag that doubles is corrected in two decisions).
    max_change: float = knob(
        0.5, "the largest share the window grows by (or 1/(1+this) it shrinks to) at once", gt=0, le=1
    )
    settle_versions: int | None = knob(
        None, "versions to wait after a change before judging again (unset: ceil(target) + 1)", ge=1
    )
    # A version's lag is a mean of integers over a few records (the demo trains 8 a version,
    # their lags mostly 0, 1 or 2): one version's mean moved by about the tolerance from
    # noise alone (measured 0.88-1.38 at one window). Pooled across versions until this many.
    min_records: int = knob(16, "records trained since the last decision before one is made", ge=1)


@dataclasses.dataclass(frozen=True)
class Change:
    version: int
    old: int
    new: int
    lag: float  # the measured mean lag that asked for it
    reason: str


class LagController:
    """Decides the credit window once a version from the lag of the records trained in it."""

    def __init__(self, cfg: LagControlConfig, window: int, floor: int, ceiling: int, group_size: int = 1):
        if cfg.target is None:
            raise ValueError("LagController needs a target lag (--lag_target)")
        if not 1 <= floor <= ceiling:
            raise ValueError(f"the window's floor {floor} must lie in [1, ceiling {ceiling}]")
        self.cfg, self.group_size = cfg, group_size
        self.floor, self.ceiling = floor, ceiling
        self.window = min(max(window, floor), ceiling)
        self.settle = cfg.settle_versions or math.ceil(cfg.target) + 1
        self.changes: list[Change] = []
        self._lags: list[int] = []
        self._quiet_until = self.settle  # v0's first records were requested before any measurement
        self.last_lag: float | None = None

    def observe(self, lags) -> None:
        """The lags (versions) of the records one train step used."""
        self._lags.extend(int(x) for x in lags)

    def on_version(self, version: int) -> int | None:
        """Version `version` was published: the new window, or None to keep it."""
        if version < self._quiet_until:  # records requested before the last change: not its effect
            if self._lags:
                self.last_lag = sum(self._lags) / len(self._lags)
            self._lags.clear()
            return None
        if len(self._lags) < self.cfg.min_records:
            return None  # pooled with the next version's
        lag = sum(self._lags) / len(self._lags)
        self._lags.clear()
        self.last_lag = lag
        target = self.cfg.target
        if abs(lag - target) <= self.cfg.tolerance * target:
            return None
        # Little: W ~ lag x trajectories a version; a zero lag says only "too small".
        ratio = target / lag if lag > 0 else 1 + self.cfg.max_change
        ratio = min(max(ratio, 1 / (1 + self.cfg.max_change)), 1 + self.cfg.max_change)
        new = self._clamp(self.window * ratio, grow=ratio > 1)
        if new == self.window:
            return None
        bound = {
            self.floor: " (at the floor: the deadlock bound)",
            self.ceiling: " (at the ceiling: the staleness cap)",
        }
        bound = bound.get(new, "")
        reason = f"mean lag {lag:.2f} against target {target:g}: window {self.window} -> {new}{bound}"
        self.changes.append(Change(version, self.window, new, round(lag, 3), reason))
        log.info("lag control at v%d: %s", version, reason)
        self.window = new
        self._quiet_until = version + self.settle
        return new

    def _clamp(self, w: float, grow: bool) -> int:
        """Whole groups, moved at least one group the way asked, within [floor, ceiling]."""
        g = self.group_size
        groups = math.ceil(w / g) if grow else math.floor(w / g)
        if groups * g == self.window:
            groups += 1 if grow else -1
        return int(min(max(groups * g, self.floor), self.ceiling))

    def summary(self) -> dict:
        return {
            "target": self.cfg.target,
            "window": self.window,
            "floor": self.floor,
            "ceiling": self.ceiling,
            "last_lag": self.last_lag,
            "changes": [dataclasses.asdict(c) for c in self.changes],
        }


def window_bounds(min_window: int, per_batch: int, publish_every: int, max_staleness: int, group_size: int):
    """(floor, ceiling) of the window: the credits' deadlock bound, and the window whose lag
    by Little's law would be the staleness cap even with every record full (per_batch is
    the most trajectories a batch can hold), in whole groups, never below the floor."""
    floor = math.ceil(min_window / group_size) * group_size
    ceiling = max(floor, (max_staleness * publish_every * per_batch // group_size) * group_size + group_size)
    return floor, ceiling
