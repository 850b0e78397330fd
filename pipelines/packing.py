"""Packing trajectories into fixed [rows, seq_len] records (first-fit decreasing).

A row holds whole trajectories only (no segment crosses a row), at most
`max_segments_per_row` of them; segment ids count 1..k within the row and
positions restart at 0 in each segment.
"""

from __future__ import annotations

import hashlib

import numpy as np

from core.contracts.record_shape import RecordShape
from core.contracts.records import PackedRecord, TrajectoryInfo, empty_record_arrays
from core.contracts.trajectory import Trajectory, token_digest


def first_fit_decreasing(
    lengths: list[int], seq_len: int, max_per_row: int, tie_keys: list[str] | None = None
) -> list[list[int]]:
    """Assigns item indices to bins of capacity seq_len; returns the bins (lists of indices).
    Equal lengths are ordered by tie_keys, so the result does not depend on arrival order."""
    bins: list[list[int]] = []
    free: list[int] = []
    keys = tie_keys or [""] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], keys[i])):
        if lengths[i] > seq_len:
            raise ValueError(f"trajectory of {lengths[i]} tokens cannot fit a row of {seq_len}")
        for b, room in enumerate(free):
            if room >= lengths[i] and len(bins[b]) < max_per_row:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(seq_len - lengths[i])
    return bins


def pack(trajectories: list[Trajectory], shape: RecordShape) -> list[PackedRecord]:
    """All trajectories into as few records as first-fit decreasing allows; the last
    record may be partly padding."""
    rows = _rows(trajectories, shape)
    return [build_record(trajectories, rows[i : i + shape.rows], shape) for i in range(0, len(rows), shape.rows)]


def take_full_records(
    trajectories: list[Trajectory], shape: RecordShape
) -> tuple[list[PackedRecord], list[Trajectory]]:
    """Streaming step: records that are as full as they will get, plus the leftovers to
    keep buffering. A record is ready when the buffer overflows it (FFD puts the longest
    trajectories first) or when every row already holds its maximum segment count."""
    rows = _rows(trajectories, shape)
    ready = []
    while len(rows) > shape.rows or (
        len(rows) == shape.rows and all(len(r) == shape.max_segments_per_row for r in rows)
    ):
        ready.append(build_record(trajectories, rows[: shape.rows], shape))
        rows = rows[shape.rows :]
    return ready, [trajectories[i] for row in rows for i in row]


def _rows(trajectories: list[Trajectory], shape: RecordShape) -> list[list[int]]:
    return first_fit_decreasing(
        [len(t) for t in trajectories],
        shape.seq_len,
        shape.max_segments_per_row,
        [t.trajectory_id for t in trajectories],
    )


def build_record(trajectories: list[Trajectory], rows: list[list[int]], shape: RecordShape) -> PackedRecord:
    a = empty_record_arrays(shape.rows, shape.seq_len)
    infos = []
    for r, members in enumerate(rows):
        start = 0
        for seg, i in enumerate(members, start=1):
            t = trajectories[i]
            end = start + len(t)
            a["tokens"][r, start:end] = t.tokens
            a["segment_ids"][r, start:end] = seg
            a["positions"][r, start:end] = np.arange(len(t))
            a["loss_mask"][r, start:end] = t.loss_mask
            a["behaviour_logprobs"][r, start:end] = np.where(t.loss_mask == 1, t.behaviour_logprobs, 0.0)
            a["advantages"][r, start:end] = np.where(t.loss_mask == 1, t.advantage, 0.0)
            a["policy_versions"][r, start:end] = np.where(t.loss_mask == 1, t.policy_versions, -1)
            digest = t.sampled_digest or token_digest(t.tokens, t.loss_mask)
            infos.append(TrajectoryInfo(t.trajectory_id, r, seg, len(t), float(t.reward), t.status, digest))
            start = end
    # Same trajectories -> same id, so a re-packed redelivery is recognisably a duplicate.
    record_id = hashlib.sha1("|".join(sorted(i.trajectory_id for i in infos)).encode()).hexdigest()[:24]
    return PackedRecord(record_id=record_id, trajectories=infos, **a).validate((shape.rows, shape.seq_len))
