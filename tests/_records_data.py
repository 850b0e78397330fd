"""Packed records for the schema tests: a random valid record, comparisons, header edits
and hand-made invariant breaks."""

import json
import struct

import numpy as np
import pytest

from core.contracts import records as R
from core.contracts.records import PackedRecord, RecordError, TrajectoryInfo


def make_record(seed: int, rows: int, seq_len: int, record_id: str = "rec-0") -> PackedRecord:
    """Packs random trajectories (prompt/tool spans then generated spans) into rows."""
    rng = np.random.default_rng(seed)
    a = R.empty_record_arrays(rows, seq_len)
    trajs = []
    for row in range(rows):
        col, seg = 0, 0
        while col < seq_len and rng.random() < 0.85:  # some rows stay empty or part-filled
            n = int(rng.integers(1, seq_len - col + 1))
            seg += 1
            sl = slice(col, col + n)
            a["tokens"][row, sl] = rng.integers(0, 50_000, n)
            a["segment_ids"][row, sl] = seg
            a["positions"][row, sl] = np.arange(n)
            gen = (rng.random(n) < 0.6).astype(np.uint8)
            gen[0] = 0  # every trajectory starts with a prompt token
            a["loss_mask"][row, sl] = gen
            g = gen == 1
            a["behaviour_logprobs"][row, sl] = np.where(g, -rng.exponential(1.0, n), 0).astype(np.float32)
            a["advantages"][row, sl] = np.where(g, rng.normal(size=n), 0).astype(np.float32)
            a["policy_versions"][row, sl] = np.where(g, rng.integers(0, 7, n), -1)
            trajs.append(TrajectoryInfo(f"t{row}.{seg}", row, seg, n, float(rng.normal()), "finished"))
            col += n
    return PackedRecord(record_id=record_id, trajectories=trajs, **a)


def assert_same(a: PackedRecord, b: PackedRecord):
    assert a.record_id == b.record_id and a.trajectories == b.trajectories
    for name in R.ARRAY_NAMES:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def raises(match, fn, *args, **kw):
    with pytest.raises(RecordError, match=match):
        fn(*args, **kw)


def rewrite_header(data: bytes, edit) -> bytes:
    """Returns `data` with its JSON header passed through `edit` (arrays untouched)."""
    hlen = struct.unpack_from("<I", data, 4)[0]
    header = json.loads(data[8 : 8 + hlen])
    edit(header)
    new = json.dumps(header).encode()
    return data[:4] + struct.pack("<I", len(new)) + new + data[8 + hlen :]


def _break_padding_position(rec):
    rec.segment_ids[0, -1] = 0
    rec.positions[0, -1] = 0
    rec.loss_mask[0, -1] = 0
    rec.behaviour_logprobs[0, -1] = rec.advantages[0, -1] = 0
    rec.policy_versions[0, -1] = -1
    rec.trajectories = []  # checked after the arrays; not reached
    rec.positions[0, -1] = 4


OTHER_BREAKERS = [
    (lambda r: r.segment_ids.__setitem__((0, 0), -1), r"segment_ids must be >= 0"),
    (lambda r: r.loss_mask.__setitem__((0, 1), 2), r"loss_mask values must be 0 or 1"),
    (lambda r: r.tokens.__setitem__((0, 0), -3), r"tokens must be >= 0"),
    (_break_padding_position, r"positions must be 0 on padding"),
]
