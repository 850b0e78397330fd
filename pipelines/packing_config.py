"""PackingConfig: every setting of the packing half of the rollout job, checked once.

Settings that would lose data, never flush, or build records Pub/Sub cannot carry are
refused here, at construction, rather than discovered in a running job. A section of the
rollout job's config tree (pipelines/config.py).
"""

from __future__ import annotations

from core.config import configclass, knob
from core.contracts import records
from core.contracts.record_shape import RecordLayout, RecordShape
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


def check_records_fit_messages(layout: RecordLayout) -> None:
    """Refuses a layout whose records Pub/Sub could not carry (the rollout job's config
    and every packer check it)."""
    for shape in layout.shapes:
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


@configclass
class PackingConfig:
    """Each field is a flag of the rollout job. The record shapes are the job's record
    layout section's (--buckets, --rows, --max_segments_per_row), handed to the packer
    beside this section (PackTrajectoryGroups)."""

    # A buffer is flushed at the latest when the watermark passes its window's end; this
    # also bounds how long per-key state lives.
    window_s: float = knob(60.0, "event-time packing window: buffers are flushed at its end", gt=0)
    # Processing time after the first trajectory entered an empty buffer.
    max_wait_s: float = knob(2.0, "a partly filled record is flushed after this long", gt=0)
    num_shards: int = knob(1, "packing keys per length bucket", ge=1)  # spreads one bucket over workers
    dedup_window_s: float = knob(3600.0, "how long a trajectory id (or content hash) is remembered", gt=0)
    # Bools default to False: Beam re-creates options on workers from a dict in which True
    # becomes a bare --flag and False is dropped.
    content_dedup: bool = knob(False, "also drop trajectories with equal tokens + loss mask under another id")
    # Dropped groups send a drop notice on the records topic, which returns their feeder
    # credits (docs/ARCHITECTURE.md, "Credits").
    filter_zero_signal: bool = knob(
        False,
        "drop groups whose rewards are all equal: their advantages are all 0, so they carry no gradient and "
        "only dilute it (a drop notice returns their credits)",
    )
    overlong: str = knob(
        "truncate", "a trajectory longer than the largest bucket is truncated or dropped", choices=OVERLONG_POLICIES
    )
    # Elements behind the watermark are still packed (and flushed at once) when their
    # window closed less than this long ago; later ones may be dropped by the runner.
    allowed_lateness_s: float = knob(
        3600.0, "late trajectories within this of their window's end are still packed", ge=0
    )

    def __post_init__(self):
        if self.window_s < self.max_wait_s:
            # The window end would always come first: max_wait_s would be a dead setting.
            raise ValueError(f"window_s ({self.window_s}) must be >= max_wait_s ({self.max_wait_s})")
