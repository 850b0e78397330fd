"""Packed-record schema: round trips, and strict, clear rejection of bad input."""

import dataclasses
import json
import struct

import numpy as np
import pytest
from _records_data import OTHER_BREAKERS, assert_same, make_record, raises, rewrite_header
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts import records as R
from core.contracts.records import PackedRecord, TrajectoryInfo
from core.contracts.trajectory import token_digest


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 8), seq_len=st.integers(1, 96))
def test_round_trip(seed, rows, seq_len):
    rec = make_record(seed, rows, seq_len).validate((rows, seq_len))
    out = R.decode(R.encode(rec), expected_shape=(rows, seq_len))
    assert_same(rec, out)
    assert out.num_tokens == rec.num_tokens == sum(t.num_tokens for t in rec.trajectories)
    for name in R.ARRAY_NAMES:  # decoded arrays are owned and writable, not views of the message
        assert getattr(out, name).flags.writeable


def test_attributes_are_str_and_correct():
    rec = make_record(3, 4, 64, record_id="abc-123")
    attrs = R.attributes(rec)
    assert all(isinstance(v, str) for v in attrs.values())
    gen = rec.loss_mask == 1
    assert attrs == {
        "schema_version": "1",
        "record_id": "abc-123",
        "rows": "4",
        "seq_len": "64",
        "min_policy_version": str(rec.policy_versions[gen].min()),
        "max_policy_version": str(rec.policy_versions[gen].max()),
        "num_tokens": str(int((rec.segment_ids > 0).sum())),
        "num_loss_tokens": str(int(gen.sum())),
        "num_segments": str(len(rec.trajectories)),
    }
    empty = PackedRecord(record_id="e", trajectories=[], **R.empty_record_arrays(2, 8))
    assert R.attributes(empty)["min_policy_version"] == "-1" == R.attributes(empty)["max_policy_version"]
    assert R.decode(R.encode(empty)).num_tokens == 0


def test_rejects_wrong_schema_version():
    data = rewrite_header(R.encode(make_record(1, 2, 16)), lambda h: h.update(schema_version=2))
    raises(r"schema_version: got 2, expected 1", R.decode, data)


def test_rejects_shape_mismatch():
    data = R.encode(make_record(1, 2, 16))
    raises(r"shape mismatch: got \(2, 16\), expected \(2, 32\)", R.decode, data, expected_shape=(2, 32))
    raises(r"shape mismatch", make_record(1, 2, 16).validate, (4, 16))


def test_rejects_wrong_dtype():
    rec = make_record(1, 2, 16)
    rec.tokens = rec.tokens.astype(np.int64)
    raises(r"tokens dtype mismatch", R.encode, rec)
    data = R.encode(make_record(1, 2, 16))
    bad = rewrite_header(data, lambda h: h["arrays"]["advantages"].update(dtype="<f8"))
    raises(r"advantages: dtype mismatch", R.decode, bad)


def test_rejects_bad_layout_and_array_sets():
    data = R.encode(make_record(1, 2, 16))
    raises(r"wrong byte size", R.decode, rewrite_header(data, lambda h: h["arrays"]["tokens"].update(nbytes=4)))
    raises(r"unknown or missing", R.decode, rewrite_header(data, lambda h: h["arrays"].pop("positions")))
    raises(r"unknown or missing", R.decode, rewrite_header(data, lambda h: h["arrays"].update(extra={})))
    raises(r"trailing bytes", R.decode, data + b"\0")
    big = rewrite_header(data, lambda h: h.update(rows=1 << 20, seq_len=1 << 20))
    raises(r"element cap", R.decode, big)


def test_rejects_truncated_and_bad_magic():
    data = R.encode(make_record(1, 2, 16))
    for cut in (0, 3, 7, 20, len(data) - 1):
        raises(r"truncated", R.decode, data[:cut])
    raises(r"bad magic", R.decode, b"XXXX" + data[4:])
    raises(r"header length .* cap", R.decode, b"PKRC" + struct.pack("<I", 1 << 30) + b"{}")
    raises(r"expected bytes", R.decode, "not bytes")


@pytest.mark.parametrize("name", ["behaviour_logprobs", "advantages"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_rejects_non_finite(name, value):
    rec = make_record(2, 2, 32)
    r, c = np.argwhere(rec.loss_mask == 1)[0]
    getattr(rec, name)[r, c] = value
    raises(r"non-finite", R.encode, rec)
    # The same bytes arriving on the wire (bypassing encode's check) are refused too.
    good = make_record(2, 2, 32)
    data = bytearray(R.encode(good))
    hlen = struct.unpack_from("<I", data, 4)[0]
    spec = json.loads(data[8 : 8 + hlen])["arrays"][name]
    at = 8 + hlen + spec["offset"] + 4 * (r * 32 + c)
    data[at : at + 4] = np.float32(value).tobytes()
    raises(r"non-finite", R.decode, bytes(data))


def test_rejects_positions_not_restarting():
    rec = make_record(5, 1, 64)
    assert rec.segment_ids.max() >= 2 or pytest.skip("need two segments")
    start = int(np.argmax(rec.segment_ids[0] == 2))
    rec.positions[0, start:][rec.segment_ids[0, start:] == 2] += 1  # continues from 1, not 0
    raises(r"restart at 0", rec.validate)
    rec = make_record(5, 1, 64)
    rec.positions[0, 3] += 5
    raises(r"consecutive", rec.validate)


def test_rejects_loss_on_padding_and_bad_versions():
    rec = make_record(0, 2, 32)
    rec.segment_ids[:, -1] = 0  # make sure the last column is padding
    rec.positions[:, -1] = 0
    rec.loss_mask[0, -1] = 1
    raises(r"loss_mask must be 0 on padding", rec.validate)
    rec = make_record(2, 2, 32)
    r, c = np.argwhere(rec.loss_mask == 1)[0]
    rec.policy_versions[r, c] = -1
    raises(r"policy_versions must be >= 0", rec.validate)
    rec = make_record(2, 2, 32)
    r, c = np.argwhere(rec.loss_mask == 0)[0]
    rec.policy_versions[r, c] = 3
    raises(r"policy_versions must be -1", rec.validate)


def test_rejects_inconsistent_trajectories():
    rec = make_record(2, 2, 32)
    assert rec.trajectories
    rec.trajectories = rec.trajectories[:-1]
    raises(r"trajectories listed but", rec.validate)
    rec = make_record(2, 2, 32)
    t = rec.trajectories[0]
    rec.trajectories[0] = TrajectoryInfo(t.trajectory_id, t.row, t.segment, t.num_tokens + 1, t.reward, t.status)
    raises(r"num_tokens", rec.validate)
    rec = make_record(2, 2, 32)
    assert len(rec.trajectories) >= 2
    rec.trajectories[-1] = rec.trajectories[0]
    raises(r"two trajectories claim", rec.validate)
    rec = make_record(2, 2, 32)
    t = rec.trajectories[0]
    rec.trajectories[0] = TrajectoryInfo(t.trajectory_id, t.row, 99, t.num_tokens, t.reward, t.status)
    raises(r"not present", rec.validate)


@pytest.mark.parametrize("field,value", [("reward", "1.5"), ("row", True), ("trajectory_id", 7), ("status", None)])
def test_rejects_mistyped_trajectory_fields(field, value):
    data = R.encode(make_record(2, 2, 32))
    raises(
        rf"trajectory.*{field}|{field}.*must",
        R.decode,
        rewrite_header(data, lambda h: h["trajectories"][0].update({field: value})),
    )


def test_rejects_huge_integer_reward():
    data = R.encode(make_record(2, 2, 32))
    raises(r"reward", R.decode, rewrite_header(data, lambda h: h["trajectories"][0].update(reward=10**400)))


@pytest.mark.parametrize("name", ["behaviour_logprobs", "advantages"])
def test_rejects_float_values_off_the_loss_mask(name):
    rec = make_record(2, 2, 32)
    r, c = np.argwhere(rec.loss_mask == 0)[0]
    getattr(rec, name)[r, c] = -0.5
    raises(rf"{name} must be 0 where loss_mask is 0", rec.validate)


@pytest.mark.parametrize("breaker,match", OTHER_BREAKERS)
def test_rejects_other_invariant_violations(breaker, match):
    rec = make_record(11, 2, 32)
    breaker(rec)
    raises(match, rec.validate)


def test_rejects_split_segment():
    a = R.empty_record_arrays(1, 6)
    a["segment_ids"][0] = [1, 1, 2, 2, 1, 1]  # segment 1 appears twice
    a["positions"][0] = [0, 1, 0, 1, 0, 1]
    rec = PackedRecord("s", trajectories=[], **a)
    raises(r"1..k", rec.validate)


def test_rejects_too_large_message():
    # 32 x 8192 elements at 22 bytes each is ~5.8 MB, over the 4 MB cap.
    rec = PackedRecord("big", trajectories=[], **R.empty_record_arrays(32, 8192))
    raises(r"over MAX_MESSAGE_BYTES", R.encode, rec)


def _with_digests(rec):
    """The record with every trajectory's digest of what it holds (as the packer writes it)."""
    arrays = rec.arrays()
    rec.trajectories = [
        dataclasses.replace(
            t, digest=token_digest(R.segment_of(arrays, t, "tokens"), R.segment_of(arrays, t, "loss_mask"))
        )
        for t in rec.trajectories
    ]
    return rec


def test_a_token_or_mask_changed_after_sampling_is_refused_naming_the_trajectory():
    rec = _with_digests(make_record(5, 4, 64))
    assert all(t.digest for t in rec.trajectories)
    assert_same(R.decode(R.encode(rec)), rec)  # intact: the digests match
    t = rec.trajectories[0]
    tokens = rec.tokens.copy()
    col = int(np.flatnonzero(rec.segment_ids[t.row] == t.segment)[-1])
    rec.tokens[t.row, col] += 1  # one token off, as a re-tokenisation would do
    raises(f"trajectory '{t.trajectory_id}'.*differ from what was sampled", rec.validate)
    rec.tokens = tokens
    gen = np.flatnonzero((rec.segment_ids[t.row] == t.segment) & (rec.loss_mask[t.row] == 1))
    if gen.size:  # the loss moved off one sampled token
        rec.loss_mask[t.row, gen[0]] = 0
        rec.behaviour_logprobs[t.row, gen[0]] = rec.advantages[t.row, gen[0]] = 0
        rec.policy_versions[t.row, gen[0]] = -1
        raises("differ from what was sampled", rec.validate)


def test_records_without_digests_still_decode():
    rec = make_record(6, 2, 32)
    data = R.encode(rec)
    stripped = rewrite_header(data, lambda h: [t.pop("digest") for t in h["trajectories"]])
    assert_same(R.decode(stripped), rec)
    raises("digest must be a str", R.decode, rewrite_header(data, lambda h: h["trajectories"][0].update(digest=7)))


def test_refusals_name_what_is_wrong():
    """Mutation testing (make mutation) found these two messages unchecked."""
    data = R.encode(make_record(2, 2, 32))
    raises(
        r"header contains NaN, not valid JSON here",
        R.decode,
        rewrite_header(data, lambda h: h.update({"note": float("nan")})),  # json.dumps writes NaN
    )
    raises(
        r"trajectory entry must have exactly the TrajectoryInfo fields, got \{.*'extra': 1",
        R.decode,
        rewrite_header(data, lambda h: h["trajectories"][0].update({"extra": 1})),
    )
