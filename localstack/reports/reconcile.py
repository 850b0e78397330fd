"""The rollout side's counts of a run's trajectories joined to the learner's balances.

The learner's summary says where every trajectory it asked for went (trainer/learning/
accounting.py). The rollout workers count the same trajectories from the other end
(rollout/telemetry.py, the last `rollout/...` row of each worker process). Joined:

    requested by the learner = episodes the workers ended + dead-lettered requests' episodes
                               + not yet run (in Pub/Sub or waiting in a worker)
    episodes ended           = packed into records + dropped on purpose (by reason)
                               + deduplicated + still in the runner or the packer
    packed                   = received by the learner + in Pub/Sub at the end
    dropped (each reason)    = drop notices the learner got + in Pub/Sub at the end

Every right-hand remainder is something still in flight when the run stopped, so it can
be zero or positive but never negative; a negative one is a mismatch, reported with its
size. Two things make one legitimately: trajectories from before a learner restart
(`foreign`) and requests that ran twice (a redelivered request, caught by dedup).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from core.contracts.run_summary import Accounting
from core.telemetry.scalars import read_rows

# The learner's drop-notice reason -> the rollout worker's counter for it.
DROP_COUNTERS = {
    "zero_signal": "trajectories_dropped_zero_signal",
    "dropped_overlong": "trajectories_dropped_overlong",
    "dropped_empty": "trajectories_dropped_empty",
    "content_dedup": "trajectories_content_dedup_dropped",  # other ids, same content: a notice each
}
DEDUP_COUNTERS = ("trajectories_dedup_dropped",)  # a request run twice: its first copy is packed
STATUSES = ("finished", "truncated", "timeout", "env_error")  # environments.EpisodeStatus values


def rollout_totals(workdir: str | Path) -> dict[str, float] | None:
    """Cumulative counters summed over the newest row of every rollout worker process
    (`WORKDIR/logs/rollout-*/metrics.jsonl`); None when no worker wrote a row."""
    totals: dict[str, float] = {}
    found = False
    for path in sorted(Path(workdir, "logs").glob("rollout-*/metrics.jsonl")):
        rows = read_rows(path)
        if not rows:
            continue
        found = True
        for key, value in rows[-1].items():
            if key.startswith("rollout/") and isinstance(value, (int, float)) and not isinstance(value, bool):
                name = key[len("rollout/") :]
                totals[name] = totals.get(name, 0) + value
    return totals if found else None


@dataclasses.dataclass
class Reconciliation:
    """The rollout workers' counts joined to the learner's Accounting; `remainders` are what
    was still in flight at the end, `mismatch` the negative ones among them."""

    episodes: int = 0
    episodes_by_status: dict[str, int] = dataclasses.field(default_factory=dict)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)  # on purpose, by reason
    deduplicated: int = 0
    packed: int = 0
    dead_lettered_requests: int = 0
    bad_requests: int = 0
    remainders: dict[str, int] = dataclasses.field(default_factory=dict)
    mismatch: dict[str, int] = dataclasses.field(default_factory=dict)
    reconciled: bool = True


def reconcile(accounting: Accounting, rollout: dict[str, float], group_size: int) -> Reconciliation:
    g = lambda name: int(rollout.get(name, 0) or 0)
    episodes = g("episodes")
    by_status = {
        k[len("episodes_") :]: g(k) for k in rollout if k.startswith("episodes_") and k[len("episodes_") :] in STATUSES
    }
    dropped = {reason: g(counter) for reason, counter in DROP_COUNTERS.items() if g(counter)}
    dedup = sum(g(c) for c in DEDUP_COUNTERS)
    packed = g("trajectories_packed")
    dead_lettered = g("dead_letters") * group_size
    notices = accounting.dropped_by_pipeline
    remainders = {
        # requested - what the workers ran or refused; a request run twice shows up in dedup
        "not_yet_run": accounting.requested - episodes - dead_lettered + dedup,
        "in_runner_or_packer": episodes - packed - sum(dropped.values()) - dedup,
        "packed_not_received": packed - (accounting.received - accounting.foreign),
        **{
            f"{reason}_notices_not_received": n - notices.get(reason, 0)
            for reason, n in ({r: 0 for r in notices} | dropped).items()
        },
    }
    negative = {k: v for k, v in remainders.items() if v < 0}
    return Reconciliation(
        episodes=episodes,
        episodes_by_status=by_status,
        dropped=dropped,
        deduplicated=dedup,
        packed=packed,
        dead_lettered_requests=g("dead_letters"),
        bad_requests=g("bad_requests"),
        remainders=remainders,
        mismatch=negative,
        reconciled=not negative,
    )


def format_reconciliation(r: Reconciliation, accounting: Accounting) -> list[str]:
    rem = r.remainders
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(r.episodes_by_status.items())) or "none"
    drops = ", ".join(f"{k} {v}" for k, v in sorted(r.dropped.items())) or "none"
    lines = [
        f"requested {accounting.requested} = episodes the workers ended {r.episodes} ({statuses})"
        f" + in dead-lettered requests {r.dead_lettered_requests} request(s)"
        f" + not yet run {rem['not_yet_run']} (deduplicated {r.deduplicated} counted back)",
        f"episodes {r.episodes} = packed {r.packed} + dropped on purpose ({drops})"
        f" + deduplicated {r.deduplicated} + in the runner or packer {rem['in_runner_or_packer']}",
        f"packed {r.packed} = received by the learner {accounting.received - accounting.foreign}"
        f" + in Pub/Sub at the end {rem['packed_not_received']}",
    ]
    if r.bad_requests:
        lines.append(f"malformed requests dead-lettered by the workers: {r.bad_requests}")
    if not r.reconciled:
        lines.append("MISMATCH (rollout vs learner): " + ", ".join(f"{k} {v}" for k, v in r.mismatch.items()))
    return lines
