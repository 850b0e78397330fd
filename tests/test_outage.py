"""A Pub/Sub outage in the middle of the main job: the emulator's process group is
SIGKILLed while the learner trains. The demo starts it again on the same port (with its
topics and subscriptions, empty: what they held is gone, as in-flight work is in any
outage); the learner backs off and retries; a rollout job that died with it is started
again; requests lost with it are written off and redone once --request_timeout_s passes.
The run completes, and every trajectory is still accounted for."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from core import config
from core.telemetry.scalars import JSONL, read_rows
from localstack.launch.demo import run_local
from localstack.launch.demo_config import DemoConfig


class _Outage(threading.Thread):
    """SIGKILLs the run's emulator once the learner has trained `at_step` steps."""

    def __init__(self, workdir: Path, at_step: int):
        super().__init__(daemon=True)
        self.workdir, self.at_step, self.killed_at_step, self.error = workdir, at_step, None, None

    def run(self):
        try:
            rows_path, deadline = self.workdir / "logs" / "learner" / JSONL, time.monotonic() + 400
            while not (rows := read_rows(rows_path)) or rows[-1]["step"] < self.at_step:
                assert time.monotonic() < deadline, "the learner never reached the step"
                time.sleep(0.2)
            os.killpg(json.loads((self.workdir / "emulator.json").read_text())["pid"], signal.SIGKILL)
            self.killed_at_step = rows[-1]["step"]
        except Exception as e:  # reported by the test
            self.error = e


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_main_job_survives_a_pubsub_outage(tmp_path):
    workdir = tmp_path / "demo"
    outage = _Outage(workdir, at_step=3)
    outage.start()
    s = run_local(
        config.build(
            DemoConfig,
            workdir=str(workdir),
            max_steps=10,
            publish_every=2,
            tool_latency="fixed:0.02",
            policy_poll_s=0.2,
            timeout_s=450,
            warmstart_steps=0,
            eval_n=0,
            batch_records=2,
            group_size=4,
            filter_zero_signal=False,
            plan="off",
            trace=False,
            live="off",
            report=False,  # the async e2e test draws it
            **{"learner.request_timeout_s": 20},
            **{"learner.ack_deadline_s": 20},
            **{"learner.ack_extend_every_s": 5},
        )
    )
    outage.join(timeout=10)
    assert outage.error is None and outage.killed_at_step is not None, outage.error
    assert outage.killed_at_step <= 7  # at least three steps trained after the outage

    assert s.learner.steps == 10 and s.restarts["emulator"] == 1, s.restarts
    # Whether the learner's calls failed (counted, backed off) or only waited depends on where
    # the outage caught them; either way it carried on. Its counts are in the summary.
    assert isinstance(s.learner.pubsub_errors, int) and s.learner.request_publish_errors is not None, s.learner
    acc = s.learner.accounting
    assert acc.balanced, acc
    assert s.reconciliation.reconciled, s.reconciliation
    # What the outage swallowed (requests, records in the topics) is in flight at the end, or
    # was written off after --request_timeout_s and asked again: either way, counted.
    assert acc.written_off >= s.learner.requests_redone, (acc, s.learner.requests_redone)
    emulator_logs = list((workdir / "emulator").glob("emulator-*.log"))
    assert emulator_logs, "the restarted emulator's log"
