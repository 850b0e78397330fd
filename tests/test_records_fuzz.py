"""Packed-record decoding under attack: mutated and garbage messages either decode to a
record that satisfies every schema rule (checked against an independent restatement of
the rules) or raise RecordError, and both branches are really taken."""

import collections
import json
import math
import re
import struct

import numpy as np
import pytest
from _records_data import OTHER_BREAKERS, assert_same, make_record, raises
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from core.contracts import records as R
from core.contracts.records import PackedRecord, RecordError


def reference_violation(rec: PackedRecord) -> str | None:
    """The schema's invariants restated cell by cell, independently of records.py: the first one `rec`
    breaks, or None. (Dtypes and shape are the decoder's business and not restated.)"""
    tok, seg, pos, mask = (getattr(rec, n).tolist() for n in ("tokens", "segment_ids", "positions", "loss_mask"))
    lp, adv, pv = rec.behaviour_logprobs.tolist(), rec.advantages.tolist(), rec.policy_versions.tolist()
    if not isinstance(rec.record_id, str) or not 0 < len(rec.record_id) <= R.MAX_RECORD_ID_CHARS:
        return "record_id"
    lengths = {}  # (row, segment id) -> tokens
    for r, row in enumerate(seg):
        ids = []  # the segment id of each run of equal non-zero ids, left to right
        for c, s in enumerate(row):
            if tok[r][c] < 0 or s < 0 or mask[r][c] not in (0, 1):
                return f"token, segment id or loss mask out of range at {r},{c}"
            if not (math.isfinite(lp[r][c]) and math.isfinite(adv[r][c])):
                return f"non-finite float at {r},{c}"
            if mask[r][c] == 1 and (s == 0 or pv[r][c] < 0):
                return f"loss on padding or unversioned generated token at {r},{c}"
            if mask[r][c] == 0 and (lp[r][c] != 0 or adv[r][c] != 0 or pv[r][c] != -1):
                return f"float or version set off the loss mask at {r},{c}"
            if s == 0:
                if pos[r][c] != 0:
                    return f"padding position at {r},{c}"
                continue
            if c == 0 or row[c - 1] != s:
                ids.append(s)
                want = 0
            else:
                want = pos[r][c - 1] + 1
            if pos[r][c] != want:
                return f"position {pos[r][c]} != {want} at {r},{c}"
            lengths[r, s] = lengths.get((r, s), 0) + 1
        if sorted(ids) != list(range(1, len(ids) + 1)):
            return f"row {r} segment ids {ids} are not 1..k, each one contiguous run"
    for t in rec.trajectories:
        if not all(type(getattr(t, k)) is int for k in ("row", "segment", "num_tokens")):
            return "trajectory row/segment/num_tokens not an int"
        if type(t.reward) not in (int, float) or not math.isfinite(t.reward):
            return "trajectory reward"
        if not isinstance(t.trajectory_id, str) or not t.trajectory_id or not isinstance(t.status, str):
            return "trajectory id/status"
    if sorted((t.row, t.segment) for t in rec.trajectories) != sorted(lengths):
        return "trajectories are not one per segment"
    if any(t.num_tokens != lengths[t.row, t.segment] for t in rec.trajectories):
        return "trajectory num_tokens"
    return None


def test_reference_violation_agrees_on_the_hand_made_cases():
    """The oracle used below accepts valid records and refuses the invariant breaks tested above."""
    for seed in range(20):
        assert reference_violation(make_record(seed, 3, 24)) is None
    assert reference_violation(PackedRecord("e", trajectories=[], **R.empty_record_arrays(2, 8))) is None
    rec = make_record(5, 1, 64)
    rec.positions[0, 3] += 5
    assert reference_violation(rec)
    rec = make_record(2, 2, 32)
    r, c = np.argwhere(rec.loss_mask == 0)[0]
    rec.policy_versions[r, c] = 3
    assert reference_violation(rec)
    rec = make_record(2, 2, 32)
    rec.trajectories[-1] = rec.trajectories[0]
    assert reference_violation(rec)
    a = R.empty_record_arrays(1, 6)
    a["segment_ids"][0] = [2, 2, 0, 2, 2, 0]  # as many runs as the largest id, but id 2 twice
    a["positions"][0] = [0, 1, 0, 0, 1, 0]
    assert reference_violation(PackedRecord("s", trajectories=[], **a))
    for breaker, _ in OTHER_BREAKERS:
        rec = make_record(11, 2, 32)
        breaker(rec)
        assert reference_violation(rec)


def _frame(header, body: bytes) -> bytes:
    head = json.dumps(header).encode()  # NaN/Infinity allowed here: the decoder must refuse them
    return R.MAGIC + struct.pack("<I", len(head)) + head + body


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_SMALL = R.encode(make_record(1, 2, 16))
_HEADER = json.loads(_SMALL[8 : 8 + struct.unpack_from("<I", _SMALL, 4)[0]])  # its arrays take 800 bytes
# Framed messages whose header is random JSON: any value, an object with header-like keys, or a real header with
# some fields replaced. The body is too short for any header's arrays, so none of them is a valid record.
_FRAMED_GARBAGE = st.builds(
    _frame,
    st.one_of(
        _JSON,
        st.dictionaries(st.sampled_from(sorted(_HEADER)) | st.text(max_size=6), st.just(1) | _JSON, max_size=7),
        st.fixed_dictionaries({k: st.just(v) | _JSON for k, v in _HEADER.items()}),
    ),
    st.binary(max_size=200),
)


def test_garbage_raises_only_record_error():
    """Random bytes, and framed messages with random JSON headers, are refused with RecordError (no other
    exception, no record), and the refusals come from past the prefix checks too."""
    stages = collections.Counter()

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: b"PKRC" + b), _FRAMED_GARBAGE))
    def check(data):
        with pytest.raises(RecordError) as e:
            R.decode(data)
        msg = str(e.value)
        prefix = re.match(r"truncated record: (\d+ bytes|header)|bad magic|header length", msg)
        stage = "prefix" if prefix else "json" if "JSON" in msg else "deep"
        event(stage)
        stages[stage] += 1

    check()
    assert stages["prefix"] >= 20 and stages["deep"] >= 50, stages  # deep: refused after the header parsed


_VALID_RECORD = make_record(7, 3, 24)
_VALID = R.encode(_VALID_RECORD)
_VALID_BODY = 8 + struct.unpack_from("<I", _VALID, 4)[0]  # where the arrays start


def wire_arrays(data: bytes, rows: int, seq_len: int, start: int) -> dict[str, np.ndarray]:
    """The arrays at their canonical places in `data`, read without the decoder."""
    out = {}
    for name, dt in R.ARRAY_SPECS.items():
        out[name] = np.frombuffer(data, dt, rows * seq_len, start).reshape(rows, seq_len).astype(dt.newbyteorder("="))
        start += rows * seq_len * dt.itemsize
    return out


def _array_byte(name: str, cell: int, byte: int) -> int:
    """The message offset of byte `byte` of element `cell` of array `name` in _VALID."""
    offset = _VALID_BODY
    for other, dt in R.ARRAY_SPECS.items():
        if other == name:
            return offset + cell * dt.itemsize + byte % dt.itemsize
        offset += _VALID_RECORD.tokens.size * dt.itemsize


# (message offset, new byte value): anywhere in the prefix and header, or spread over every array's cells.
_HEADER_EDIT = st.tuples(st.integers(0, _VALID_BODY - 1), st.integers(0, 255))
_ARRAY_EDIT = st.tuples(
    st.builds(
        _array_byte, st.sampled_from(R.ARRAY_NAMES), st.integers(0, _VALID_RECORD.tokens.size - 1), st.integers(0, 3)
    ),
    st.integers(0, 255),
)
# Edits to values that have room to change: tokens, and the floats and versions of generated tokens. These mostly
# keep the record valid (so the decoded branch is well exercised), except e.g. a high byte making a value negative.
_GENERATED_CELLS = np.flatnonzero(_VALID_RECORD.loss_mask).tolist()
_VALUE_EDIT = st.tuples(
    st.one_of(
        st.builds(_array_byte, st.just("tokens"), st.integers(0, _VALID_RECORD.tokens.size - 1), st.integers(0, 3)),
        st.builds(
            _array_byte,
            st.sampled_from(["behaviour_logprobs", "advantages", "policy_versions"]),
            st.sampled_from(_GENERATED_CELLS),
            st.integers(0, 3),
        ),
    ),
    st.integers(0, 255),
)


def test_mutated_record_decodes_valid_or_raises_record_error():
    """Up to 4 bytes of a valid message overwritten anywhere: decode either refuses with RecordError or returns a
    record that holds exactly the bytes sent and keeps every invariant, as judged by `reference_violation`, not by
    records.py. When the edits touch only the arrays, the reference alone says which of the two must happen.
    Both outcomes, with the message really changed, are reached many times."""
    outcomes = collections.Counter()

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(*(st.lists(e, min_size=1, max_size=4) for e in (_HEADER_EDIT, _ARRAY_EDIT, _VALUE_EDIT))))
    def check(edits):
        data = bytearray(_VALID)
        for i, b in edits:
            data[i] = b
        data = bytes(data)
        where = "arrays" if all(i >= _VALID_BODY for i, _ in edits) else "header"
        expected = None
        if where == "arrays":  # the header is intact: the record sent is the original one with these arrays
            sent = PackedRecord(
                _VALID_RECORD.record_id,
                trajectories=list(_VALID_RECORD.trajectories),
                **wire_arrays(data, 3, 24, _VALID_BODY),
            )
            expected = reference_violation(sent)
            note(f"reference: {expected}")
        try:
            out = R.decode(data)
        except RecordError as e:
            note(f"decode: {e}")
            assert where == "header" or expected is not None, f"a valid record was refused: {e}"
            outcome = "refused"
        else:
            assert reference_violation(out) is None, f"decoded an invalid record: {reference_violation(out)}"
            start = 8 + struct.unpack_from("<I", data, 4)[0]
            assert_same(
                out, PackedRecord(out.record_id, trajectories=out.trajectories, **wire_arrays(data, *out.shape, start))
            )
            if where == "arrays":
                assert expected is None, f"decoded a record the reference refuses: {expected}"
                assert R.encode(out) == data  # nothing was normalised away
            assert_same(R.decode(R.encode(out)), out)
            outcome = "decoded"
        changed = "changed" if data != _VALID else "unchanged"
        event(f"{where} {outcome} {changed}")
        outcomes[where, outcome, changed] += 1

    check()
    for key in [("arrays", "decoded", "changed"), ("arrays", "refused", "changed"), ("header", "refused", "changed")]:
        assert outcomes[key] >= 30, outcomes


def test_a_message_over_the_size_cap_is_refused_before_parsing():
    data = R.encode(make_record(0, 4, 64)) + b"\x00" * R.MAX_MESSAGE_BYTES
    raises("over MAX_MESSAGE_BYTES", R.decode, data)
