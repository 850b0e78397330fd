"""The synchronous baseline's rounds: credits that stop after one round, a schedule that
trains on all of a round and nothing else, padding that never trains a record twice."""

import threading

from hypothesis import given
from hypothesis import strategies as st

from core.contracts.record_shape import RecordShape
from tests._learner_data import random_record
from trainer.learning.data.batches import BatchBuffer
from trainer.learning.data.feeder import CreditConfig, CreditWindow, TrajectoryCredits
from trainer.learning.data.schedule import PADDING_ID, AsyncSchedule, SyncSchedule, padding_record, split_round
from trainer.learning.data.staleness import StalenessConfig, StalenessControl

SHAPE = RecordShape(rows=4, seq_len=256, max_segments_per_row=2)


def test_sync_window_is_one_round_of_whole_groups():
    cfg = CreditWindow(CreditConfig(max_batches_ahead=3, group_size=8), 8, SHAPE, sync=True, steps_per_round=2)
    assert cfg.window == 2 * 8 * 8  # max_batches_ahead plays no part
    odd = CreditWindow(CreditConfig(max_batches_ahead=0, group_size=3), 1, SHAPE, sync=True, steps_per_round=1)
    assert odd.window == 9  # 8 rounded up to whole groups of 3


def test_round_credits_block_after_one_round_until_it_is_opened_again():
    credits, stop = TrajectoryCredits(8, rounds=True), threading.Event()
    assert credits.acquire(4, stop) and credits.acquire(4, stop)
    assert credits.round_requested() and not credits.round_complete()
    credits.release(8)
    assert credits.round_complete()
    stop.set()  # everything is back, yet a new round may not start before open_round
    assert not credits.acquire(4, stop)
    stop.clear()
    credits.open_round()
    assert not credits.round_complete() and credits.acquire(4, stop)


def _records(n, version=3, seed=0):
    out = []
    for i in range(n):
        rec = random_record(seed * 1000 + i, rows=2, seq_len=64)
        rec.policy_versions[rec.loss_mask == 1] = version
        out.append(rec)
    return out


@given(n=st.integers(1, 40), batch=st.integers(1, 8), steps=st.integers(1, 4))
def test_split_round_trains_every_record_exactly_once(n, batch, steps):
    recs = _records(n)
    batches = split_round(recs, batch, steps)
    assert all(len(b) == batch for b in batches)
    assert len(batches) == min(n, max(steps, -(-n // batch)))  # fewer records than steps: one each
    real = [r.record_id for b in batches for r in b if r.record_id != PADDING_ID]
    assert sorted(real) == sorted(r.record_id for r in recs)


def test_padding_record_carries_no_loss_and_no_trajectory():
    pad = padding_record((4, 256))
    assert pad.shape == (4, 256) and pad.num_tokens == 0 and pad.num_loss_tokens == 0 and pad.trajectories == []


def _sync(credits, batch_records=2, steps=2):
    staleness = StalenessControl(StalenessConfig(0))
    buffer = BatchBuffer((RecordShape(2, 64, 2),), batch_records, staleness)
    return buffer, SyncSchedule(buffer, credits, steps, round_timeout_s=60.0)


def test_sync_schedule_waits_for_the_whole_round_then_trains_it_all():
    credits, stop = TrajectoryCredits(12, rounds=True), threading.Event()
    buffer, schedule = _sync(credits)
    for _ in range(3):
        credits.acquire(4, stop)
    recs = _records(3, version=0)
    for r in recs[:2]:
        buffer.add(r, 0)
    credits.release(8)
    assert schedule.next_batch(0) is None  # 4 trajectories still out: no step yet
    buffer.add(recs[2], 0)
    credits.release(4)
    trained = []
    while batch := schedule.next_batch(0):
        trained.append(batch)
        if schedule.publish_due(len(trained)):
            schedule.next_round()
    assert len(trained) == 2  # steps_per_round, the 3 records spread over them
    assert sorted(r.record_id for b in trained for r in b if r.trajectories) == sorted(r.record_id for r in recs)
    assert schedule.summary().padding_records == 1 and schedule.summary().rounds == 1
    assert credits.acquire(4, stop)  # the next round is open


def test_sync_round_that_never_completes_times_out_and_counts_the_lost():
    credits, stop = TrajectoryCredits(8, rounds=True), threading.Event()
    now = [0.0]
    buffer = BatchBuffer((RecordShape(2, 64, 2),), 1, StalenessControl(StalenessConfig(0)))
    schedule = SyncSchedule(buffer, credits, 1, round_timeout_s=10.0, clock=lambda: now[0])
    credits.acquire(8, stop)
    buffer.add(_records(1, version=0)[0], 0)
    credits.release(4)
    assert schedule.next_batch(0) is None
    now[0] = 11.0
    assert schedule.next_batch(0) is not None
    assert schedule.summary().lost_trajectories == 4 and schedule.summary().timed_out_rounds == 1


def test_async_schedule_publishes_every_n_steps():
    buffer = BatchBuffer((RecordShape(2, 64, 2),), 1, StalenessControl(StalenessConfig(2)))
    schedule = AsyncSchedule(buffer, publish_every=3)
    assert [schedule.publish_due(s) for s in range(1, 7)] == [False, False, True, False, False, True]
    buffer.add(_records(1)[0], 3)
    assert schedule.next_batch(3) is not None and schedule.next_batch(3) is None


def test_a_round_filtered_out_entirely_is_asked_again_without_a_new_version():
    credits, stop = TrajectoryCredits(8, rounds=True), threading.Event()
    _, schedule = _sync(credits)
    assert credits.acquire(8, stop)
    credits.release(8)  # every trajectory came back as a drop notice: no record
    assert schedule.next_batch(0) is None
    assert schedule.summary().rounds == 0  # nothing was published
    assert credits.acquire(8, stop)  # the same version's round is open again
