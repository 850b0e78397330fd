"""A learner that gets no records says why, and stops when nothing can ever train.

Requests go out and groups come back as records, or as drop notices (zero-signal groups,
overlong trajectories), or not at all (still running, dead-lettered, lost). When no record
has arrived for `warn_s`, the watch names where the requested trajectories went, with
counts from the data plane's accounting. When none has arrived for `stop_s` although the
pipeline kept answering (at least `min_dropped` trajectories dropped in that time), every
group is being dropped and no step can ever happen: the run stops with that message
instead of running into its timeout.
"""

from __future__ import annotations

import time

from core.config import configclass, knob
from core.contracts.run_summary import Accounting

ZERO_SIGNAL_HINT = (
    "every dropped group had equal rewards (zero signal): the policy solves none of its tasks, or all; "
    "a longer warm start or an easier recipe gives RL something to compare (docs/RESULTS.md), "
    "--no-filter_zero_signal trains on them anyway"
)


@configclass
class StarvationConfig:
    warn_s: float = knob(
        60.0, "no record for this long while requests are out: log why, with counts", flag="starved_warn_s", gt=0
    )
    stop_s: float = knob(
        240.0,
        "no record for this long while the pipeline drops every group it returns: stop the run (0: never)",
        flag="starved_stop_s",
        ge=0,
    )
    min_dropped: int = knob(
        32, "trajectories dropped within --starved_stop_s before that stop applies", flag="starved_min_dropped", ge=1
    )

    def __post_init__(self):
        if self.stop_s and self.stop_s < self.warn_s:
            raise ValueError(f"--starved_stop_s must be 0 (never) or >= --starved_warn_s, got {self.stop_s}")


def describe(acc: Accounting, waited_s: float) -> str:
    """Where the requested trajectories went, for a learner that has waited `waited_s`."""
    drops = ", ".join(f"{k} {v}" for k, v in sorted(acc.dropped_by_pipeline.items()) if v) or "none"
    text = (
        f"no record for {waited_s:.0f} s: of {acc.requested} trajectories requested, {acc.received} arrived in "
        f"records, dropped by the pipeline: {drops}; written off (request timed out) {acc.written_off}; "
        f"still running, dead-lettered or in Pub/Sub {acc.in_flight_at_end}"
    )
    if acc.dropped_by_pipeline.get("zero_signal", 0) and acc.dropped_by_pipeline["zero_signal"] >= sum(
        acc.dropped_by_pipeline.values()
    ):
        text += f" ({ZERO_SIGNAL_HINT})"
    return text


class StarvationWatch:
    """Fed after every poll: `check` returns a line to log (at most every warn_s) and sets
    `stopped` when the run can never train."""

    def __init__(self, cfg: StarvationConfig, clock=time.monotonic):
        self.cfg, self.clock = cfg, clock
        self.last_record = self.last_warn = clock()
        self.dropped_at_last_record = 0
        self.stopped: str | None = None
        self.waiting: str | None = None  # the newest line, cleared by a record
        self._rebase = False  # count drops from the next check on (after a train step)

    def progressed(self) -> None:
        """A batch was trained: a learner busy on buffered records is not starving, however
        long its steps take, and the drops before it cannot stop the run."""
        self.last_record = self.last_warn = self.clock()
        self.waiting, self._rebase = None, True

    def check(self, records: int, acc: Accounting) -> str | None:
        now = self.clock()
        dropped = sum(acc.dropped_by_pipeline.values())
        if self._rebase:
            self.dropped_at_last_record, self._rebase = dropped, False
        if records:
            self.last_record = self.last_warn = now
            self.dropped_at_last_record, self.waiting = dropped, None
            return None
        waited = now - self.last_record
        if waited < self.cfg.warn_s or acc.requested == 0:
            return None
        if (
            self.cfg.stop_s
            and waited >= self.cfg.stop_s
            and dropped - self.dropped_at_last_record >= self.cfg.min_dropped
        ):
            self.stopped = f"nothing can train: {describe(acc, waited)}"
            return self.stopped
        if now - self.last_warn < self.cfg.warn_s:
            return None
        self.last_warn = now
        self.waiting = describe(acc, waited)
        return self.waiting
