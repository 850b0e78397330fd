"""SIGTERM to a busy rollout job (the demo's teardown, Dataflow draining a worker): exit 143,
the last telemetry row written, and a log that ends clean: no C++ abort from interpreter
shutdown racing the runner's threads ("terminate called ... FATAL: exception not rethrown"),
no traceback."""

from __future__ import annotations

import glob
import os
import signal
import subprocess

import pytest

from core.telemetry import scalars
from tests._rollout_job import STARTUP_S, Job, store_with_v0


def telemetry_rows(job: Job) -> int:
    return sum(len(scalars.read_rows(f)) for f in glob.glob(str(job.logdir / "*" / scalars.JSONL)))


DIRTY = ("terminate called", "FATAL", "exception not rethrown", "Traceback", "core dumped", "Aborted")


@pytest.mark.timeout(400)
def test_sigterm_mid_episode_exits_143_with_a_clean_log(pubsub_emulator, tmp_path):
    # As the demo runs it: many engine slots, so decode threads are inside XLA when it lands.
    with Job(pubsub_emulator, tmp_path, store_with_v0(tmp_path), engine_slots=64) as job:
        job.send("warm-0", "ok", 0)
        job.wait_for("the first group", lambda: job.done("warm-0"), STARTUP_S)
        for i in range(24):  # episodes running and records in flight when the signal lands
            job.send(f"busy-{i}", "ok", 1 + i)
        job.wait_for("a busy job", lambda: job.done("busy-0"), 60)
        rows_before = telemetry_rows(job)
        os.kill(job.group.pid, signal.SIGTERM)
        try:
            rc = job.group.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM not obeyed in 60 s:\n{job.group.log_tail()}")
        log = job.group.log_path.read_text(errors="replace")
    assert rc == 128 + signal.SIGTERM, log[-3000:]
    tail = log[-4000:]
    assert not [d for d in DIRTY if d in tail], tail
    assert log.rstrip().splitlines()[-1].endswith("stopped by signal 15: exit 143"), tail
    assert telemetry_rows(job) > rows_before  # the last row was written on the way out
