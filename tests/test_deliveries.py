"""At-least-once without loss (trainer/learning/data/deliveries.py): a record is acked only once
a durable checkpoint covers it, a crash at any point loses nothing and trains nothing
twice, and the dedup set stays bounded by the staleness horizon. The ledger against a
model of Pub/Sub and crashes (property test), then the consumer against the real emulator."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts import pubsub_io
from core.contracts.records import encode
from tests._records_data import make_record
from trainer.learning.data.consumer import RecordConsumer
from trainer.learning.data.deliveries import Deliveries, DeliveryConfig

CFG = DeliveryConfig(ack_deadline_s=60, extend_every_s=20)
HORIZON = 2  # the staleness the learner applies

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.integers(0, 11)),
        st.tuples(st.sampled_from(["train", "checkpoint", "durable", "ack", "crash"]), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_a_crash_anywhere_loses_nothing_and_trains_nothing_twice(ops):
    """Messages 0..11 (redelivered while unacked, as Pub/Sub does); the learner trains in
    arrival order, checkpoints (as Orbax does: a new save first finalises the one in
    flight), acks at any poll, saves in flight or not, and may crash at any point."""
    unacked = set(range(12))
    durable: dict[str, int] = {}  # the newest durable checkpoint's dedup set
    trained_in_durable_state: set[str] = set()  # what the durable weights have seen
    ledger, queue, trained_since, in_flight, durable_step, step = (
        Deliveries(CFG, max_staleness=HORIZON),
        [],
        set(),
        None,
        None,
        0,
    )
    ack_of: dict[str, str] = {}

    def land(save):  # the save in flight is durable: its manifest is written
        nonlocal durable, durable_step, trained_since
        durable_step, durable, covered = save
        trained_in_durable_state.update(covered)
        trained_since -= covered

    for op, i in ops:
        if op == "deliver" and i in unacked:
            ack_id = f"a{len(ack_of)}"
            ack_of[ack_id] = f"r{i}"
            if ledger.accept(f"r{i}", ack_id, 0) == "new":
                rid = f"r{i}"
                assert rid not in trained_in_durable_state | trained_since, f"{rid} would be trained twice"
                queue.append(rid)
            elif f"r{i}" in ledger.consumed and f"r{i}" not in ledger.held:
                unacked.discard(i)  # 'consumed': the consumer acks it at once
        elif op == "train" and queue:
            rid = queue.pop(0)
            trained_since.add(rid)
            ledger.settle([rid])
        elif op == "checkpoint":
            if in_flight is not None:
                land(in_flight)
            step += 1
            in_flight = (step, ledger.checkpoint(0, step), set(trained_since))
        elif op == "durable" and in_flight is not None:
            land(in_flight)
            in_flight = None
        elif op == "ack":  # a poll, whether or not a save is in flight; a crash may come first
            for ack_id in ledger.take_covered(durable_step):
                rid = ack_of[ack_id]
                assert rid in durable and rid in trained_in_durable_state, f"{rid} acked before it was durable"
                unacked.discard(int(rid[1:]))
            # Held: nothing a durable step covers (the unsettled, the settled since that step's save began).
            landed = -1 if durable_step is None else durable_step
            assert all(h.covered_by is None or h.covered_by > landed for h in ledger.held.values())
        elif op == "crash":  # the process dies: only Pub/Sub and the durable checkpoint remain
            ledger, queue, trained_since, in_flight, durable_step = (
                Deliveries(CFG, durable, max_staleness=HORIZON),
                [],
                set(),
                None,
                None,
            )
    # Nothing lost: every message is either still in Pub/Sub or in the durable state.
    for i in range(12):
        assert i in unacked or f"r{i}" in trained_in_durable_state


def test_a_learner_that_saves_at_every_publish_acks_each_checkpoints_records_once_it_lands():
    """Issue 39: with a save always in flight, acks waited for a poll with none in flight,
    so the held set grew with the run. Per checkpoint, a record is acked once the save
    that holds it lands: held stays within the records of the last two saves."""
    ledger, held = Deliveries(CFG, max_staleness=HORIZON), []
    for step in range(1, 21):
        ids = [f"r{step}-{k}" for k in range(4)]
        for rid in ids:
            ledger.accept(rid, f"ack-{rid}", step)
        ledger.settle(ids)
        ledger.checkpoint(step, step)  # this save is in flight; step - 1's landed as it began
        acked = ledger.take_covered(step - 1 if step > 1 else None)
        assert sorted(acked) == sorted(f"ack-r{step - 1}-{k}" for k in range(4) if step > 1)
        held.append(len(ledger.held))
    assert max(held) == 4  # this save's records only, at every step (was 4 x step)


def test_the_dedup_set_forgets_only_what_staleness_would_drop_anyway():
    ledger = Deliveries(CFG, max_staleness=HORIZON)
    for rid, version in [("old", 3), ("edge", 4), ("new", 6), ("no-tokens", -1), ("held-old", 1)]:
        assert ledger.accept(rid, f"ack-{rid}", version) == "new"
    ledger.settle(["old", "edge", "new", "no-tokens"])
    ledger.checkpoint(5, 1)  # covered now, not acked yet
    ledger.take_covered(1)
    kept = ledger.checkpoint(6, 2)  # floor 6 - 2 = 4: a redelivered "old" (version 3) is 3 stale
    assert set(kept) == {"edge", "new", "no-tokens"} and ledger.expired == 1
    assert "held-old" in ledger.held  # never settled: kept however old
    assert ledger.accept("old", "ack-again", 3) == "new"  # forgotten; the staleness bound drops it
    assert ledger.accept("edge", "ack-again", 4) == "consumed"
    assert ledger.peak_consumed == 4


def test_a_redelivery_of_a_held_record_is_kept_with_it_not_acked_early():
    ledger = Deliveries(CFG, max_staleness=HORIZON)
    ledger.accept("r", "first", 0)
    assert ledger.accept("r", "second", 0) == "held" and ledger.redelivered == 1
    ledger.settle(["r"])
    assert ledger.take_covered(None) == []  # settled is not durable
    ledger.checkpoint(0, 7)
    assert ledger.take_covered(6) == []  # an older step does not hold it
    assert ledger.take_covered(7) == ["first", "second"]


def test_extensions_come_every_extend_every_s_for_everything_held():
    now = [0.0]
    ledger = Deliveries(CFG, clock=lambda: now[0], max_staleness=HORIZON)
    ledger.accept("a", "ack-a", 0)
    ledger.accept("b", "ack-b", 0)
    assert ledger.due_for_extension() == []
    now[0] = 20.0
    assert sorted(ledger.due_for_extension()) == ["ack-a", "ack-b"]
    assert ledger.due_for_extension() == []  # not again until another 20 s


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"ack_deadline_s": 5}, "ack_deadline_s"),
        ({"ack_deadline_s": 601}, "ack_deadline_s"),
        ({"ack_deadline_s": 60, "extend_every_s": 30}, "extend_every_s"),
        ({"extend_every_s": 0}, "extend_every_s"),
    ],
)
def test_settings_that_would_redeliver_held_records_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DeliveryConfig(**kwargs)


def _pull_all(consumer: RecordConsumer, want: int, timeout_s: float = 30.0) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.poll(max_messages=10, timeout_s=1.0)
    return got


@pytest.mark.timeout(180)
def test_held_records_stay_unacked_with_extended_deadlines_until_durable(pubsub_emulator, unique_name):
    """Against the emulator: records held past their 10 s deadline are not redelivered (the
    deadline is extended); a clean close nacks the unsettled ones back at once; only what a
    durable checkpoint covered is gone for the next learner."""
    emu = pubsub_emulator
    name = unique_name("records")
    topic = emu.create_topic(name)
    sub = emu.create_subscription(name + "-sub", name, ack_deadline_s=10)
    pub = pubsub_io.publisher_client()
    for i in range(6):
        pubsub_io.publish(pub, topic, encode(make_record(i, 2, 64, f"rec-{i}"))).result(timeout=30)

    durable_step = [None]
    cfg = DeliveryConfig(ack_deadline_s=10, extend_every_s=3)
    first = RecordConsumer(sub, {(2, 64)}, delivery=cfg, max_staleness=2, durable=lambda: durable_step[0])
    got = _pull_all(first, 6)
    assert sorted(r.record_id for r in got) == [f"rec-{i}" for i in range(6)]
    first.settle(got[:3])  # trained three
    dedup = first.checkpoint_ids(0, 1)  # step 1's save is in flight: nothing may be acked yet
    assert set(dedup) == {r.record_id for r in got[:3]}
    t_end = time.monotonic() + 14  # past the subscription's 10 s deadline
    while time.monotonic() < t_end:
        assert first.poll(max_messages=10, timeout_s=1.0) == []  # extended: no redelivery
    assert first.duplicates == 0 and first.pubsub_errors == 0
    durable_step[0] = 1  # durable: the next poll acks the three covered records
    assert first.poll(max_messages=10, timeout_s=1.0) == []
    first.close()  # nacks the three unsettled ones

    never_durable = lambda: None  # a learner whose next checkpoint never lands
    second = RecordConsumer(sub, {(2, 64)}, delivery=cfg, max_staleness=2, consumed=dedup, durable=never_durable)
    t0 = time.monotonic()
    again = _pull_all(second, 3, timeout_s=8)  # well inside the deadline: the nack returned them
    assert sorted(r.record_id for r in again) == sorted(r.record_id for r in got[3:])
    assert time.monotonic() - t0 < 8
    second.settle(again)
    second.close()  # no checkpoint covers them: nacked back, not acked
    third = RecordConsumer(sub, {(2, 64)}, delivery=cfg, max_staleness=2, consumed=dedup, durable=never_durable)
    assert sorted(r.record_id for r in _pull_all(third, 3, timeout_s=8)) == sorted(r.record_id for r in got[3:])
    third.close()
