"""First-fit-decreasing packing of trajectories into fixed [rows, seq_len] records.

Property tests over random trajectories check every invariant of the packed-record
contract against the trajectories that went in, plus the streaming step
(`take_full_records`) and deterministic record ids.
"""

import collections
import dataclasses
import hashlib
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.contracts import records as R
from core.contracts.record_shape import RecordShape
from core.contracts.trajectory import Trajectory, token_digest
from pipelines.packing import build_record, first_fit_decreasing, pack, take_full_records

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_trajectory(i: int, n: int, seed: int, garbage_off_mask: bool = True) -> Trajectory:
    """A random trajectory of n tokens; mask 0 on the first (prompt) token.

    With garbage_off_mask, behaviour log-probs/versions carry nonsense where the mask is 0:
    the packer must not let it through (the record schema wants 0 / -1 there)."""
    rng = np.random.default_rng(seed)
    mask = (rng.random(n) < 0.6).astype(np.uint8)
    mask[0] = 0
    gen = mask == 1
    logp = -rng.exponential(1.0, n).astype(np.float32)
    versions = rng.integers(0, 9, n).astype(np.int32)
    if not garbage_off_mask:
        logp = np.where(gen, logp, 0).astype(np.float32)
        versions = np.where(gen, versions, -1).astype(np.int32)
    adv = float(rng.choice([0.0, rng.normal(), -abs(rng.normal()) * 3]))
    return Trajectory(
        trajectory_id=f"req{i // 4}/{i % 4}",
        request_id=f"req{i // 4}",
        task_id=f"task{i}",
        tokens=rng.integers(0, 50_000, n).astype(np.int32),
        loss_mask=mask,
        behaviour_logprobs=logp,
        policy_versions=versions,
        reward=float(rng.normal()),
        status=str(rng.choice(["finished", "truncated", "env_error", "timeout"])),
        advantage=adv,
    )


@st.composite
def shapes(draw):
    return RecordShape(
        rows=draw(st.integers(2, 4)), seq_len=draw(st.integers(16, 64)), max_segments_per_row=draw(st.integers(1, 3))
    )


@st.composite
def cases(draw, max_trajectories: int = 30):
    shape = draw(shapes())
    # Skew towards short trajectories sometimes, so rows hit max_segments_per_row.
    hi = draw(st.sampled_from([shape.seq_len, max(1, shape.seq_len // 3)]))
    lengths = draw(st.lists(st.integers(1, hi), min_size=0, max_size=max_trajectories))
    seed = draw(st.integers(0, 2**32 - 1))
    garbage = draw(st.booleans())
    trajs = [make_trajectory(i, n, seed + i, garbage) for i, n in enumerate(lengths)]
    return shape, trajs


# ----------------------------------------------------------------------------- checks
def check_record(rec: R.PackedRecord, shape: RecordShape, by_id: dict) -> list[tuple]:
    """Asserts every record invariant against the source trajectories; returns the
    (trajectory_id, position, token) triples it holds."""
    assert rec.shape == (shape.rows, shape.seq_len)
    for name, dt in R.ARRAY_SPECS.items():
        arr = getattr(rec, name)
        assert arr.shape == (shape.rows, shape.seq_len), name
        assert arr.dtype == dt, name
    seg, pos, mask = rec.segment_ids, rec.positions, rec.loss_mask
    pad = seg == 0
    # Padding: no loss, zero log-probs/advantages, version -1, position 0.
    assert (mask[pad] == 0).all()
    assert (rec.behaviour_logprobs[pad] == 0).all() and (rec.advantages[pad] == 0).all()
    assert (rec.policy_versions[pad] == -1).all()
    assert (pos[pad] == 0).all() and (rec.tokens[pad] == 0).all()
    off = mask == 0
    assert (rec.behaviour_logprobs[off] == 0).all() and (rec.advantages[off] == 0).all()
    assert (rec.policy_versions[off] == -1).all()

    infos = {(t.row, t.segment): t for t in rec.trajectories}
    assert len(infos) == len(rec.trajectories), "two infos claim one (row, segment)"
    triples = []
    for r in range(shape.rows):
        ids = seg[r][seg[r] > 0]
        # Segment ids in a row: 1..k, in order, each a contiguous run; padding only at the end.
        k = int(seg[r].max())
        assert k <= shape.max_segments_per_row
        runs = [int(v) for j, v in enumerate(ids) if j == 0 or ids[j - 1] != v]
        assert runs == list(range(1, k + 1)), f"row {r} segment runs {runs}"
        assert (seg[r][: ids.size] > 0).all() and (seg[r][ids.size :] == 0).all()
        for s in range(1, k + 1):
            cols = np.nonzero(seg[r] == s)[0]
            info = infos.pop((r, s))
            t = by_id[info.trajectory_id]
            n = len(t)
            assert cols.size == n == info.num_tokens
            assert info.reward == t.reward and info.status == t.status
            np.testing.assert_array_equal(pos[r, cols], np.arange(n))
            np.testing.assert_array_equal(rec.tokens[r, cols], t.tokens)
            np.testing.assert_array_equal(mask[r, cols], t.loss_mask)
            gen = t.loss_mask == 1
            np.testing.assert_array_equal(
                rec.behaviour_logprobs[r, cols], np.where(gen, t.behaviour_logprobs, 0).astype(np.float32)
            )
            np.testing.assert_array_equal(
                rec.advantages[r, cols], np.where(gen, np.float32(t.advantage), 0).astype(np.float32)
            )
            np.testing.assert_array_equal(rec.policy_versions[r, cols], np.where(gen, t.policy_versions, -1))
            triples += [(t.trajectory_id, p, int(tok)) for p, tok in enumerate(rec.tokens[r, cols])]
    assert not infos, f"TrajectoryInfo entries without a segment: {infos}"
    # Wire round trip with the agreed shape.
    back = R.decode(R.encode(rec), (shape.rows, shape.seq_len))
    assert back.record_id == rec.record_id and back.trajectories == rec.trajectories
    for name in R.ARRAY_NAMES:
        np.testing.assert_array_equal(getattr(back, name), getattr(rec, name), err_msg=name)
    return triples


def token_multiset(trajs) -> collections.Counter:
    return collections.Counter((t.trajectory_id, p, int(tok)) for t in trajs for p, tok in enumerate(t.tokens))


def check_records(recs, shape, trajs) -> collections.Counter:
    by_id = {t.trajectory_id: t for t in trajs}
    out = collections.Counter()
    for rec in recs:
        out.update(check_record(rec, shape, by_id))
    return out


# ----------------------------------------------------------------------------- first_fit_decreasing
def test_first_fit_decreasing_by_hand():
    assert first_fit_decreasing([10, 6, 6, 4, 4], 16, 2) == [[0, 1], [2, 3], [4]]
    assert first_fit_decreasing([10, 6, 6, 4, 4], 16, 3) == [[0, 1], [2, 3, 4]]
    assert first_fit_decreasing([10, 6, 6, 4, 4], 16, 1) == [[0], [1], [2], [3], [4]]
    assert first_fit_decreasing([3, 16, 5], 16, 4) == [[1], [2, 0]]
    assert first_fit_decreasing([], 16, 2) == []


@PROPS
@given(lengths=st.lists(st.integers(1, 40), max_size=40), seq_len=st.integers(40, 64), per=st.integers(1, 4))
def test_first_fit_decreasing_bins_are_valid(lengths, seq_len, per):
    bins = first_fit_decreasing(lengths, seq_len, per)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert 1 <= len(b) <= per
        assert sum(lengths[i] for i in b) <= seq_len
    # First fit: a bin is only opened when the item fits no earlier bin; so every pair of
    # bins that both have room for more segments could not be merged.
    for a in range(len(bins)):
        for c in range(a + 1, len(bins)):
            if len(bins[a]) + len(bins[c]) <= per:
                assert sum(lengths[i] for i in bins[a] + bins[c]) > seq_len


# ----------------------------------------------------------------------------- pack
@PROPS
@given(cases())
def test_pack_keeps_every_token_once_and_every_invariant(case):
    shape, trajs = case
    recs = pack(trajs, shape)
    assert check_records(recs, shape, trajs) == token_multiset(trajs)
    # Each trajectory appears in exactly one TrajectoryInfo.
    ids = [t.trajectory_id for rec in recs for t in rec.trajectories]
    assert sorted(ids) == sorted(t.trajectory_id for t in trajs)
    # As few records as the FFD rows allow, and no record is all padding.
    n_rows = len(first_fit_decreasing([len(t) for t in trajs], shape.seq_len, shape.max_segments_per_row))
    assert len(recs) == -(-n_rows // shape.rows)
    assert all(rec.num_tokens > 0 for rec in recs)


def test_pack_of_nothing_is_no_records():
    assert pack([], RecordShape(rows=2, seq_len=16, max_segments_per_row=2)) == []


def test_pack_by_hand():
    shape = RecordShape(rows=2, seq_len=16, max_segments_per_row=2)
    trajs = [make_trajectory(i, n, i) for i, n in enumerate([10, 6, 6, 4, 4])]
    recs = pack(trajs, shape)
    assert len(recs) == 2
    first, second = recs
    assert [(t.trajectory_id, t.row, t.segment, t.num_tokens) for t in first.trajectories] == [
        ("req0/0", 0, 1, 10),
        ("req0/1", 0, 2, 6),
        ("req0/2", 1, 1, 6),
        ("req0/3", 1, 2, 4),
    ]
    np.testing.assert_array_equal(first.segment_ids[0], [1] * 10 + [2] * 6)
    np.testing.assert_array_equal(first.positions[0], list(range(10)) + list(range(6)))
    np.testing.assert_array_equal(first.segment_ids[1], [1] * 6 + [2] * 4 + [0] * 6)
    assert [(t.trajectory_id, t.row, t.segment) for t in second.trajectories] == [("req1/0", 0, 1)]
    assert (second.segment_ids[1] == 0).all() and (second.policy_versions[1] == -1).all()
    assert second.num_tokens == 4


def test_trajectory_longer_than_a_row_is_refused_clearly():
    shape = RecordShape(rows=2, seq_len=16, max_segments_per_row=2)
    trajs = [make_trajectory(0, 5, 0), make_trajectory(1, 17, 1)]
    with pytest.raises(ValueError, match=r"17 tokens cannot fit a row of 16"):
        pack(trajs, shape)
    with pytest.raises(ValueError, match=r"17 tokens cannot fit a row of 16"):
        take_full_records(trajs, shape)
    # Exactly seq_len is fine.
    (rec,) = pack([make_trajectory(2, 16, 2)], shape)
    assert rec.num_tokens == 16


def test_trajectory_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="loss_mask has 2 entries, tokens has 3"):
        Trajectory(
            "r/0",
            "r",
            "t",
            np.zeros(3, np.int32),
            np.zeros(2, np.uint8),
            np.zeros(3, np.float32),
            np.full(3, -1, np.int32),
            0.0,
            "finished",
        )


# ----------------------------------------------------------------------------- record ids
@PROPS
@given(cases(max_trajectories=12), st.randoms(use_true_random=False))
def test_record_id_ignores_order_within_one_record(case, rnd):
    shape, trajs = case
    lengths = [len(t) for t in trajs]
    if not trajs or len(first_fit_decreasing(lengths, shape.seq_len, shape.max_segments_per_row)) > shape.rows:
        return  # only cases that fit one record
    shuffled = list(trajs)
    rnd.shuffle(shuffled)
    (a,), (b,) = pack(trajs, shape), pack(shuffled, shape)
    assert a.record_id == b.record_id
    assert re.fullmatch(r"[0-9a-f]{24}", a.record_id), a.record_id


def test_build_record_id_depends_only_on_which_trajectories():
    shape = RecordShape(rows=2, seq_len=32, max_segments_per_row=3)
    trajs = [make_trajectory(i, 5 + i, i) for i in range(4)]
    a = build_record(trajs, [[0, 1], [2, 3]], shape)
    b = build_record(trajs, [[3], [2, 1, 0]], shape)
    c = build_record(trajs, [[0, 1], [2]], shape)
    assert a.record_id == b.record_id
    assert c.record_id != a.record_id


def test_build_record_id_is_the_stable_hash_of_its_trajectory_ids():
    """The id is a contract across releases: a pipeline updated mid-run re-packs a redelivery
    to the id the learner has already seen (pinned, not only consistent within one run)."""
    shape = RecordShape(rows=1, seq_len=32, max_segments_per_row=3)
    trajs = [make_trajectory(i, 5, i) for i in range(2)]
    rec = build_record(trajs, [[1, 0]], shape)
    assert rec.record_id == hashlib.sha1(b"req0/0|req0/1").hexdigest()[:24]


def test_each_trajectory_s_digest_is_what_it_sampled_or_computed_from_its_tokens():
    """The learner checks a trained row's tokens against this digest (records.py): the
    episode's own digest when it has one, else the digest of the tokens packed."""
    shape = RecordShape(rows=1, seq_len=32, max_segments_per_row=3)
    computed, carried = make_trajectory(0, 6, 0), make_trajectory(1, 7, 1)
    carried = dataclasses.replace(carried, sampled_digest=token_digest(carried.tokens, carried.loss_mask))
    rec = build_record([computed, carried], [[0, 1]], shape)
    assert [i.digest for i in rec.trajectories] == [
        token_digest(computed.tokens, computed.loss_mask),
        carried.sampled_digest,
    ]


@PROPS
@given(cases(max_trajectories=20), st.randoms(use_true_random=False))
def test_record_ids_ignore_input_order_across_records(case, rnd):
    """The same set of trajectories, packed again in another order (a redelivery),
    must give the same records, so the consumer can recognise the duplicates."""
    shape, trajs = case
    shuffled = list(trajs)
    rnd.shuffle(shuffled)
    ids_a = sorted(r.record_id for r in pack(trajs, shape))
    ids_b = sorted(r.record_id for r in pack(shuffled, shape))
    assert ids_a == ids_b
    assert len(set(ids_a)) == len(ids_a)  # records of different trajectories never share an id


def test_record_ids_with_equal_lengths_in_another_order():
    """Concrete instance of the property above: four equal-length trajectories, two per row."""
    shape = RecordShape(rows=1, seq_len=16, max_segments_per_row=2)
    trajs = [make_trajectory(i, 8, i) for i in range(4)]
    reordered = [trajs[0], trajs[2], trajs[1], trajs[3]]
    ids_a = sorted(r.record_id for r in pack(trajs, shape))
    ids_b = sorted(r.record_id for r in pack(reordered, shape))
    assert ids_a == ids_b


# ----------------------------------------------------------------------------- take_full_records
@PROPS
@given(cases(max_trajectories=30))
def test_take_full_records_keeps_everything_and_only_emits_full_records(case):
    shape, trajs = case
    ready, rest = take_full_records(trajs, shape)
    # Nothing lost, nothing duplicated: ready tokens + leftover tokens == input tokens.
    out = check_records(ready, shape, trajs) + token_multiset(rest)
    assert out == token_multiset(trajs)
    assert sorted(t.trajectory_id for t in rest) == sorted(
        set(t.trajectory_id for t in trajs) - {i.trajectory_id for r in ready for i in r.trajectories}
    )

    bins = first_fit_decreasing([len(t) for t in trajs], shape.seq_len, shape.max_segments_per_row)
    overflow = len(bins) > shape.rows
    all_max = len(bins) == shape.rows and all(len(b) == shape.max_segments_per_row for b in bins)
    if ready:
        assert overflow or all_max
    else:
        assert not overflow and not all_max
    # Every ready record uses all its rows.
    for rec in ready:
        assert all((rec.segment_ids[r] > 0).any() for r in range(shape.rows))
    # The leftovers alone never fill more than one record.
    rest_bins = first_fit_decreasing([len(t) for t in rest], shape.seq_len, shape.max_segments_per_row)
    assert len(rest_bins) <= shape.rows
    assert len(rest) < shape.rows * shape.max_segments_per_row


@PROPS
@given(cases(max_trajectories=30))
def test_take_full_records_leftovers_are_stable(case):
    """Feeding the leftovers back (what the stateful packer does on the next element)
    emits nothing new and keeps them all."""
    shape, trajs = case
    _, rest = take_full_records(trajs, shape)
    ready2, rest2 = take_full_records(rest, shape)
    assert ready2 == []
    assert sorted(t.trajectory_id for t in rest2) == sorted(t.trajectory_id for t in rest)


def test_take_full_records_waits_until_full():
    shape = RecordShape(rows=2, seq_len=16, max_segments_per_row=2)
    trajs = [make_trajectory(i, 8, i) for i in range(4)]
    # 3 x 8 tokens: two rows, not every row at max segments -> keep buffering.
    assert take_full_records(trajs[:3], shape)[0] == []
    # 4 x 8: every row holds its maximum 2 segments -> one full record, nothing left.
    ready, rest = take_full_records(trajs, shape)
    assert len(ready) == 1 and rest == [] and ready[0].num_tokens == 32
    # Rows full of tokens but under the segment cap wait for an overflow...
    big = [make_trajectory(10 + i, 16, i) for i in range(3)]
    assert take_full_records(big[:2], shape)[0] == []
    # ...which the third 16-token trajectory brings: the first two go, one is left.
    ready, rest = take_full_records(big, shape)
    assert len(ready) == 1 and len(rest) == 1
    assert {t.trajectory_id for t in ready[0].trajectories} | {rest[0].trajectory_id} == {t.trajectory_id for t in big}


def test_take_full_records_streaming_simulation():
    """Trajectories arrive one at a time; buffer = leftovers. At the end, ready records
    plus a final pack() of the buffer hold every token exactly once."""
    rnd = random.Random(7)
    shape = RecordShape(rows=3, seq_len=32, max_segments_per_row=2)
    trajs = [make_trajectory(i, rnd.randint(1, 32), i) for i in range(200)]
    buffer, emitted = [], []
    for t in trajs:
        ready, buffer = take_full_records(buffer + [t], shape)
        emitted += ready
        assert len(buffer) < shape.max_trajectories
    emitted += pack(buffer, shape)
    assert check_records(emitted, shape, trajs) == token_multiset(trajs)
