"""The stateful packer (PackRecordsFn / PackTrajectories) on Beam's streaming test runner.

TestStream drives BundleBasedDirectRunner with a TestClock that starts at processing time
0 and only moves on `advance_processing_time`. PackRecordsFn takes an injectable clock:
`zero_clock` reads 0, which is the TestClock's time whenever the buffer is armed at the
start of a stream, so its flush timer is due at exactly processing time `max_wait_s`.
(DeduplicatePerKey sets its own timer from the wall clock, so it never expires here.)
"""
import collections
import zlib

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from apache_beam.testing.util import BeamAssertException, assert_that

from pipelines.trajectory import Trajectory
from pipelines.transforms import PackRecordsFn, PackTrajectories
from trainer import records as R
from trainer.config import RecordShape

SHAPE = RecordShape(rows=2, seq_len=32, max_segments_per_row=2)
MAX_WAIT_S = 2.0


def zero_clock() -> float:
    return 0.0


def traj(tid: str, n: int, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(zlib.crc32(tid.encode()) + seed)
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    mask[0] = 0
    gen = mask == 1
    return Trajectory(trajectory_id=tid, request_id=tid.split("/")[0], task_id="task",
                      tokens=rng.integers(0, 1000, n).astype(np.int32), loss_mask=mask,
                      behaviour_logprobs=np.where(gen, -0.5, 0).astype(np.float32),
                      policy_versions=np.where(gen, 3, -1).astype(np.int32), reward=1.0, status="finished",
                      advantage=0.5)


def tokens_of(trajs) -> collections.Counter:
    return collections.Counter((t.trajectory_id, p, int(x)) for t in trajs for p, x in enumerate(t.tokens))


def record_tokens(rec: R.PackedRecord) -> collections.Counter:
    out = collections.Counter()
    for info in rec.trajectories:
        cols = np.nonzero(rec.segment_ids[info.row] == info.segment)[0]
        out.update((info.trajectory_id, int(p), int(x))
                   for p, x in zip(rec.positions[info.row, cols], rec.tokens[info.row, cols]))
    return out


def records_hold(expected_groups: list[set[str]], expected_tokens: collections.Counter):
    """Matcher: the records hold exactly these groups of trajectory ids (one set per record,
    any order) and, together, exactly these tokens; each record is valid and round-trips."""

    def match(recs):
        groups = sorted(sorted(i.trajectory_id for i in r.trajectories) for r in recs)
        want = sorted(sorted(g) for g in expected_groups)
        if groups != want:
            raise BeamAssertException(f"records hold {groups}, expected {want}")
        got = collections.Counter()
        for r in recs:
            r.validate((SHAPE.rows, SHAPE.seq_len))
            back = R.decode(R.encode(r), (SHAPE.rows, SHAPE.seq_len))
            if back.record_id != r.record_id or not np.array_equal(back.tokens, r.tokens):
                raise BeamAssertException("record does not round-trip")
            got += record_tokens(r)
        if got != expected_tokens:
            raise BeamAssertException(f"token multiset differs: missing {expected_tokens - got}, extra {got - expected_tokens}")

    return match


def run(stream: BeamTestStream, transform, matcher) -> None:
    opts = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    with beam.Pipeline(options=opts) as p:
        assert_that(p | stream | transform, matcher)


def pack_trajectories():
    return PackTrajectories(SHAPE, max_wait_s=MAX_WAIT_S, dedup_window_s=600, clock=zero_clock)


# ----------------------------------------------------------------------------- cases
def test_full_records_come_out_without_any_timer():
    """9 x 16 tokens: two records fill (2 rows x 2 segments each) as elements arrive; processing
    time never moves, so the flush timer never fires and the 9th stays buffered."""
    trajs = [traj(f"req/{i}", 16) for i in range(9)]
    stream = BeamTestStream().add_elements(trajs[:5]).add_elements(trajs[5:]).advance_watermark_to_infinity()

    def match(recs):
        if len(recs) != 2:
            raise BeamAssertException(f"expected 2 full records, got {len(recs)}")
        ids = [i.trajectory_id for r in recs for i in r.trajectories]
        if len(ids) != 8 or len(set(ids)) != 8:
            raise BeamAssertException(f"expected 8 distinct trajectories, got {ids}")
        by_id = {t.trajectory_id: t for t in trajs}
        for r in recs:
            if r.num_tokens != SHAPE.rows * SHAPE.seq_len or (r.segment_ids.max(axis=1) != 2).any():
                raise BeamAssertException("a full record must have every row at 2 segments, no padding")
            if record_tokens(r) != tokens_of(by_id[i.trajectory_id] for i in r.trajectories):
                raise BeamAssertException("record tokens differ from its trajectories")

    run(stream, pack_trajectories(), match)


def test_full_records_then_flush_of_the_leftover():
    trajs = [traj(f"req/{i}", 16) for i in range(5)]
    stream = (BeamTestStream().add_elements(trajs).advance_processing_time(MAX_WAIT_S + 0.5)
              .advance_watermark_to_infinity())

    def match(recs):
        sizes = sorted(len(r.trajectories) for r in recs)
        if sizes != [1, 4]:
            raise BeamAssertException(f"expected a full record of 4 and a flushed one of 1, got {sizes}")
        got = sum((record_tokens(r) for r in recs), collections.Counter())
        if got != tokens_of(trajs):
            raise BeamAssertException("tokens lost or duplicated")

    run(stream, pack_trajectories(), match)


def test_lone_trajectory_is_flushed_after_max_wait():
    t0 = traj("lone/0", 10)
    stream = BeamTestStream().add_elements([t0]).advance_processing_time(MAX_WAIT_S + 0.1).advance_watermark_to_infinity()
    run(stream, pack_trajectories(), records_hold([{"lone/0"}], tokens_of([t0])))


def test_lone_trajectory_is_not_flushed_before_max_wait():
    t0 = traj("lone/0", 10)
    stream = BeamTestStream().add_elements([t0]).advance_processing_time(MAX_WAIT_S - 0.5).advance_watermark_to_infinity()
    run(stream, pack_trajectories(), records_hold([], collections.Counter()))


def test_flush_happens_between_max_wait_boundaries():
    """t0 arms the timer at 0; t1 arrives at 1.9 (before the flush, so it joins t0's record);
    the flush at 2.0 has happened by 2.1, so t2 (arriving at 2.1) starts a new record."""
    t0, t1, t2 = traj("a/0", 10), traj("a/1", 8), traj("a/2", 12)
    stream = (BeamTestStream()
              .add_elements([t0]).advance_processing_time(1.9)
              .add_elements([t1]).advance_processing_time(0.2)
              .add_elements([t2]).advance_processing_time(5.0)
              .advance_watermark_to_infinity())
    run(stream, pack_trajectories(), records_hold([{"a/0", "a/1"}, {"a/2"}], tokens_of([t0, t1, t2])))


def test_duplicate_trajectory_ids_are_dropped():
    t0, t1 = traj("dup/0", 9), traj("dup/1", 7)
    t0_again = traj("dup/0", 9)  # a redelivery: same id, same content
    stream = (BeamTestStream()
              .add_elements([t0, t0_again, t1])
              .add_elements([traj("dup/0", 9)])
              .advance_processing_time(MAX_WAIT_S + 1.0)
              .add_elements([t1])
              .advance_processing_time(MAX_WAIT_S + 1.0)
              .advance_watermark_to_infinity())
    run(stream, pack_trajectories(), records_hold([{"dup/0", "dup/1"}], tokens_of([t0, t1])))


def test_pack_records_fn_keeps_one_buffer_per_key():
    """Two keys, one trajectory each: they would share a record if buffered together."""
    a, b = traj("k0/0", 20), traj("k1/0", 20)
    stream = (BeamTestStream().add_elements([(0, a), (1, b)]).advance_processing_time(MAX_WAIT_S + 1.0)
              .advance_watermark_to_infinity())
    fn = beam.ParDo(PackRecordsFn(SHAPE, max_wait_s=MAX_WAIT_S, clock=zero_clock))
    run(stream, fn, records_hold([{"k0/0"}, {"k1/0"}], tokens_of([a, b])))
