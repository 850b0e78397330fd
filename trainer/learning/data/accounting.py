"""Where every trajectory the learner asked for ended up, as two balances that must close:

    requested = received + dropped by the pipeline (drop notices, by reason)
                + written off (a request timed out, or a sync round)
                + still in flight at the end
                - late (came back after their request was written off)
                - foreign (requested before a restart, by the learner's previous life)
    received  = trained + dropped as stale + still buffered at the end

"In flight" is the feeder's credit count: requested and neither received nor reported
dropped. It includes requests the rollout job dead-lettered (the rollout side counts those,
`rollout/dead_letters`) and whatever is still in Pub/Sub or a worker when the run stops.
"Requested" counts redone requests too: a written-off request asked again is a new one.
A balance that does not close is reported, never rounded away: `unexplained_*` != 0.
"""

from __future__ import annotations

from core.contracts.run_summary import Accounting


def trajectory_accounting(
    *,
    requested: int,
    received: int,
    trained: int,
    dropped_stale: int,
    buffered: int,
    dropped_by_pipeline: dict[str, int],
    written_off: int,
    in_flight: int,
    late: int = 0,
    foreign: int = 0,
) -> Accounting:
    dropped = sum(dropped_by_pipeline.values())
    unexplained_requested = requested - (received + dropped + written_off + in_flight - late - foreign)
    unexplained_received = received - (trained + dropped_stale + buffered)
    return Accounting(
        requested=requested,
        received=received,
        trained=trained,
        dropped_stale=dropped_stale,
        buffered_at_end=buffered,
        dropped_by_pipeline=dict(dropped_by_pipeline),
        written_off=written_off,
        in_flight_at_end=in_flight,
        late=late,
        foreign=foreign,
        unexplained_requested=unexplained_requested,
        unexplained_received=unexplained_received,
        balanced=unexplained_requested == 0 and unexplained_received == 0,
    )


def format_accounting(a: Accounting) -> list[str]:
    drops = ", ".join(f"{k} {v}" for k, v in sorted(a.dropped_by_pipeline.items())) or "none"
    lines = [
        f"requested {a.requested} = received {a.received} + dropped by the pipeline ({drops})"
        f" + written off {a.written_off} + in flight at the end {a.in_flight_at_end}"
        f" - late {a.late} - from before a restart {a.foreign}",
        f"received {a.received} = trained {a.trained} + dropped stale {a.dropped_stale}"
        f" + buffered at the end {a.buffered_at_end}",
    ]
    if not a.balanced:
        lines.append(
            f"MISMATCH: {a.unexplained_requested} requested and {a.unexplained_received} received"
            " trajectories are not accounted for"
        )
    return lines
