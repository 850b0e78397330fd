"""A run in which nothing can ever train stops early and says why (the real stack: the
emulator, the rollout job and the learner as the demo starts them).

A random policy never solves a calculator task, so every group scores all zero and the
zero-signal filter drops it: the learner gets drop notices and no record, names that,
and stops at --starved_stop_s instead of at its timeout."""

import time

import pytest

from core import config
from localstack.launch.demo import DemoFailed, run_local
from localstack.launch.demo_config import DemoConfig
from localstack.reports.live import RunState

pytestmark = pytest.mark.e2e


def test_a_run_whose_every_group_is_dropped_stops_early_naming_the_cause(tmp_path):
    args = config.build(
        DemoConfig,
        workdir=str(tmp_path / "run"),
        env="calculator",
        max_steps=2,
        batch_records=1,
        group_size=4,
        warmstart_steps=0,  # random init: reward 0 everywhere
        tool_latency="none",
        policy_poll_s=0.2,
        timeout_s=600,
        eval_n=0,
        plan="off",
        live="off",
        trace=False,
        **{"learner.starved_warn_s": 5.0, "learner.starved_stop_s": 10.0, "learner.starved_min_dropped": 8},
    )
    started = time.monotonic()
    with pytest.raises(DemoFailed) as failed:
        run_local(args)
    assert time.monotonic() - started < 240  # not the 600 s timeout
    message = str(failed.value)
    assert "learner exited with 1" in message and "nothing can train: no record for" in message, message
    assert "dropped by the pipeline: zero_signal" in message and "equal rewards" in message, message
    # the live panel showed the learner's reason while it waited
    state = RunState(tmp_path / "run", 2)
    state.refresh()
    assert state.waiting and state.waiting.startswith("nothing can train"), state.waiting
