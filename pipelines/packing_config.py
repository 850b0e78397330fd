"""PackingConfig: every setting of the packing half of the rollout job, checked once.

Settings that would lose data, never flush, or build records Pub/Sub cannot carry are
refused here, at construction, rather than discovered in a running job.
"""

from __future__ import annotations

import dataclasses
import math

from core.contracts import records
from core.contracts.record_shape import (
    DEFAULT_BUCKETS,
    DEFAULT_MAX_SEGMENTS_PER_ROW,
    DEFAULT_ROWS,
    RecordLayout,
    RecordShape,
)
from pipelines.bucketing import OVERLONG_POLICIES

# Bytes per [row, position] cell on the wire: one entry of each record array.
CELL_BYTES = sum(dt.itemsize for dt in records.ARRAY_SPECS.values())
# The JSON header: a fixed part plus one TrajectoryInfo per segment. 512 bytes per
# segment covers ids of a few hundred characters; the encoder still refuses anything
# bigger, this only keeps a config from promising records that can never be sent.
HEADER_FIXED_BYTES = 1024
HEADER_BYTES_PER_SEGMENT = 512


def record_bytes_upper_bound(shape: RecordShape) -> int:
    header = HEADER_FIXED_BYTES + HEADER_BYTES_PER_SEGMENT * shape.max_trajectories
    return 8 + header + shape.rows * shape.seq_len * CELL_BYTES


@dataclasses.dataclass(frozen=True)
class PackingConfig:
    # Sequence lengths of the record shapes, ascending; every bucket has the same rows
    # and max_segments_per_row, so a record is [rows, buckets[i]].
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    rows: int = DEFAULT_ROWS
    max_segments_per_row: int = DEFAULT_MAX_SEGMENTS_PER_ROW
    # Event-time window: a buffer is flushed at the latest when the watermark passes
    # its window's end; this also bounds how long per-key state lives.
    window_s: float = 60.0
    # Processing time after the first trajectory entered an empty buffer.
    max_wait_s: float = 2.0
    num_shards: int = 1  # packing keys per bucket: spreads one bucket over workers
    dedup_window_s: float = 3600.0  # how long a trajectory id (or content hash) is remembered
    content_dedup: bool = False  # also drop equal token ids + loss mask under another id
    # Off by default. Dropped groups send a drop notice on the records topic, which returns
    # their feeder credits (see README "Credits").
    filter_zero_signal: bool = False
    overlong: str = "truncate"  # longer than the largest bucket: "truncate" | "drop"
    # Elements behind the watermark are still packed (and flushed at once) when their
    # window closed less than this long ago; later ones may be dropped by the runner.
    allowed_lateness_s: float = 3600.0

    def __post_init__(self):
        object.__setattr__(self, "buckets", tuple(self.buckets))
        RecordLayout(self.buckets, self.rows, self.max_segments_per_row)  # the one shape check
        if type(self.num_shards) is not int or self.num_shards <= 0:
            raise ValueError(f"num_shards must be a positive int, got {self.num_shards!r}")
        for name in ("window_s", "max_wait_s", "dedup_window_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive finite number of seconds, got {v!r}")
        lateness = self.allowed_lateness_s
        if isinstance(lateness, bool) or not isinstance(lateness, (int, float)) or not 0 <= lateness < math.inf:
            raise ValueError(f"allowed_lateness_s must be finite and >= 0, got {lateness!r}")
        if self.window_s < self.max_wait_s:
            # The window end would always come first: max_wait_s would be a dead setting.
            raise ValueError(f"window_s ({self.window_s}) must be >= max_wait_s ({self.max_wait_s})")
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {self.overlong!r}")
        for name in ("content_dedup", "filter_zero_signal"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for shape in self.shapes:
            if shape.rows * shape.seq_len > records.MAX_ELEMENTS:
                raise ValueError(
                    f"record shape {shape.rows}x{shape.seq_len} is over {records.MAX_ELEMENTS} cells (rows x seq_len)"
                )
            if record_bytes_upper_bound(shape) > records.MAX_MESSAGE_BYTES:
                raise ValueError(
                    f"a {shape.rows}x{shape.seq_len} record (up to {shape.max_trajectories} trajectories) can take "
                    f"{record_bytes_upper_bound(shape)} bytes, over the {records.MAX_MESSAGE_BYTES}-byte message cap; "
                    f"use fewer rows or a shorter bucket"
                )

    @property
    def layout(self) -> RecordLayout:
        return RecordLayout(self.buckets, self.rows, self.max_segments_per_row)

    @property
    def shapes(self) -> tuple[RecordShape, ...]:
        """One record shape per bucket, in bucket order."""
        return self.layout.shapes

    @property
    def max_seq_len(self) -> int:
        return self.buckets[-1]
