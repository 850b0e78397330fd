"""Where a process writes its scalars and its timeline (core/telemetry)."""

from __future__ import annotations

from core.config import configclass, knob


@configclass
class TelemetryDirs:
    """One TensorBoard run and one trace file per process, under directories the run shares."""

    logdir: str | None = knob(
        None,
        "scalars (TensorBoard event files and metrics.jsonl) under <logdir>/<process>; on Vertex AI the "
        "learner's default is AIP_TENSORBOARD_LOG_DIR (unset: not written)",
    )
    trace_dir: str | None = knob(None, "the process's timeline spans, for Perfetto (unset: off)")
