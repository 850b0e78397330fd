"""Capacity arithmetic: what keeps the learner busy, by Little's law (in flight = rate x time).

Pure functions on measured numbers, no JAX: `localstack.launch.plan` measures and writes a plan
with them, the learner checks its credit window against one at start (`check_async`), and
tests drive them with synthetic measurements. Rates are trajectories per second.

- The learner consumes `learner_rate` = trajectories per step / step time at duty cycle 1.
- A trajectory is in flight from its request to the learner receiving its record:
  `latency_s` = episode (generation + tool waits) + pipeline (packer wait, transport).
- The asynchronous system runs at the smallest of four rates: the learner's, the rollout
  side's ceiling, the credit window / latency, and the episodes the engines may run at once
  / episode time. Its duty cycle is that rate / learner_rate; the smallest one *binds*.
- The synchronous baseline alternates: collect one round (its slowest episode and the
  rollout side's throughput bound the wait), then train on it. Its duty cycle is train time
  / (collect + train): the latency is never hidden.
"""

from __future__ import annotations

import dataclasses
import math

from core.config import configclass, derived

BINDS = ("learner", "rollout compute", "credits", "engine concurrency", "staleness bound")


@configclass(kw_only=True)
class Measurements:
    step_s: float = derived(help="one learner step of batch_records records, on the learner's hardware", gt=0)
    trajectories_per_record: float = derived(help="how many the packer fits, for the environment's lengths", gt=0)
    batch_records: int = derived(help="records per step", ge=1)
    episode_s: float = derived(help="one episode's wall time: generation + tool waits (mean)", gt=0)
    pipeline_s: float = derived(help="finished episode -> record at the learner (packer wait, transport)", ge=0)
    rollout_rate: float = derived(help="trajectories/s the rollout side makes when never short of requests", gt=0)
    tokens_per_trajectory: float = derived(0.0, "non-pad tokens, for tokens/s", ge=0)
    slowest_episode_s: float | None = derived(None, "expected slowest of one sync round (heavy tails)", gt=0)

    @property
    def trajectories_per_step(self) -> float:
        return self.batch_records * self.trajectories_per_record

    @property
    def learner_rate(self) -> float:
        return self.trajectories_per_step / self.step_s

    @property
    def latency_s(self) -> float:
        return self.episode_s + self.pipeline_s


@dataclasses.dataclass(frozen=True)
class Prediction:
    duty_cycle: float
    rate: float  # trajectories/s trained
    binds: str  # one of BINDS (async) or "latency" (sync)
    limits: dict[str, float]  # each bound, trajectories/s
    tokens_per_s: float = 0.0
    staleness_versions: float = 0.0  # mean versions between request and training (async)


def check_async(
    m: Measurements, max_in_flight: int, publish_every: int, concurrent_episodes: int | None = None
) -> Prediction:
    """The duty cycle these settings can reach, and what binds it."""
    limits = {
        "learner": m.learner_rate,
        "rollout compute": m.rollout_rate,
        # A window of W trajectories, each away for latency_s (credits return on receipt),
        # brings back W / latency_s per second.
        "credits": max_in_flight / m.latency_s,
    }
    if concurrent_episodes is not None:
        limits["engine concurrency"] = concurrent_episodes / m.episode_s
    binds = min(limits, key=lambda k: (limits[k], BINDS.index(k)))
    rate = limits[binds]
    return Prediction(
        duty_cycle=min(1.0, rate / m.learner_rate),
        rate=rate,
        binds=binds,
        limits=limits,
        tokens_per_s=rate * m.tokens_per_trajectory,
        # Little's law again: a trajectory is out W / rate seconds; a version lasts
        # publish_every steps of trajectories_per_step at that rate.
        staleness_versions=max_in_flight / (publish_every * m.trajectories_per_step),
    )


def predict_sync(m: Measurements, steps_per_round: int, group_size: int) -> Prediction:
    """One round: request it, wait for all of it, train steps_per_round steps, publish."""
    n = round_trajectories(m, steps_per_round, group_size)
    slowest = m.slowest_episode_s if m.slowest_episode_s is not None else m.episode_s
    # All of the round starts at once; it ends when its slowest episode ends, or when the
    # rollout side has produced all n, whichever is later; then the records travel.
    collect = max(slowest, n / m.rollout_rate) + m.pipeline_s
    train = steps_per_round * m.step_s
    duty = train / (collect + train)
    rate = n / (collect + train)
    return Prediction(
        duty_cycle=duty,
        rate=rate,
        binds="latency",
        limits={"collect_s": collect, "train_s": train},
        tokens_per_s=rate * m.tokens_per_trajectory,
    )


def round_trajectories(m: Measurements, steps_per_round: int, group_size: int) -> int:
    """Trajectories that fill steps_per_round batches, in whole groups (at least one)."""
    return max(1, round(steps_per_round * m.trajectories_per_step / group_size)) * group_size


@dataclasses.dataclass(frozen=True)
class Plan:
    target_duty: float
    max_in_flight: int
    max_staleness: int
    rollout_workers: int
    max_concurrent_groups: int  # per rollout worker: request groups running at once
    engine_slots: int  # per rollout worker
    async_prediction: Prediction
    sync_prediction: Prediction
    sync_round_trajectories: int
    target_lag: float  # the mean lag the learner's closed loop holds (the staleness bound)

    def learner_flags(self) -> list[str]:
        """The window is where the loop starts; the lag it must hold is the plan's answer."""
        return [
            f"--max_in_flight={self.max_in_flight}",
            f"--max_staleness={self.max_staleness}",
            f"--lag_target={self.target_lag:g}",
        ]

    def pipeline_flags(self) -> list[str]:
        return [f"--max_concurrent_groups={self.max_concurrent_groups}", f"--engine_slots={self.engine_slots}"]


def make_plan(
    m: Measurements,
    *,
    target_duty: float,
    group_size: int,
    publish_every: int,
    min_window: int,
    workers: int | None = None,
    max_slots_per_worker: int = 64,
    staleness_bound: float = 2.0,
) -> Plan:
    """Settings that keep the learner at target_duty where the rollout side can, else as
    busy as it allows, with no more in flight than that needs (more would only add
    staleness). m.rollout_rate is one worker's; workers=None sizes the pool (a cloud job),
    an int fixes it (the local stack has one). min_window: the credit object's deadlock floor.
    staleness_bound: the mean versions a trajectory may lag; the window never holds more
    (an overestimated rollout rate would otherwise buy throughput with off-policy data)."""
    if not 0 < target_duty <= 1:
        raise ValueError(f"target_duty must be in (0, 1], got {target_duty}")
    want = target_duty * m.learner_rate
    n_workers = workers if workers is not None else max(1, math.ceil(want / m.rollout_rate))
    rate = min(want, n_workers * m.rollout_rate)
    # Credits: what is away for latency_s at that rate (Little), plus one batch of headroom
    # for the spread of latencies and bundle sizes; whole groups, never below the floor.
    need = math.ceil(rate * m.latency_s + m.trajectories_per_step)
    cap = math.floor(staleness_bound * publish_every * m.trajectories_per_step / group_size) * group_size
    # The floor is rounded up too: a window of part of a group leaves that part unusable.
    window = math.ceil(max(min_window, min(need, cap)) / group_size) * group_size
    # Episodes running at once per worker (Little on the episode alone) for the target
    # rate, not the capped one: a rollout ceiling is measured at these settings, and
    # concurrency beyond what the engine can serve costs little. Whole groups, one spare
    # so a finishing group never stalls the next.
    groups = math.ceil(want / n_workers * m.episode_s / group_size) + 1
    slots = min(max_slots_per_worker, groups * group_size)
    concurrency = n_workers * groups * group_size
    pred = check_async(
        dataclasses.replace(m, rollout_rate=n_workers * m.rollout_rate), window, publish_every, concurrency
    )
    if pred.binds == "credits" and cap < need:  # the window is short because of the bound
        pred = dataclasses.replace(pred, binds="staleness bound")
    return Plan(
        target_duty=target_duty,
        max_in_flight=window,
        # The mean, plus the spread; at least the target's (the loop may grow the window to it).
        max_staleness=math.ceil(max(pred.staleness_versions, staleness_bound)) + 1,
        rollout_workers=n_workers,
        max_concurrent_groups=groups,
        engine_slots=slots,
        async_prediction=pred,
        sync_prediction=predict_sync(
            dataclasses.replace(m, rollout_rate=n_workers * m.rollout_rate), publish_every, group_size
        ),
        sync_round_trajectories=round_trajectories(m, publish_every, group_size),
        target_lag=staleness_bound,
    )


def shortfall_warning(
    m: Measurements, max_in_flight: int, publish_every: int, target_duty: float, staleness_bound: float | None = None
) -> str | None:
    """None if the settings can reach target_duty; else a sentence saying what binds."""
    pred = check_async(m, max_in_flight, publish_every)
    if pred.duty_cycle + 1e-9 >= target_duty:
        return None
    if pred.binds == "credits" and staleness_bound is not None and pred.staleness_versions >= staleness_bound - 0.25:
        pred = dataclasses.replace(pred, binds="staleness bound")  # the window is where the bound put it
    need = math.ceil(target_duty * m.learner_rate * m.latency_s + m.trajectories_per_step)
    hint = {
        "credits": f"raise --max_in_flight to about {need}",
        "staleness bound": f"raise --max_in_flight to about {need} (and the staleness bound)",
        "rollout compute": "add rollout workers or engine throughput",
        "learner": "nothing: the learner is the bottleneck",
    }[pred.binds]
    return (
        f"these settings cannot keep the learner at duty cycle {target_duty:.2f}: predicted "
        f"{pred.duty_cycle:.2f}, bound by {pred.binds} ({pred.rate:.1f} trajectories/s "
        f"against the learner's {m.learner_rate:.1f}/s at {m.latency_s:.2f} s in flight); {hint}"
    )
