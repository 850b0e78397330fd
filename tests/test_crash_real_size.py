"""Crash safety at real size (issue 39): a learner of SmolLM2-135M's shape, SIGKILLed while
its 1.6 GB checkpoint (params and Adam's state) is being written, restarts from the last
durable step with exactly the params an uninterrupted run had there, and training on from
it gives exactly the uninterrupted run's params. Slow tier: about 135 M parameters on two
cores, a few minutes (docs/TESTING.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from core import config
from tests import _real_size as real
from trainer.config import LearnerJobConfig
from trainer.learning.builder import restore_or_initialise
from trainer.learning.persistence.checkpoint import MANIFEST, LearnerCheckpointer
from trainer.learning.persistence.publisher import learner_state_of

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import pathlib, time
from tests import _real_size as real
from trainer.learning.persistence.checkpoint import LearnerCheckpointer
from trainer.learning.persistence.publisher import learner_state_of
learner, ckpt = real.learner(), LearnerCheckpointer({ckpt!r})
for step in (1, 2, 3):
    learner.train_step([real.record(step)])
    if step == 2:
        ckpt.save(2, learner_state_of(learner), real.meta(2, 2), wait=True)
ckpt.save(3, learner_state_of(learner), real.meta(3, 3))  # async: returns with the write in flight
pathlib.Path({mark!r}).write_text("saving")
time.sleep(600)
"""


def _host(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _killed_mid_save(ckpt: Path, mark: Path) -> float:
    """Seconds from the save's start to the kill."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD.format(ckpt=str(ckpt), mark=str(mark)))],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 900
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"the child exited ({proc.returncode})"
            time.sleep(0.005)
        t0 = time.monotonic()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return time.monotonic() - t0


@pytest.mark.timeout(1800)
def test_a_real_size_learner_killed_mid_save_resumes_with_the_uninterrupted_params(tmp_path):
    ckpt, mark = tmp_path / "ckpt", tmp_path / "mark"
    t0 = time.monotonic()
    _killed_mid_save(ckpt, mark)
    killed_s = time.monotonic() - t0
    assert not (ckpt / "3" / MANIFEST).exists()  # step 3 never became durable

    # The uninterrupted run: the same learner, the same records, no kill.
    learner = real.learner()
    for step in (1, 2):
        learner.train_step([real.record(step)])
    at_2 = _host(learner.params)
    for step in (3, 4):
        learner.train_step([real.record(step)])
    at_4 = _host(learner.params)
    del learner

    resumed = real.learner()
    t1 = time.monotonic()
    with LearnerCheckpointer(ckpt) as checkpointer:
        job = dict(requests_topic="t", records_subscription="s", policy_root=str(tmp_path), env="calculator")
        start = restore_or_initialise(resumed, checkpointer, config.build(LearnerJobConfig, **job))
        restore_s = time.monotonic() - t1
        assert (start.resumed_from_step, start.version) == (2, 2) and checkpointer.all_steps() == [2]  # 3 removed
        assert set(start.consumed_ids) == {real.record(s).record_id for s in (1, 2)}  # 3 comes back: trained again
        for got, want in zip(_host(resumed.params), at_2, strict=True):
            np.testing.assert_array_equal(got, want)
        for step in (3, 4):
            resumed.train_step([real.record(step)])
        for got, want in zip(_host(resumed.params), at_4, strict=True):
            np.testing.assert_array_equal(got, want)
        assert set(learner_state_of(resumed)) == {"params", "opt_state"}
    print(f"killed child: {killed_s:.0f} s; restore of step 2: {restore_s:.1f} s")
