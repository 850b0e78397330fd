"""benchmarks/staleness.py's pure parts: re-planning a measured plan for another staleness
bound, and reading a held-out curve at a time. No processes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _staleness_report as report
import staleness

from core import config
from localstack.launch.demo_config import DemoConfig
from localstack.launch.plan import PlanConfig
from trainer.learning.capacity import Measurements
from trainer.learning.data.feeder import CreditConfig, CreditWindow


def base_plan(m: Measurements) -> dict:
    """A plan in the planner's format at its default bound, as `localstack.launch.plan` writes it."""
    return {"measurements": m.__dict__, "plan": {"target_duty": 0.95, "rollout_workers": 1}}


measurements = st.builds(
    Measurements,
    step_s=st.floats(0.1, 5),
    trajectories_per_record=st.floats(1, 16),
    batch_records=st.integers(1, 8),
    episode_s=st.floats(0.5, 30),
    pipeline_s=st.floats(0, 5),
    rollout_rate=st.floats(1, 200),
    tokens_per_trajectory=st.floats(10, 500),
)


@settings(max_examples=60, deadline=None)
@given(m=measurements)
def test_a_looser_bound_never_plans_fewer_in_flight_nor_a_tighter_drop_rule(m, tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    plans = [json.loads(staleness.replan(base_plan(m), b, 2, d / f"{b}.json").read_text()) for b in (1.0, 2.0, 4.0)]
    windows = [p["plan"]["max_in_flight"] for p in plans]
    drops = [p["plan"]["max_staleness"] for p in plans]
    assert windows == sorted(windows) and drops == sorted(drops)
    for p, bound in zip(plans, (1.0, 2.0, 4.0)):
        assert p["plan"]["staleness_bound"] == bound
        # What the demo hands the learner and the rollout job is the re-planned window.
        assert f"--max_in_flight={p['plan']['max_in_flight']}" in p["learner_flags"]
        assert f"--max_staleness={p['plan']['max_staleness']}" in p["learner_flags"]
        # The predicted mean lag stays within the bound, or the window is at the credits' own
        # deadlock floor (the smallest window the learner accepts), which forces more.
        if p["predicted"]["async"]["staleness_versions"] > bound + 1e-9:
            assert p["plan"]["max_in_flight"] == deadlock_floor(m), (p["plan"], p["predicted"])


def deadlock_floor(m: Measurements) -> int:
    """The learner's smallest window for the planner's layout, in whole groups."""
    layout = config.build(PlanConfig).layout.layout
    credits = CreditWindow(
        CreditConfig(max_batches_ahead=0, group_size=DemoConfig.group_size), m.batch_records, layout.largest
    )
    return math.ceil(credits.min_window / DemoConfig.group_size) * DemoConfig.group_size


def test_the_curve_at_a_time_is_the_newest_version_published_by_then():
    held = [{"rl_s": 0.0, "success": 0.5}, {"rl_s": 10.0, "success": 0.7}, {"rl_s": 25.0, "success": 0.9}]
    assert report._held_at(held, -1.0) is None
    assert [report._held_at(held, t) for t in (0.0, 9.9, 10.0, 24.0, 99.0)] == [0.5, 0.5, 0.7, 0.7, 0.9]


def test_the_averaged_crossing_is_not_won_by_one_lucky_evaluation():
    # Scored every 2 s: one evaluation at 0.9 among 0.6s; a steady 0.9 only from 40 s.
    often = [{"rl_s": float(t), "success": 0.9 if t == 10 or t >= 40 else 0.6} for t in range(0, 80, 2)]
    assert report.first_at(often, 0.85)["rl_s"] == 10.0
    assert 40 < report.averaged_at(often, 0.85, 10.0) <= 50  # the average of the last 10 s gets there after 40
    assert report.averaged_at(often, 0.95, 10.0) is None
    assert report.averaged_at([], 0.5, 10.0) is None


def test_the_table_gives_each_seeds_time_as_a_share_of_the_same_seeds_sync_time(capsys):
    def held(*points):
        return [{"version": v, "rl_s": t, "success": x} for v, (t, x) in enumerate(points)]

    runs = [
        {"setting": "sync", "seed": 0, "held_out": held((0, 0.2), (50, 0.5), (100, 0.6))},
        {"setting": "sync", "seed": 1, "held_out": held((0, 0.2), (40, 0.5), (80, 0.55))},
        {"setting": "bound2", "seed": 0, "held_out": held((0, 0.2), (10, 0.3), (25, 0.5), (60, 0.6))},
        {"setting": "bound2", "seed": 1, "held_out": held((0, 0.2), (10, 0.45), (30, 0.49))},
    ]
    for r in runs:
        r.update(wall_s=100.0, versions=2, held_out_first=0.2, held_out_last=0.5, tokens_per_s=1.0, duty=0.1)
        r.update(mean_staleness=1.0, max_staleness=2, dropped_stale=0, importance_weight_mean=1.0, clipfrac=0.0)
        r.update(approx_kl=0.0, reward_tracking_r=None)
    report.print_tables("fixed:2", {"runs": runs}, (0.5, 0.6))
    rows = [line for line in capsys.readouterr().out.splitlines() if "bound2" in line]
    at_half, at_six = rows[0], rows[1]
    # 0.5: seed 0 at v2 after 25 s (sync 50 s: 0.50); seed 1 never.
    assert "25 [25-25], 1 of 2 not reached" in at_half and "0.50" in at_half
    # 0.6: seed 0 after 60 s against sync's 100 s; sync seed 1 never reached it: no ratio.
    assert "60 [60-60], 1 of 2 not reached" in at_six and "0.60" in at_six


def test_each_run_starts_from_the_environments_recipe_and_the_sweeps_settings_win():
    from core import config

    args = config.parse(staleness.StalenessConfig, ["--env=guess", "--demo_flags=--learner.lr_decay=0"])
    recipe = staleness.demo_config(args, batch_records=None, warmstart_steps=None)
    assert recipe.env.name == "guess" and recipe.batch_records == 8 and recipe.warmstart.steps == 600
    in_flight, lr_decay = ("learner", "credits", "max_in_flight"), ("learner", "learner", "lr_decay")
    assert config.get(recipe, in_flight) == 136 and config.get(recipe, lr_decay) == 0  # recipe, then --demo_flags
    ours = staleness.demo_config(args, batch_records=4, **{"learner.max_in_flight": 312})
    assert ours.batch_records == 4 and config.get(ours, in_flight) == 312
    calculator = staleness.demo_config(config.parse(staleness.StalenessConfig, []), batch_records=None)
    assert calculator.env.name == "calculator" and calculator.batch_records == 4


def test_the_overlap_bound_comes_from_the_sync_runs_own_split_of_its_time():
    steps = [{"perf/wall_s": w, "perf/step_s": 2.0} for w in (10.0, 20.0, 30.0, 40.0)]
    assert report.split_time(steps) == (24.0, 6.0)  # 30 s between first and last step, 3 steps of 2 s
    assert report.overlap_bound(24.0, 6.0) == 0.8  # rollouts 4x the steps: overlap hides only the steps
    assert report.overlap_bound(10.0, 10.0) == 0.5
    assert report.split_time(steps[:1]) == (None, None) and report.overlap_bound(None, 1.0) is None

    def at(held):
        return held[0]["t"] if held else None

    runs = [{"setting": "bound2", "seed": 0}, {"setting": "bound2", "seed": 1}, {"setting": "bound2", "seed": 2}]
    sync = {0: [{"t": 100.0}], 1: [{"t": 50.0}]}
    bound, efficiency = report._against_bound(runs, [80.0, 50.0, 10.0], sync, at, {0: 0.8, 1: 0.6})
    # seed 0 took 0.80 of its sync time against a bound of 0.80 (efficiency 1.00); seed 1
    # took all of it (0.60); seed 2 has no sync run to compare with.
    assert bound == "0.80, 0.60" and efficiency == "1.00, 0.60"
