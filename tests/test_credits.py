"""Trajectory credits: the window the feeder may have in flight, blocking acquire, and a
pure-Python simulation that the credit rule cannot deadlock the producer/consumer loop."""

import collections
import itertools
import threading
import time

import pytest

from core.contracts.record_shape import RecordShape
from trainer.learning.data.feeder import CreditConfig, CreditWindow, TrajectoryCredits


# ----------------------------------------------------------------------------- CreditWindow
def _window(ahead: int, batch_records: int, shape: RecordShape, group: int) -> int:
    return CreditWindow(CreditConfig(max_batches_ahead=ahead, group_size=group), batch_records, shape).window


def test_window_arithmetic():
    shape = RecordShape(rows=4, seq_len=256, max_segments_per_row=2)  # 8 trajectories per record
    assert _window(0, 1, shape, 4) == 8 + 4
    assert _window(2, 3, shape, 8) == 3 * 3 * 8 + 8
    assert _window(0, 1, RecordShape(rows=1, seq_len=16, max_segments_per_row=1), 1) == 2
    assert _window(5, 2, RecordShape(3, 64, 3), 16) == 6 * 2 * 9 + 16


@pytest.mark.parametrize("kw", [dict(max_batches_ahead=-1), dict(group_size=0), dict(group_size=-4)])
def test_credit_config_refuses_settings_that_cannot_work(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        CreditConfig(**kw)


def test_a_window_that_could_deadlock_is_refused_and_the_smallest_safe_one_is_not():
    shape = RecordShape(rows=2, seq_len=64, max_segments_per_row=2)  # 4 trajectories a record
    safe = CreditWindow(CreditConfig(group_size=4, max_in_flight=2 * 4 + 4), 2, shape)
    safe.check()
    assert safe.window == safe.min_window == 12
    with pytest.raises(ValueError, match="could deadlock"):
        CreditWindow(CreditConfig(group_size=4, max_in_flight=11), 2, shape).check()
    CreditWindow(CreditConfig(group_size=4, max_in_flight=11), 2, shape, sync=True).check()  # rounds: unused


def test_record_shape_refuses_non_positive():
    for bad in [dict(rows=0), dict(seq_len=0), dict(max_segments_per_row=0)]:
        with pytest.raises(ValueError):
            RecordShape(**bad)


# ----------------------------------------------------------------------------- TrajectoryCredits
def test_acquire_and_release_count_outstanding():
    credits = TrajectoryCredits(window=10)
    never = threading.Event()
    assert credits.acquire(4, never) and credits.acquire(6, never)
    assert credits.outstanding == 10
    credits.release(3)
    assert credits.outstanding == 7
    assert credits.acquire(3, never)
    assert credits.outstanding == 10
    credits.release(10)
    assert credits.outstanding == 0


def test_acquire_blocks_while_full_and_proceeds_after_release():
    t_start = time.monotonic()
    credits = TrajectoryCredits(window=8)
    stop = threading.Event()
    assert credits.acquire(8, stop)
    events = []
    acquired = threading.Event()

    def producer():
        ok = credits.acquire(4, stop, poll_s=0.05)
        events.append(("acquired", ok, time.monotonic()))
        acquired.set()

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    # Still full: the producer must be waiting.
    assert not acquired.wait(0.2)
    assert events == []
    credits.release(2)  # 6 outstanding: 4 more still do not fit
    assert not acquired.wait(0.15)
    t_release = time.monotonic()
    events.append(("released", None, t_release))
    credits.release(2)  # 4 outstanding: now they fit
    assert acquired.wait(1.0)
    th.join(1.0)
    assert [e[0] for e in events] == ["released", "acquired"]
    assert events[1][1] is True
    assert events[1][2] - t_release < 0.5  # woken by the notify, promptly
    assert credits.outstanding == 8
    assert time.monotonic() - t_start < 2.0


def test_acquire_returns_false_promptly_when_stopped():
    credits = TrajectoryCredits(window=4)
    stop = threading.Event()
    assert credits.acquire(4, stop)
    result = []

    def producer():
        result.append(credits.acquire(1, stop, poll_s=0.05))

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    time.sleep(0.1)
    assert result == []
    t0 = time.monotonic()
    stop.set()
    th.join(1.0)
    assert not th.is_alive()
    assert result == [False]
    assert time.monotonic() - t0 < 0.5
    assert credits.outstanding == 4  # a refused acquire takes nothing


def test_acquire_already_stopped_but_fitting_still_succeeds():
    credits = TrajectoryCredits(window=4)
    stop = threading.Event()
    stop.set()
    t0 = time.monotonic()
    assert credits.acquire(3, stop)
    assert not credits.acquire(2, stop)
    assert time.monotonic() - t0 < 0.2
    assert credits.outstanding == 3


def test_many_threads_never_exceed_the_window():
    credits = TrajectoryCredits(window=12)
    stop = threading.Event()
    peak, lock = [0], threading.Lock()

    def worker():
        for _ in range(40):
            if not credits.acquire(3, stop, poll_s=0.01):
                return
            with lock:
                peak[0] = max(peak[0], credits.outstanding)
            credits.release(3)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(2.0)
    assert not any(th.is_alive() for th in threads)
    assert peak[0] <= 12
    assert credits.outstanding == 0


# ----------------------------------------------------------------------------- no-deadlock simulation
class Simulation:
    """Producer (feeder + rollout workers), packer and consumer (learner), run in lock step.

    * producer: acquires group_size credits per request (never blocking: a stopped event
      makes acquire a non-blocking try) and hands group_size trajectories to the packer;
    * packer (adversarial): a record always holds the maximum rows*max_segments_per_row
      trajectories, and leftovers below that are NOT flushed (no timer ever fires);
    * consumer: a step needs batch_records records; it then returns the credits of the
      trajectories they hold.
    A stall is a round in which neither side can make progress."""

    def __init__(self, cfg: CreditWindow, window: int | None = None):
        self.cfg = cfg
        self.credits = TrajectoryCredits(cfg.window if window is None else window)
        self.try_only = threading.Event()
        self.try_only.set()
        self.per_record = cfg.shape.max_trajectories
        self.buffer = 0  # trajectories in the packer, not yet in a record
        self.records = collections.deque()  # trajectories per queued record
        self.steps = 0
        self.requests = 0
        self.max_outstanding = 0

    def produce(self) -> bool:
        if not self.credits.acquire(self.cfg.cfg.group_size, self.try_only):
            return False
        self.requests += 1
        self.max_outstanding = max(self.max_outstanding, self.credits.outstanding)
        self.buffer += self.cfg.cfg.group_size
        while self.buffer >= self.per_record:
            self.records.append(self.per_record)
            self.buffer -= self.per_record
        return True

    def consume(self) -> bool:
        if len(self.records) < self.cfg.batch_records:
            return False
        batch = [self.records.popleft() for _ in range(self.cfg.batch_records)]
        self.credits.release(sum(batch))
        self.steps += 1
        return True

    def run(self, steps: int, max_rounds: int = 100_000) -> None:
        for _ in range(max_rounds):
            if self.steps >= steps:
                return
            progressed = False
            while self.produce():  # the feeder runs ahead as far as credits allow
                progressed = True
            if self.consume():
                progressed = True
            if not progressed:
                raise AssertionError(
                    f"stall after {self.steps} steps: outstanding {self.credits.outstanding}/"
                    f"{self.credits.window}, {len(self.records)} records queued, {self.buffer} buffered"
                )
        raise AssertionError("simulation did not finish")


COMBOS = list(itertools.product([0, 1, 3], [1, 2, 4], [1, 2, 4], [1, 2, 3], [1, 3, 4, 8, 16]))


@pytest.mark.parametrize(
    "ahead,batch,rows,segs,group", COMBOS[::20] + [(0, 1, 1, 1, 1), (0, 1, 4, 3, 16), (3, 4, 4, 3, 5), (0, 4, 1, 1, 7)]
)
def test_credit_window_never_deadlocks(ahead, batch, rows, segs, group):
    cfg = CreditWindow(
        CreditConfig(max_batches_ahead=ahead, group_size=group),
        batch,
        RecordShape(rows=rows, seq_len=64, max_segments_per_row=segs),
    )
    sim = Simulation(cfg)
    sim.run(50)
    assert sim.steps == 50
    assert sim.max_outstanding <= cfg.window
    # The feeder really runs ahead: with the window full, at least ahead+1 batches of
    # trajectories are in flight.
    assert sim.max_outstanding > (ahead + 1) * batch * cfg.shape.max_trajectories


def test_all_combinations_never_deadlock():
    for ahead, batch, rows, segs, group in COMBOS:
        cfg = CreditWindow(
            CreditConfig(max_batches_ahead=ahead, group_size=group),
            batch,
            RecordShape(rows=rows, seq_len=64, max_segments_per_row=segs),
        )
        Simulation(cfg).run(50)


def test_simulation_detects_a_window_that_is_too_small():
    """The same simulation stalls when the window cannot fill one batch: it can fail."""
    cfg = CreditWindow(
        CreditConfig(max_batches_ahead=0, group_size=1),
        2,
        RecordShape(rows=2, seq_len=64, max_segments_per_row=2),
    )
    with pytest.raises(AssertionError, match="stall"):
        Simulation(cfg, window=2 * 4 - 1).run(50)


def test_simulation_with_the_real_packer_never_deadlocks():
    """Same loop with real trajectories and take_full_records (no timer flush)."""
    import numpy as np

    from core.contracts.trajectory import Trajectory
    from pipelines.packing import take_full_records

    rng = np.random.default_rng(0)
    for ahead, batch, rows, segs, group in [(0, 1, 2, 2, 4), (1, 2, 2, 3, 3), (2, 1, 3, 1, 8), (0, 3, 2, 2, 1)]:
        shape = RecordShape(rows=rows, seq_len=32, max_segments_per_row=segs)
        cfg = CreditWindow(CreditConfig(max_batches_ahead=ahead, group_size=group), batch, shape)
        credits, try_only = TrajectoryCredits(cfg.window), threading.Event()
        try_only.set()
        buffer, queue, steps, made = [], collections.deque(), 0, 0
        while steps < 50:
            progressed = False
            while credits.acquire(group, try_only):
                progressed = True
                for _ in range(group):
                    n = int(rng.choice([1, 2, 3, int(rng.integers(1, 33))]))  # mostly tiny: many per row
                    m = np.ones(n, np.uint8)
                    m[0] = 0
                    buffer.append(
                        Trajectory(
                            f"t{made}",
                            "r",
                            "task",
                            np.zeros(n, np.int32),
                            m,
                            np.where(m == 1, -1.0, 0).astype(np.float32),
                            np.where(m == 1, 0, -1).astype(np.int32),
                            0.0,
                            "finished",
                        )
                    )
                    made += 1
                    ready, buffer = take_full_records(buffer, shape)
                    queue.extend(ready)
            if len(queue) >= batch:
                recs = [queue.popleft() for _ in range(batch)]
                credits.release(sum(len(r.trajectories) for r in recs))
                steps += 1
                progressed = True
            assert progressed, f"stall at step {steps} for {cfg}: {credits.outstanding} outstanding"


# ----------------------------------------------------------------------------- trajectories in flight, the user's knob
def test_max_in_flight_sets_the_window_and_batches_ahead_is_derived():
    shape = RecordShape(rows=4, seq_len=256, max_segments_per_row=2)
    cfg = CreditWindow(CreditConfig(max_batches_ahead=0, group_size=8, max_in_flight=200), 8, shape)
    assert cfg.window == 200
    assert cfg.batches_ahead == pytest.approx((200 - 8) / 64 - 1)
    assert CreditWindow(CreditConfig(max_batches_ahead=2, group_size=8), 8, shape).batches_ahead == 2


def test_max_in_flight_below_one_batch_is_refused_as_a_deadlock():
    shape = RecordShape(rows=4, seq_len=256, max_segments_per_row=2)
    with pytest.raises(ValueError, match=r"max_in_flight=71 could deadlock.*72"):
        CreditWindow(CreditConfig(max_batches_ahead=0, group_size=8, max_in_flight=71), 8, shape).check()
    ok = CreditWindow(CreditConfig(max_batches_ahead=0, group_size=8, max_in_flight=72), 8, shape)
    ok.check()
    Simulation(ok).run(30)  # the smallest accepted window still never stalls


# ----------------------------------------------------------------------------- per request: write-off and redo
def _request(rid: str, group: int = 4):
    from core.contracts.rollout_request import RolloutRequest

    return RolloutRequest(rid, "calculator", {"question": rid}, group)


def _open(credits: TrajectoryCredits, rid: str, group: int = 4):
    assert credits.acquire(group, threading.Event())
    credits.opened(_request(rid, group))


def test_returned_trajectories_release_their_requests_credits_once():
    now = [0.0]
    credits = TrajectoryCredits(12, clock=lambda: now[0])
    _open(credits, "a")
    _open(credits, "b")
    credits.returned(["a/0", "a/1", "a/2", "a/3", "b/0"])
    assert credits.outstanding == 3
    credits.returned(["zzz/0"])  # a request this run never made (from before a restart)
    assert credits.outstanding == 3 and credits.foreign == 1


def test_a_request_that_never_comes_back_is_written_off_and_its_late_arrivals_release_nothing():
    now = [0.0]
    credits = TrajectoryCredits(12, clock=lambda: now[0])
    _open(credits, "lost")
    now[0] = 5.0
    _open(credits, "young")
    credits.returned(["lost/0"])
    now[0] = 10.5
    expired = credits.expire(10.0)
    assert [r.request_id for r in expired] == ["lost"] and expired[0].task == {"question": "lost"}
    assert credits.written_off == 3 and credits.outstanding == 4  # only "young" is left
    credits.returned(["lost/1", "lost/2"])  # the worker was slow, not dead
    assert credits.late == 2 and credits.outstanding == 4
    assert credits.expire(10.0) == []  # "young" is 5.5 s old


def test_a_timed_out_sync_round_writes_off_its_requests_too():
    credits = TrajectoryCredits(8, rounds=True)
    _open(credits, "r1")
    _open(credits, "r2")
    credits.returned(["r1/0", "r1/1"])
    credits.forget_outstanding()
    assert credits.written_off == 6 and credits.outstanding == 0
    credits.returned(["r2/3"])
    assert credits.late == 1 and credits.foreign == 0


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan")])
def test_a_request_timeout_that_could_never_fire_or_always_fires_is_refused(bad):
    with pytest.raises(ValueError, match="request_timeout_s"):
        CreditConfig(max_batches_ahead=0, group_size=4, request_timeout_s=bad)
