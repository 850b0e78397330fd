"""The planner's default staleness bound comes from the staleness sweep's measurements, and
the plan says why (localstack/launch/staleness_evidence.py). No processes."""

from __future__ import annotations

from core import config
from localstack.launch import plan as planner
from localstack.launch import staleness_evidence as evidence
from localstack.launch.staleness_evidence import Sweep


def test_the_default_is_the_bound_fastest_to_target_not_the_loosest(monkeypatch):
    sweep = Sweep(0.6, {1.0: 90.0, 2.0: 60.0, 4.0: 75.0}, {1.0: 1.0, 2.0: 2.0, 4.0: 3.0}, 120.0, 3, "2026-12-05")
    monkeypatch.setattr(evidence, "SWEEPS", {"fixed:2": sweep})
    bound, why = evidence.default_bound("fixed:2")
    assert bound == 2.0  # bound 4 keeps the learner busier, but reached the target later
    assert why.startswith("bound 2: the mean lag at which bound 2 ran, fastest to held-out 0.6 at fixed:2")
    assert "60 s from v0 (mean of 3 seeds; bound 1 90 s, bound 4 75 s, sync 120 s" in why


def test_a_latency_the_sweep_did_not_measure_keeps_the_fallback_and_says_so(monkeypatch):
    monkeypatch.setattr(evidence, "SWEEPS", {"fixed:2": Sweep(0.6, {1.0: 9.0}, {1.0: 1.0}, None, 3, "x")})
    bound, why = evidence.default_bound("fixed:0.5")
    assert bound == evidence.FALLBACK_BOUND
    assert "did not run at fixed:0.5 (it ran at: fixed:2)" in why


def test_the_bound_planned_is_the_lag_the_winner_ran_at_not_its_nominal_bound(monkeypatch):
    """A faster rollout side fills a nominal bound the sweep's machine never reached."""
    sweep = Sweep(0.9, {2.0: 57.0, 4.0: 54.0}, {2.0: 1.1, 4.0: 2.4}, 74.0, 3, "x")
    monkeypatch.setattr(evidence, "SWEEPS", {"fixed:2": sweep})
    bound, why = evidence.default_bound("fixed:2")
    assert bound == 2.4 and why.startswith("bound 2.4: the mean lag at which bound 4 ran")


def test_every_recorded_sweep_names_its_threshold_and_bounds():
    for latency, sweep in evidence.SWEEPS.items():
        assert 0 < sweep.threshold <= 1 and sweep.seconds and sweep.seeds >= 1, latency
        assert sweep.lag.keys() == sweep.seconds.keys() and all(0 < lag <= b for b, lag in sweep.lag.items())
    # What the sweep measured at 2 s tools: bound 4 reached 0.9 first (at a mean lag of 2.4),
    # then bound 2, then sync.
    bound, why = evidence.default_bound("fixed:2")
    assert bound == 2.4 and why.endswith("bound 2 57 s, sync 74 s; 2026-12-05, 2 vCPUs, docs/BENCHMARKS.md)")
    # And at the demo's 0.5 s: bound 4 again (44 s; bound 2 50 s, sync 70 s), at a lag of 1.16.
    bound, why = evidence.default_bound("fixed:0.5")
    assert (
        bound == 1.16
        and "44 s from v0" in why
        and why.endswith("bound 2 50 s, sync 70 s; 2026-12-06, 2 vCPUs, docs/BENCHMARKS.md)")
    )


def test_the_plan_prints_the_bound_it_used_and_why():
    result = {
        "env": "calculator",
        "tool_latency": "fixed:2",
        "rollout_rate_source": "measured",
        "learner_rate": 10.0,
        "measurements": {"episode_s": 5.0, "pipeline_s": 1.0, "tokens_per_trajectory": 90, "step_s": 0.4}
        | {"trajectories_per_record": 12.0, "rollout_rate": 20.0},
        "measured": {"learner": {"fill": 0.8}},
        "plan": {"max_in_flight": 152, "max_staleness": 3, "rollout_workers": 1, "max_concurrent_groups": 5}
        | {"engine_slots": 40, "sync_round_trajectories": 80, "staleness_bound": 4.0, "staleness_bound_why": "why"},
        "predicted": {
            "async": {"duty_cycle": 0.3, "binds": "credits", "limits": {"credits": 3.0}},
            "sync": {"duty_cycle": 0.1, "limits": {"collect_s": 6.0, "train_s": 0.8}},
        },
    }
    assert "staleness: why" in planner.describe(result)
    given = config.parse(planner.PlanConfig, ["--staleness_bound=4"])
    assert given.staleness_bound == 4.0 and config.parse(planner.PlanConfig, []).staleness_bound is None
