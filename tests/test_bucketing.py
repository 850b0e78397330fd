"""Length buckets (pipelines/bucketing.py), PackingConfig and its command-line flags.

Property tests: the chosen bucket is the smallest that fits; truncation keeps a
consistent prefix; across a stream of trajectories every kept token is packed exactly
once and every overlong or empty trajectory is counted, never silently lost.
"""

import collections
import dataclasses

import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_packing import make_trajectory

from core import config
from core.contracts import records as R
from core.contracts.record_shape import RecordLayout, RecordShape
from pipelines import bucketing
from pipelines.config import RolloutJobConfig
from pipelines.options import RolloutOptions, rollout_config
from pipelines.pack_transform import PackTrajectoryGroups
from pipelines.packing import pack
from pipelines.packing_config import PackingConfig, record_bytes_upper_bound

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
bucket_lists = st.lists(st.integers(1, 96), min_size=1, max_size=4, unique=True).map(lambda b: tuple(sorted(b)))


# ----------------------------------------------------------------------------- pure functions
@PROPS
@given(bucket_lists, st.integers(0, 200))
def test_choose_bucket_is_the_smallest_that_fits(seq_lens, n):
    b = bucketing.choose_bucket(n, seq_lens)
    fitting = [i for i, s in enumerate(seq_lens) if s >= n]
    assert b == (fitting[0] if fitting else None)


@PROPS
@given(st.integers(1, 80), st.integers(1, 80), st.integers(0, 2**32 - 1))
def test_truncate_keeps_a_consistent_prefix(n, cut, seed):
    t = make_trajectory(0, n, seed)
    out = bucketing.truncate(t, cut)
    k = min(n, cut)
    assert len(out) == k
    for name in ("tokens", "loss_mask", "behaviour_logprobs", "policy_versions"):
        np.testing.assert_array_equal(getattr(out, name), getattr(t, name)[:k], err_msg=name)
    assert out.status == ("truncated" if n > cut else t.status)
    assert (out.trajectory_id, out.reward, out.advantage) == (t.trajectory_id, t.reward, t.advantage)
    assert len(t) == n  # the input is not modified


def test_truncate_refuses_nonpositive_length():
    with pytest.raises(ValueError):
        bucketing.truncate(make_trajectory(0, 5, 0), 0)


@PROPS
@given(
    bucket_lists,
    st.lists(st.integers(0, 120), max_size=25),
    st.sampled_from(bucketing.OVERLONG_POLICIES),
    st.integers(1, 3),
    st.integers(0, 2**32 - 1),
)
def test_every_kept_token_is_packed_once_and_every_loss_is_counted(seq_lens, lengths, overlong, rows, seed):
    trajs = [
        make_trajectory(i, n, seed + i)
        if n
        else dataclasses.replace(
            make_trajectory(i, 1, seed),
            tokens=np.zeros(0, np.int32),
            loss_mask=np.zeros(0, np.uint8),
            behaviour_logprobs=np.zeros(0, np.float32),
            policy_versions=np.zeros(0, np.int32),
        )
        for i, n in enumerate(lengths)
    ]
    outcomes = collections.Counter()
    per_bucket = collections.defaultdict(list)
    expected = collections.Counter()
    for t in trajs:
        fit = bucketing.fit_to_buckets(t, seq_lens, overlong)
        outcomes[fit.outcome] += 1
        if fit.trajectory is None:
            assert fit.bucket is None
            assert fit.outcome == (bucketing.DROPPED_EMPTY if len(t) == 0 else bucketing.DROPPED_OVERLONG)
            continue
        kept = fit.trajectory
        assert len(kept) <= seq_lens[fit.bucket]
        assert fit.bucket == (
            bucketing.choose_bucket(len(t), seq_lens) if fit.outcome == bucketing.FITS else len(seq_lens) - 1
        )
        assert kept.tokens.tolist() == t.tokens[: len(kept)].tolist()
        per_bucket[fit.bucket].append(kept)
        expected.update((kept.trajectory_id, p, int(x)) for p, x in enumerate(kept.tokens))
    overlong_n = sum(1 for n in lengths if n > seq_lens[-1])
    assert outcomes[bucketing.DROPPED_EMPTY] == lengths.count(0)
    assert outcomes[bucketing.TRUNCATED if overlong == "truncate" else bucketing.DROPPED_OVERLONG] == overlong_n
    assert sum(outcomes.values()) == len(trajs)
    got = collections.Counter()
    for b, kept in per_bucket.items():
        for rec in pack(kept, RecordShape(rows, seq_lens[b], 2)):
            assert rec.shape == (rows, seq_lens[b])
            for info in rec.trajectories:
                cols = np.nonzero(rec.segment_ids[info.row] == info.segment)[0]
                got.update(
                    (info.trajectory_id, int(p), int(x))
                    for p, x in zip(rec.positions[info.row, cols], rec.tokens[info.row, cols])
                )
    assert got == expected


def test_fit_to_buckets_boundaries():
    t = lambda n: make_trajectory(0, n, 1)
    assert bucketing.fit_to_buckets(t(32), (32, 64), "drop").bucket == 0
    assert bucketing.fit_to_buckets(t(33), (32, 64), "drop").bucket == 1
    assert bucketing.fit_to_buckets(t(65), (32, 64), "drop").outcome == bucketing.DROPPED_OVERLONG
    fit = bucketing.fit_to_buckets(t(65), (32, 64), "truncate")
    assert (fit.outcome, fit.bucket, len(fit.trajectory), fit.trajectory.status) == (
        bucketing.TRUNCATED,
        1,
        64,
        "truncated",
    )
    with pytest.raises(ValueError):
        bucketing.fit_to_buckets(t(5), (32,), "wrap")


def test_content_hash_sees_tokens_and_mask_not_ids():
    a = make_trajectory(0, 20, 5)
    same = dataclasses.replace(a, trajectory_id="other/0", reward=9.0)
    flipped = dataclasses.replace(a, loss_mask=1 - a.loss_mask)
    assert bucketing.content_hash(a) == bucketing.content_hash(same)
    assert bucketing.content_hash(a) != bucketing.content_hash(flipped)
    assert bucketing.content_hash(a) != bucketing.content_hash(bucketing.truncate(a, 19))


# ----------------------------------------------------------------------------- PackingConfig
@pytest.mark.parametrize(
    "bad",
    [
        dict(num_shards=0),
        dict(max_wait_s=0),
        dict(max_wait_s=-1),
        dict(max_wait_s=float("inf")),
        dict(max_wait_s=float("nan")),
        dict(window_s=1.0, max_wait_s=2.0),
        dict(dedup_window_s=0),
        dict(allowed_lateness_s=-1),
        dict(overlong="wrap"),
        dict(content_dedup="yes"),
        dict(filter_zero_signal=1),
    ],
)
def test_packing_config_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        PackingConfig(**bad)


@pytest.mark.parametrize(
    "bad",
    [
        dict(buckets=()),
        dict(buckets=(256, 128)),
        dict(buckets=(128, 128)),
        dict(buckets=(0,)),
        dict(buckets=(128.0,)),
        dict(buckets=(True,)),
        dict(rows=0),
        dict(max_segments_per_row=0),
    ],
)
def test_a_record_layout_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        RecordLayout(**bad)


@pytest.mark.parametrize("rows, bucket", [(4, 40_000), (64, 4096)])
def test_records_pubsub_cannot_carry_are_refused_by_the_job_and_the_packer(rows, bucket):
    why = "message cap"
    layout = RecordLayout((bucket,), rows)
    with pytest.raises(ValueError, match=why):
        PackTrajectoryGroups(PackingConfig(), layout)
    with pytest.raises(ValueError, match=why):
        config.build(RolloutJobConfig, buckets=(bucket,), rows=rows)


def test_the_message_bound_is_an_upper_bound():
    layout = RecordLayout((128, 256, 1024), 4, 3)
    # A record full of long-id trajectories encodes below it.
    shape = layout.shapes[0]
    trajs = [
        dataclasses.replace(make_trajectory(i, shape.seq_len // 3, i), trajectory_id=f"{'r' * 200}/{i}")
        for i in range(shape.max_trajectories)
    ]
    (rec,) = pack(trajs, shape)
    assert len(R.encode(rec)) <= record_bytes_upper_bound(shape)


# ----------------------------------------------------------------------------- flags
BASE = [
    "--requests_subscription=projects/p/subscriptions/s",
    "--records_topic=projects/p/topics/t",
    "--policy_root=/tmp/store",
]


def config_from(*flags) -> PackingConfig:
    return rollout_config(PipelineOptions(BASE + list(flags)).view_as(RolloutOptions)).packing


def test_flags_default_to_one_bucket_of_seq_len():
    flags = ("--seq_len=128", "--rows=2", "--max_segments_per_row=3", "--max_wait_s=1.5")
    job = rollout_config(PipelineOptions(BASE + list(flags)).view_as(RolloutOptions))
    assert job.packing == PackingConfig(max_wait_s=1.5) and job.layout.layout == RecordLayout((128,), 2, 3)


def test_flags_for_every_setting():
    cfg = config_from(
        "--buckets=128,256",
        "--window_s=30",
        "--num_shards=4",
        "--content_dedup",
        "--filter_zero_signal",
        "--overlong=drop",
        "--dedup_window_s=60",
        "--allowed_lateness_s=0",
    )
    assert cfg == PackingConfig(
        window_s=30.0,
        num_shards=4,
        content_dedup=True,
        filter_zero_signal=True,
        overlong="drop",
        dedup_window_s=60.0,
        allowed_lateness_s=0.0,
    )


@pytest.mark.parametrize("flag", ["--buckets=256,128", "--buckets=128,x", "--buckets=128,,256", "--window_s=1"])
def test_bad_flags_are_refused(flag):
    with pytest.raises(ValueError):
        config_from(flag)
