"""The fixed shape of every packed record, agreed by both sides: defined here, once.

A run has one *layout*: the same rows and segments per row in every length bucket, and
one record shape [rows, b] per bucket b. The learner's, the rollout job's, the demo's and
the planner's config trees all hold `LayoutConfig` as a section, so the defaults and the
parsing rules exist in this file only.
"""

from __future__ import annotations

import dataclasses
import itertools

from core.config import configclass, knob

# One row of 1024 with up to 16 trajectories: the same 1,024 tokens and 16 trajectories per
# record as the old 4 rows of 256 with 4 each, but first-fit into one long row wastes less
# (calculator oracle lengths: 96.7 % fill against 91.4 %). The learner's attention is banded
# to the trajectory length (core/policy/model/banded_attention.py), so the long row costs what
# the short ones did (docs/BENCHMARKS.md, "Fill").
DEFAULT_ROWS = 1
DEFAULT_SEQ_LEN = 1024
# Bounds the trajectories per record, which the feeder's credit rule relies on.
DEFAULT_MAX_SEGMENTS_PER_ROW = 16
DEFAULT_BUCKETS: tuple[int, ...] = (DEFAULT_SEQ_LEN,)
# The longest episode by default: the tiny policy's context (core.policy.model.config).
DEFAULT_MAX_TRAJECTORY_LEN = 256


def _positive_int(name: str, value) -> None:
    if type(value) is not int or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RecordShape:
    """The fixed [rows, seq_len] shape of one kind of packed record."""

    rows: int = DEFAULT_ROWS
    seq_len: int = DEFAULT_SEQ_LEN
    max_segments_per_row: int = DEFAULT_MAX_SEGMENTS_PER_ROW

    def __post_init__(self):
        for name in ("rows", "seq_len", "max_segments_per_row"):
            _positive_int(name, getattr(self, name))

    @property
    def max_trajectories(self) -> int:
        return self.rows * self.max_segments_per_row

    @property
    def key(self) -> tuple[int, int]:
        return (self.rows, self.seq_len)


@dataclasses.dataclass(frozen=True)
class RecordLayout:
    """Every record shape of a run: one [rows, b] per length bucket b, ascending."""

    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    rows: int = DEFAULT_ROWS
    max_segments_per_row: int = DEFAULT_MAX_SEGMENTS_PER_ROW
    # The longest trajectory (prompt included) an episode may reach: the engine's and the
    # warm start's length. None: DEFAULT_MAX_TRAJECTORY_LEN, or the largest bucket where
    # that is shorter. Rows may be longer than it and pack
    # several trajectories (positions restart per segment, so the model's context is the
    # trajectory, not the row).
    max_trajectory_len: int | None = None

    def __post_init__(self):
        b = self.buckets
        if not isinstance(b, tuple):
            raise ValueError(f"buckets must be a tuple of sequence lengths, got {b!r}")
        if not b:
            raise ValueError("buckets must list at least one sequence length")
        for name, value in (*(("bucket sequence lengths", x) for x in b), ("rows", self.rows)):
            _positive_int(name, value)
        _positive_int("max_segments_per_row", self.max_segments_per_row)
        if any(x >= y for x, y in itertools.pairwise(b)):
            raise ValueError(f"buckets must be strictly increasing (sorted, no duplicates), got {b}")
        if self.max_trajectory_len is not None:
            _positive_int("max_trajectory_len", self.max_trajectory_len)
        if (self.max_trajectory_len or 0) > b[-1]:
            raise ValueError(
                f"max_trajectory_len {self.max_trajectory_len} exceeds the largest bucket {b[-1]}: "
                "such a trajectory would fit no record"
            )

    @property
    def trajectory_len(self) -> int:
        return self.max_trajectory_len or min(self.max_seq_len, DEFAULT_MAX_TRAJECTORY_LEN)

    @property
    def shapes(self) -> tuple[RecordShape, ...]:
        """One record shape per bucket, in bucket order."""
        return tuple(RecordShape(self.rows, s, self.max_segments_per_row) for s in self.buckets)

    @property
    def max_seq_len(self) -> int:
        return self.buckets[-1]

    @property
    def largest(self) -> RecordShape:
        return self.shapes[-1]


@configclass
class LayoutConfig:
    """The record layout's flags, the same for the learner, the rollout job, the demo and
    the planner (each process's config tree holds this section)."""

    rows: int = knob(DEFAULT_ROWS, "rows per packed record", ge=1)
    seq_len: int = knob(DEFAULT_SEQ_LEN, "record row length when --buckets is not given", ge=1)
    max_segments_per_row: int = knob(DEFAULT_MAX_SEGMENTS_PER_ROW, "trajectories packed into one row at most", ge=1)
    buckets: tuple[int, ...] = knob((), "record row lengths, strictly ascending, e.g. 128,256 (empty: --seq_len)", ge=1)
    max_trajectory_len: int | None = knob(
        None, f"the longest episode, prompt included (unset: {DEFAULT_MAX_TRAJECTORY_LEN} or the largest bucket)", ge=1
    )

    def __post_init__(self):
        _ = self.layout  # refused here, at start-up, naming the flag

    @property
    def layout(self) -> RecordLayout:
        return RecordLayout(
            self.buckets or (self.seq_len,), self.rows, self.max_segments_per_row, self.max_trajectory_len
        )

    @classmethod
    def of(cls, layout: RecordLayout) -> LayoutConfig:
        """The flags that give `layout`."""
        return cls(
            layout.rows, layout.max_seq_len, layout.max_segments_per_row, layout.buckets, layout.max_trajectory_len
        )
