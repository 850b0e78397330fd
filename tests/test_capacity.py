"""The capacity planner's arithmetic on synthetic measurements (Little's law), the
learner's start-up warning, and synchronous rounds sized like the asynchronous steps."""

import json
import math
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.contracts.record_shape import RecordShape
from tests._learner_data import random_record
from trainer.learning.builder import read_plan, warn_if_short
from trainer.learning.capacity import Measurements, check_async, make_plan, predict_sync, shortfall_warning
from trainer.learning.data.batches import BatchBuffer
from trainer.learning.data.feeder import TrajectoryCredits
from trainer.learning.data.schedule import SyncSchedule
from trainer.learning.data.staleness import StalenessConfig, StalenessControl


def _m(**kw):
    base = dict(
        step_s=1.0,
        trajectories_per_record=8.0,
        batch_records=8,
        episode_s=4.0,
        pipeline_s=2.0,
        rollout_rate=1000.0,
        tokens_per_trajectory=100.0,
    )
    return Measurements(**{**base, **kw})


def test_rates_follow_from_the_measurements():
    m = _m()
    assert m.trajectories_per_step == 64 and m.learner_rate == 64.0 and m.latency_s == 6.0


def test_what_binds_is_the_smallest_rate():
    m = _m()
    plenty = check_async(m, max_in_flight=10_000, publish_every=2)
    assert plenty.binds == "learner" and plenty.duty_cycle == 1.0
    starved = check_async(m, max_in_flight=96, publish_every=2)  # 96 / 6 s = 16/s of the learner's 64
    assert starved.binds == "credits" and starved.rate == pytest.approx(16.0) and starved.duty_cycle == 0.25
    slow = check_async(_m(rollout_rate=32.0), max_in_flight=10_000, publish_every=2)
    assert slow.binds == "rollout compute" and slow.duty_cycle == 0.5
    few = check_async(m, max_in_flight=10_000, publish_every=2, concurrent_episodes=64)  # 64 / 4 s = 16/s
    assert few.binds == "engine concurrency" and few.duty_cycle == 0.25
    assert starved.tokens_per_s == pytest.approx(1600.0)


def test_staleness_in_versions_is_the_window_over_one_versions_trajectories():
    # 256 away, a version every 2 steps of 64: a trajectory is trained 2 versions after its request.
    assert check_async(_m(), 256, publish_every=2).staleness_versions == pytest.approx(2.0)


@given(
    step_s=st.floats(0.05, 5.0),
    per_record=st.floats(1.0, 16.0),
    episode_s=st.floats(0.01, 30.0),
    pipeline_s=st.floats(0.0, 5.0),
    rollout_rate=st.floats(0.5, 500.0),
    target=st.floats(0.1, 1.0),
    group=st.sampled_from([1, 4, 8, 16]),
    workers=st.sampled_from([None, 1, 3]),
    bound=st.sampled_from([1.0, 2.0, 100.0]),
)
def test_the_plan_reaches_the_target_or_says_what_stops_it(
    step_s, per_record, episode_s, pipeline_s, rollout_rate, target, group, workers, bound
):
    m = _m(
        step_s=step_s,
        trajectories_per_record=per_record,
        episode_s=episode_s,
        pipeline_s=pipeline_s,
        rollout_rate=rollout_rate,
    )
    plan = make_plan(
        m,
        target_duty=target,
        group_size=group,
        publish_every=2,
        min_window=group,
        workers=workers,
        staleness_bound=bound,
    )
    pred = plan.async_prediction
    reachable = min(target, plan.rollout_workers * rollout_rate / m.learner_rate)
    assert plan.max_in_flight % group == 0 and plan.max_in_flight >= group
    assert plan.max_staleness >= math.ceil(pred.staleness_versions)
    if pred.duty_cycle < reachable - 1e-9:  # short of what the rollout side allows: only the bound
        assert pred.binds == "staleness bound"
        assert pred.staleness_versions <= bound + 1e-9 or plan.max_in_flight == group  # or the floor
    elif workers is None:  # a sized pool reaches the target
        assert pred.duty_cycle >= target - 1e-9
    # No more in flight than Little's law and one batch of headroom need (plus rounding).
    rate = min(target * m.learner_rate, plan.rollout_workers * rollout_rate)
    assert plan.max_in_flight <= max(group, math.ceil(rate * m.latency_s + m.trajectories_per_step)) + group


def test_a_long_latency_meets_the_staleness_bound_first():
    # 64 trajectories a step, a version every 2 steps: a mean lag of 2 versions is 256 away;
    # keeping the learner busy through 30 s in flight would need ~1,900.
    plan = make_plan(_m(episode_s=28.0), target_duty=0.95, group_size=8, publish_every=2, min_window=72)
    assert plan.max_in_flight == 256 and plan.async_prediction.binds == "staleness bound"
    assert plan.async_prediction.staleness_versions == pytest.approx(2.0) and plan.max_staleness == 3
    loose = make_plan(
        _m(episode_s=28.0), target_duty=0.95, group_size=8, publish_every=2, min_window=72, staleness_bound=100
    )
    assert loose.async_prediction.duty_cycle >= 0.95 and loose.max_in_flight > 1800  # sized for the target


def test_sync_pays_the_latency_every_round():
    m = _m(rollout_rate=1000.0)
    s = predict_sync(m, steps_per_round=2, group_size=8)
    # collect: the slowest episode (4 s) + pipeline (2 s); train: 2 steps of 1 s.
    assert s.limits == {"collect_s": 6.0, "train_s": 2.0} and s.duty_cycle == pytest.approx(0.25)
    tail = predict_sync(_m(slowest_episode_s=12.0), 2, 8)
    assert tail.duty_cycle == pytest.approx(2 / 16)  # a heavy tail: the round waits for its slowest
    bound = predict_sync(_m(rollout_rate=16.0), 2, 8)  # 128 trajectories at 16/s: 8 s + 2 s
    assert bound.limits["collect_s"] == pytest.approx(10.0)


def test_measurements_refuse_nonsense():
    with pytest.raises(ValueError, match="step_s"):
        _m(step_s=0)
    with pytest.raises(ValueError, match="rollout_rate"):
        _m(rollout_rate=float("nan"))
    with pytest.raises(ValueError, match="batch_records"):
        _m(batch_records=0)
    with pytest.raises(ValueError, match="target_duty"):
        make_plan(_m(), target_duty=1.5, group_size=8, publish_every=2, min_window=8)


def test_warning_names_the_bound_and_the_fix():
    m = _m()
    assert shortfall_warning(m, 10_000, 2, 0.9) is None
    msg = shortfall_warning(m, 96, 2, 0.9)
    assert "predicted 0.25" in msg and "bound by credits" in msg and "--max_in_flight" in msg
    assert "rollout workers" in shortfall_warning(_m(rollout_rate=8.0), 10_000, 2, 0.9)
    # A window the staleness bound set (256 = 2 versions of 64 x 2 steps) is named as such.
    assert "bound by staleness bound" in shortfall_warning(_m(episode_s=28.0), 256, 2, 0.9, staleness_bound=2.0)
    assert "bound by credits" in shortfall_warning(_m(episode_s=28.0), 96, 2, 0.9, staleness_bound=2.0)


def test_the_learner_warns_at_start_when_its_window_is_short(tmp_path, caplog):
    m = _m()
    plan = {"measurements": m.__dict__, "plan": {"target_duty": 0.9}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    plan = read_plan(str(tmp_path / "plan.json"))
    with caplog.at_level("WARNING", logger="trainer"):
        assert "bound by credits" in warn_if_short(plan, TrajectoryCredits(96), publish_every=2)
    assert "cannot keep the learner" in caplog.text
    assert warn_if_short(plan, TrajectoryCredits(10_000), publish_every=2) is None
    assert warn_if_short(read_plan(None), TrajectoryCredits(8), publish_every=2) is None


def _record(i, n_traj):
    rec = random_record(i, rows=2, seq_len=64)
    rec.policy_versions[rec.loss_mask == 1] = 0
    rec.trajectories = rec.trajectories[:1] * n_traj  # only the count matters here
    return rec


def test_sync_rounds_are_sized_from_the_packing_seen_so_far():
    # 2 steps of 2 records: at most 2 rows x 2 segments = 4 trajectories a record -> 16.
    credits, stop = TrajectoryCredits(16, rounds=True), threading.Event()
    buffer = BatchBuffer((RecordShape(2, 64, 2),), 2, StalenessControl(StalenessConfig(0)))
    schedule = SyncSchedule(buffer, credits, 2, round_timeout_s=60.0, group_size=2, per_record=3.0)
    assert schedule.round_sizes == [12]  # the plan's 3 a record: 2 x 2 x 3
    assert credits.acquire(12, stop) and credits.round_requested()
    for i in range(6):  # they packed 2 a record: six records, more than 2 steps of 2 hold
        buffer.add(_record(i, 2), 0)
    credits.release(12)
    trained = []
    while batch := schedule.next_batch(0):
        trained.append(batch)
    assert len(trained) == 3 and schedule.summary().extra_steps == 1
    schedule.next_round()
    # 2 a record from now on, one record of room kept for a part-full flush: (2 x 2 - 1) x 2.
    assert schedule.round_sizes[-1] == 6


def test_a_floor_of_part_of_a_group_rounds_the_window_up_to_whole_groups():
    # The credit floor (one batch + one group) need not be a multiple of the group size.
    plan = make_plan(_m(episode_s=0.01), target_duty=0.5, group_size=8, publish_every=2, min_window=1001)
    assert plan.max_in_flight == 1008
