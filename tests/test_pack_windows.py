"""PackTrajectoryGroups on Beam's streaming test runner (BundleBasedDirectRunner + TestStream).

Processing time is TestStream's clock: it starts at 0 and moves only on
advance_processing_time, so the packer's clock is `zero_clock` (its max-wait timer, armed
at the start, is due at exactly MAX_WAIT_S). Event time is each trajectory's finished_at.
The transform runs with keep_flush_info=True, so every record says why it left.

Runner bug worked around here: this runner caches one MetricsContainer per step (the
first bundle's, in StateSampler.scoped_state) but commits each later bundle's fresh,
empty one, so only a step's FIRST bundle reaches result.metrics(). (That is also why
metrics updated in @on_timer were "not reported": timers never fire in a first bundle.)
`fresh_metrics_per_bundle` drops that cache before every bundle so the tests can read
every update, as Dataflow reports them.
"""

import collections
import zlib

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statesampler
from apache_beam.testing.test_stream import TestStream as BeamTestStream

from core.contracts import records as R
from core.contracts.record_shape import RecordLayout
from core.contracts.trajectory import Trajectory
from pipelines.metrics import NAMESPACE
from pipelines.pack_transform import FULL, MAX_WAIT, WINDOW_END, PackTrajectoryGroups, shard_of
from pipelines.packing_config import PackingConfig

CFG = PackingConfig(window_s=10.0, max_wait_s=2.0, dedup_window_s=600.0)
LAYOUT = RecordLayout((32, 64), rows=2, max_segments_per_row=2)
MAX_WAIT_S = CFG.max_wait_s
_OUT: dict[str, list] = collections.defaultdict(list)  # run id -> FlushedRecords (same process)


@pytest.fixture(autouse=True)
def fresh_metrics_per_bundle(monkeypatch):
    original = statesampler.StateSampler.scoped_state

    def scoped_state(self, name_context, state_name, io_target=None, metrics_container=None):
        if metrics_container is not None:  # the executor starting a bundle: use its container
            self._states_by_name.clear()
        return original(self, name_context, state_name, io_target, metrics_container)

    monkeypatch.setattr(statesampler.StateSampler, "scoped_state", scoped_state)


def zero_clock() -> float:
    return 0.0


def fifty_clock() -> float:
    return 50.0


def traj(tid: str, n: int, finished_at: float = 1.0, advantage: float = 0.5, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(zlib.crc32(tid.encode()) + seed)
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    mask[0] = 0
    gen = mask == 1
    return Trajectory(
        trajectory_id=tid,
        request_id=tid.split("/")[0],
        task_id="task",
        tokens=rng.integers(0, 1000, n).astype(np.int32),
        loss_mask=mask,
        behaviour_logprobs=np.where(gen, -0.5, 0).astype(np.float32),
        policy_versions=np.where(gen, 3, -1).astype(np.int32),
        reward=1.0,
        status="finished",
        advantage=advantage,
        finished_at=finished_at,
    )


def group(req: str, lengths, **kw) -> list[Trajectory]:
    return [traj(f"{req}/{i}", n, **kw) for i, n in enumerate(lengths)]


def _collect(flushed, run_id):
    _OUT[run_id].append(flushed)


def run(stream: BeamTestStream, cfg: PackingConfig = CFG, clock=zero_clock, layout: RecordLayout = LAYOUT):
    """Runs the stream through PackTrajectoryGroups; returns (FlushedRecords, rollout counters,
    rollout distributions), metrics summed over steps."""
    run_id = f"run{len(_OUT)}"
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"]))
    _ = p | stream | PackTrajectoryGroups(cfg, layout, clock=clock, keep_flush_info=True) | beam.Map(_collect, run_id)
    result = p.run()
    result.wait_until_finish()
    metrics = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    counters, dists = collections.Counter(), {}
    for m in metrics["counters"]:
        counters[m.key.metric.name] += m.committed
    for m in metrics["distributions"]:
        dists[m.key.metric.name] = m.committed
    out = _OUT.pop(run_id, [])
    for f in out:  # every record: valid, of its bucket's shape, and it survives the wire
        shape = (layout.rows, f.seq_len)
        assert f.record.validate(shape).shape == shape
        assert R.decode(R.encode(f.record), shape).record_id == f.record.record_id
    return out, counters, dists


def ids(f) -> set[str]:
    return {i.trajectory_id for i in f.record.trajectories}


def by_reason(out) -> collections.Counter:
    return collections.Counter(f.reason for f in out)


# ----------------------------------------------------------------------------- flush reasons
def test_full_records_leave_before_any_timer():
    """9 x 16 tokens in bucket 32: two records fill (2 rows x 2 segments) as elements arrive;
    processing time never moves, so only the window end (watermark to infinity) flushes the 9th."""
    groups = [group(f"r{g}", [16, 16, 16]) for g in range(3)]
    out, counters, dists = run(
        BeamTestStream().add_elements(groups[:2]).add_elements(groups[2:]).advance_watermark_to_infinity()
    )
    assert by_reason(out) == {FULL: 2, WINDOW_END: 1}
    for f in out:
        if f.reason == FULL:
            assert f.record.num_tokens == 2 * 32 and len(f.record.trajectories) == 4
    assert sorted(i for f in out for i in ids(f)) == sorted(t.trajectory_id for g in groups for t in g)
    assert counters["flush_full"] == 2 and counters["flush_window_end"] == 1 and counters["flush_max_wait"] == 0
    assert counters["records"] == counters["records_bucket_32"] == 3
    assert dists["record_fill_permille"].count == 3 and dists["record_fill_permille"].max == 1000
    assert dists["record_fill_permille"].min == 16 * 1000 // 64


def test_max_wait_flush():
    out, counters, _ = run(
        BeamTestStream()
        .add_elements([group("a", [10, 12])])
        .advance_processing_time(MAX_WAIT_S + 0.1)
        .advance_watermark_to_infinity()
    )
    assert [(f.reason, ids(f)) for f in out] == [(MAX_WAIT, {"a/0", "a/1"})]
    assert counters["flush_max_wait"] == 1


def test_nothing_flushes_before_max_wait():
    out, _, _ = run(
        BeamTestStream()
        .add_elements([group("a", [10])])
        .advance_processing_time(MAX_WAIT_S - 0.5)
        .advance_watermark_to_infinity()
    )
    assert [f.reason for f in out] == [WINDOW_END]  # the max-wait timer had not fired yet


def test_window_end_flushes_before_max_wait():
    """a/* finished in window [0, 10). Passing the watermark over 10 flushes them while
    processing time is still 0; b/0 (window [10, 20)) waits for its own max-wait."""
    a, b = group("a", [10, 12], finished_at=3.0), group("b", [8], finished_at=12.0)
    out, counters, _ = run(
        BeamTestStream()
        .add_elements([a])
        .advance_watermark_to(10.0)
        .add_elements([b])
        .advance_processing_time(MAX_WAIT_S + 0.1)
        .advance_watermark_to_infinity()
    )
    assert [(f.reason, ids(f)) for f in out] == [(WINDOW_END, {"a/0", "a/1"}), (MAX_WAIT, {"b/0"})]
    assert counters["flush_window_end"] == 1 and counters["flush_max_wait"] == 1


def test_late_trajectories_are_packed_not_dropped():
    """The watermark is at 100 when trajectories that finished at 5 (window [0, 10), long
    closed) arrive, plus one without finished_at (stamped by the clock: 0, also late).
    They are packed and flushed at once by the window-end timer, already due."""
    late = group("late", [10, 10], finished_at=5.0) + group("unset", [6], finished_at=0.0)
    out, counters, _ = run(
        BeamTestStream()
        .advance_watermark_to(100.0)
        .add_elements([late])
        .advance_watermark_to(101.0)
        .advance_watermark_to_infinity()
    )
    assert sorted(i for f in out for i in ids(f)) == ["late/0", "late/1", "unset/0"]
    assert {f.reason for f in out} == {WINDOW_END}
    assert counters["dedup_out"] == 3


# ----------------------------------------------------------------------------- buckets, shards
def test_buckets_never_mix_and_each_has_its_shape():
    g = group("m", [10, 20, 32, 33, 40, 64])
    out, counters, _ = run(BeamTestStream().add_elements([g]).advance_watermark_to_infinity())
    want = {32: {"m/0", "m/1", "m/2"}, 64: {"m/3", "m/4", "m/5"}}
    got = collections.defaultdict(set)
    for f in out:
        assert f.record.shape == (LAYOUT.rows, f.seq_len)
        got[f.seq_len] |= ids(f)
    assert got == want
    assert counters["records_bucket_32"] >= 1 and counters["records_bucket_64"] >= 1


def test_shards_pack_separately():
    cfg = PackingConfig(window_s=10.0, max_wait_s=2.0, num_shards=2)
    g = group("s", [8] * 8)
    stream = BeamTestStream().add_elements([g]).advance_watermark_to_infinity()
    out, _, _ = run(stream, cfg, layout=RecordLayout((64,), rows=2, max_segments_per_row=4))
    shards = [{shard_of(i, 2) for i in ids(f)} for f in out]
    assert all(len(s) == 1 for s in shards)
    assert {s for ss in shards for s in ss} == {0, 1}  # these 8 ids hash to both shards
    assert sorted(i for f in out for i in ids(f)) == sorted(t.trajectory_id for t in g)


# ----------------------------------------------------------------------------- what is dropped, and counted
@pytest.mark.parametrize("enabled", [True, False])
def test_zero_signal_groups(enabled):
    cfg = PackingConfig(**{**vars(CFG), "filter_zero_signal": enabled})
    zero, signal = group("z", [8, 9, 10], advantage=0.0), group("s", [8, 9], advantage=0.7)
    out, counters, _ = run(BeamTestStream().add_elements([zero, signal]).advance_watermark_to_infinity(), cfg)
    kept = {i for f in out for i in ids(f)}
    assert kept == ({"s/0", "s/1"} if enabled else {"s/0", "s/1", "z/0", "z/1", "z/2"})
    assert counters["zero_signal_groups"] == 1
    assert counters["zero_signal_groups_dropped"] == (1 if enabled else 0)
    assert counters["zero_signal_trajectories_dropped"] == (3 if enabled else 0)


@pytest.mark.parametrize("content_dedup", [False, True])
def test_duplicates_are_dropped_and_counted(content_dedup):
    cfg = PackingConfig(**{**vars(CFG), "content_dedup": content_dedup})
    g = group("d", [9, 7])
    copy = Trajectory(**{**vars(g[0]), "trajectory_id": "copy/0"})  # same tokens + mask, new id
    stream = (
        BeamTestStream()
        .add_elements([g, g])
        .add_elements([[g[1], copy]])
        .advance_processing_time(MAX_WAIT_S + 1)
        .add_elements([g])
        .advance_watermark_to_infinity()
    )
    out, counters, _ = run(stream, cfg)
    kept = sorted(i for f in out for i in ids(f))
    assert kept == (["d/0", "d/1"] if content_dedup else ["copy/0", "d/0", "d/1"])
    assert counters["dedup_in"] == 8 and counters["dedup_out"] == 3
    if content_dedup:
        assert counters["content_dedup_in"] == 3 and counters["content_dedup_out"] == 2


def test_content_duplicates_send_drop_notices_that_return_their_credits():
    """A content duplicate has an id of its own, whose credit the learner holds: the packer
    says it dropped it (a copy by id needs no notice: its first copy is packed)."""
    cfg = PackingConfig(**{**vars(CFG), "content_dedup": True})
    g = group("d", [9, 7])
    copy = Trajectory(**{**vars(g[0]), "trajectory_id": "copy/0"})
    run_id = "notices"
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"]))
    stream = BeamTestStream().add_elements([g, g]).add_elements([[g[1], copy]]).advance_watermark_to_infinity()
    out = p | stream | PackTrajectoryGroups(cfg, LAYOUT, clock=zero_clock, drop_notices=True)
    _ = out["dropped"] | beam.Map(_collect, run_id)
    p.run().wait_until_finish()
    notices = _OUT.pop(run_id, [])
    assert [(n.reason, n.trajectory_ids) for n in notices] == [("content_dedup", ("copy/0",))]


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_overlong_trajectories(overlong):
    cfg = PackingConfig(**{**vars(CFG), "overlong": overlong})
    long, short = traj("o/0", 100), traj("o/1", 20)
    out, counters, _ = run(BeamTestStream().add_elements([[long, short]]).advance_watermark_to_infinity(), cfg)
    infos = {i.trajectory_id: (f, i) for f in out for i in f.record.trajectories}
    assert counters[f"overlong_{'truncated' if overlong == 'truncate' else 'dropped'}"] == 1
    if overlong == "drop":
        assert set(infos) == {"o/1"}
        return
    f, info = infos["o/0"]
    assert f.seq_len == 64 and info.num_tokens == 64 and info.status == "truncated"
    cols = np.nonzero(f.record.segment_ids[info.row] == info.segment)[0]
    np.testing.assert_array_equal(f.record.tokens[info.row, cols], long.tokens[:64])
    np.testing.assert_array_equal(f.record.loss_mask[info.row, cols], long.loss_mask[:64])


def test_flush_latency_is_emit_time_minus_oldest_finish():
    """The clock reads 50 s; of two trajectories in window [10, 20) the older finished at 10 s: 40,000 ms."""
    g = group("l", [8], finished_at=10.0) + group("m", [8], finished_at=15.0)
    out, _, dists = run(
        BeamTestStream().add_elements([g]).advance_processing_time(60.0).advance_watermark_to_infinity(),
        clock=fifty_clock,
    )
    assert [(f.reason, f.latency_ms) for f in out] == [(MAX_WAIT, 40_000)]
    assert (dists["flush_latency_ms"].count, dists["flush_latency_ms"].max) == (1, 40_000)
