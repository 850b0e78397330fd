"""Scalar metrics of one process, in two forms tools read: TensorBoard event files
(tensorboardX, no TensorFlow; a gs:// logdir works, so Vertex AI's TensorBoard shows a
learner writing to AIP_TENSORBOARD_LOG_DIR) and JSONL rows (one per `write`, the same
values, for scripts, the live panel and the run report).

Layout: `<logdir>/<source>/events.out.tfevents.*` and `<logdir>/<source>/metrics.jsonl`,
so `tensorboard --logdir <logdir>` shows the learner, each rollout worker and the
evaluator as runs of one experiment. Names are namespaced: `losses/`, `perf/`, `data/`,
`staleness/`, `feeder/`, `rollout/`, `eval/`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

JSONL = "metrics.jsonl"


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _summary_writer_class():
    """tensorboardX's SummaryWriter, imported here (only processes that write pay for it)
    and without torch: tensorboardX imports torch wherever it is installed (the test extra
    installs it), only to accept torch tensors, which cost each of our processes about 3 s
    and 60 MB. Torch is hidden only while tensorboardX imports, and only if nothing had
    imported it yet."""
    import sys

    hide = "torch" not in sys.modules and "tensorboardX" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter


class ScalarWriter:
    """`write(step, {"losses/policy_loss": 0.1, ...})`: one JSONL row and one TensorBoard
    scalar per value. Non-numeric values (lists, dicts) go to the JSONL row only.

    Both files are written locally; for a gs:// logdir they are staged in a temporary
    directory and copied up whole every `flush_secs` and at close (GCS has no append, and
    tensorboardX's own GCS writer uploads again from its finaliser, after close)."""

    def __init__(self, logdir: str | os.PathLike, source: str, flush_secs: float = 5.0):
        SummaryWriter = _summary_writer_class()

        self.dir = f"{str(logdir).rstrip('/')}/{source}"
        self.source, self.flush_secs = source, flush_secs
        self.remote = "://" in self.dir
        self._local = Path(tempfile.mkdtemp(prefix=f"tb-{source}-")) if self.remote else Path(self.dir)
        self._local.mkdir(parents=True, exist_ok=True)
        self._rows = open(self._local / JSONL, "a", buffering=1)  # closed in close()
        self._tb = SummaryWriter(str(self._local), flush_secs=flush_secs)
        self._lock = threading.Lock()
        self._mirrored = time.monotonic()

    @property
    def local_dir(self) -> Path:
        """Where this process's files are written here (mirrored up whole for a gs:// logdir)."""
        return self._local

    def write(self, step: int, values: dict, wall_time: float | None = None) -> None:
        wall_time = time.time() if wall_time is None else wall_time
        # NaN and inf are not JSON: they become null in the row (and stay out of TensorBoard).
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}
        line = json.dumps({"step": int(step), "wall_time": round(wall_time, 3), **row}, separators=(",", ":"))
        with self._lock:
            self._rows.write(line + "\n")
            for tag, v in values.items():
                if _finite(v):
                    self._tb.add_scalar(tag, v, int(step), walltime=wall_time)
            if self.remote and time.monotonic() - self._mirrored > self.flush_secs:
                self._mirror()

    def _mirror(self) -> None:
        from etils import epath

        self._tb.flush()
        for f in self._local.iterdir():
            epath.Path(f"{self.dir}/{f.name}").write_bytes(f.read_bytes())
        self._mirrored = time.monotonic()

    def close(self) -> None:
        with self._lock:
            self._tb.close()
            self._rows.close()
            if self.remote:
                self._mirror()
                shutil.rmtree(self._local, ignore_errors=True)


class NullWriter:
    local_dir = None  # nothing is written

    def write(self, *a, **k) -> None:
        pass

    def close(self) -> None:
        pass


def make_writer(logdir: str | None, source: str) -> ScalarWriter | NullWriter:
    return ScalarWriter(logdir, source) if logdir else NullWriter()


def read_rows(path: str | os.PathLike) -> list[dict]:
    """A JSONL file's dict rows; [] when absent or unreadable. A line cut short by a crash
    (or still being written), or any other unparsable line, is skipped."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
