"""The learner's data plane on its own: it polls when no batch is ready, returns a record's
credits, asks the feeder to redo timed-out requests, counts a sync round's untrained
batches as buffered, and closes its trajectory balances."""

import dataclasses
import threading

from core.contracts.record_shape import RecordLayout
from tests._learner_data import random_record
from trainer.learning.data.batches import BatchBuffer
from trainer.learning.data.data_plane import DataPlane
from trainer.learning.data.deliveries import Deliveries, DeliveryConfig
from trainer.learning.data.feeder import TrajectoryCredits
from trainer.learning.data.schedule import AsyncSchedule, SyncSchedule
from trainer.learning.data.staleness import StalenessConfig, StalenessControl
from trainer.learning.run_stats import RunStats

LAYOUT = RecordLayout((64,), rows=2, max_segments_per_row=3)
GROUP = 2


def _record(i: int):
    """A record whose trajectories are those of requests req-<i>-*, GROUP per request."""
    rec = random_record(i, rows=2, seq_len=64)
    ids = [f"req-{i}-{k // GROUP}/{k % GROUP}" for k in range(len(rec.trajectories))]
    rec.trajectories = [dataclasses.replace(t, trajectory_id=tid) for t, tid in zip(rec.trajectories, ids)]
    return rec


class FakeConsumer:
    def __init__(self):
        self.inbox, self.settled, self.polls = [], [], 0
        self.deliveries = Deliveries(DeliveryConfig())
        self.rejected = self.duplicates = self.pubsub_errors = 0
        self.dropped_trajectories: dict[str, int] = {}

    def poll(self, max_messages, timeout_s):
        self.polls += 1
        out, self.inbox = self.inbox, []
        return out

    def settle(self, records):
        self.settled += [r.record_id for r in records]

    def take_dropped(self):
        return []

    def checkpoint_ids(self, version, step):
        return dict.fromkeys(self.settled, version)


class FakeFeeder:
    published = start_position = redone = publish_errors = 0
    error = None
    redos = 0

    def redo_timed_out(self):
        self.redos += 1
        return 0


def _plane(credits, schedule_of, feeder=None):
    staleness = StalenessControl(StalenessConfig(2))
    consumer = FakeConsumer()
    batches = BatchBuffer(LAYOUT.shapes, 1, staleness, on_dropped=consumer.settle)
    schedule = schedule_of(batches)
    return DataPlane(LAYOUT, GROUP, staleness, credits, consumer, batches, schedule, feeder, RunStats())


def _request(credits, rec):
    """Credits opened for every request whose trajectories `rec` holds."""
    stop = threading.Event()
    requests = sorted({t.trajectory_id.rpartition("/")[0] for t in rec.trajectories})
    for rid in requests:
        assert credits.acquire(GROUP, stop)
        credits.opened(type("Req", (), {"request_id": rid, "group_size": GROUP})())
    return len(requests)


def test_it_polls_only_when_no_batch_is_ready_and_returns_the_credits():
    credits, feeder = TrajectoryCredits(100), FakeFeeder()
    plane = _plane(credits, lambda b: AsyncSchedule(b, publish_every=2), feeder)
    recs = [_record(1), _record(2)]
    feeder.published = sum(_request(credits, rec) for rec in recs)
    assert plane.next_batch(0) is None and plane.consumer.polls == 1 and feeder.redos == 1
    plane.consumer.inbox = recs
    first = plane.next_batch(0)
    assert first is not None and credits.outstanding == credits.late == credits.foreign == 0
    plane.settle(first, {"losses/policy_loss": 0.0}, 0.1, 1.0)
    second = plane.next_batch(0)  # ready already: no poll
    assert second is not None and plane.consumer.polls == 2
    plane.settle(second, {}, 0.1, 1.0)
    assert plane.publish_due(2) and plane.checkpoint_ids(1, 2).keys() == {r.record_id for r in recs}
    trajectories = sum(len(r.trajectories) for r in recs)
    a = plane.accounting()
    assert a.balanced and a.received == a.trained == trajectories


def test_a_sync_rounds_untrained_batches_count_as_buffered():
    credits, feeder = TrajectoryCredits(100, rounds=True), FakeFeeder()
    plane = _plane(credits, lambda b: SyncSchedule(b, credits, steps_per_round=2, round_timeout_s=60.0), feeder)
    recs = [_record(3), _record(4)]
    credits.open_round(sum(len(r.trajectories) for r in recs))
    feeder.published = sum(_request(credits, rec) for rec in recs)
    plane.consumer.inbox = recs
    batch = plane.next_batch(0)  # the round is back: its first batch, the second pending
    assert batch is not None and plane.schedule.pending
    plane.settle(batch, {}, 0.1, 1.0)
    a = plane.accounting()
    assert a.balanced and a.buffered_at_end == a.received - a.trained > 0  # the pending batch's
    summary = plane.summary(_Learner(), _Start(), _Publisher(), exit_code=143)
    assert summary.schedule == "sync" and summary.sync.rounds == 0 and summary.exit_code == 143
    assert summary.accounting == a and summary.steps == 1
    assert summary.policy_version_writes == _Publisher.writes  # what each version cost on storage


class _Learner:
    steps, mesh = 1, None

    def compiled_variants(self):
        return 1


class _Start:
    resumed_from_step, warmstart_s = None, 0.0


class _Publisher:
    published, writes = [0], [{"version": 0, "kind": "full", "bytes": 10, "seconds": 0.1}]


def test_the_lag_controller_sees_the_trained_records_lag_and_resizes_the_credits_at_a_version():
    from trainer.learning.data.lag_control import LagControlConfig, LagController

    credits = TrajectoryCredits(100)
    plane = _plane(credits, lambda b: AsyncSchedule(b, publish_every=1))
    plane.lag = LagController(LagControlConfig(target=1.0, settle_versions=1, min_records=1), 100, 8, 400, GROUP)
    rec = _record(5)
    assert rec.min_policy_version == 0  # generated by v0; trained at v4 below: lag 4
    plane.settle([rec], {}, 0.1, 1.0, version=4)
    plane.published(4)
    assert credits.window == 66 and plane.lag.last_lag == 4.0  # 100 / 1.5, the largest step down
    assert "mean lag 4.00 against target 1" in plane.lag.changes[0].reason
    summary = plane.summary(type("L", (), {"steps": 1, "mesh": None, "compiled_variants": lambda s: 1})(),
                            type("S", (), {"resumed_from_step": None, "warmstart_s": 0.0})(),
                            type("P", (), {"published": [0, 1], "writes": []})())  # fmt: skip
    assert summary.lag_control["window"] == 66 and len(summary.lag_control["changes"]) == 1
