"""Kill the rollout pipeline mid-run (SIGKILL: a preempted worker) and start a new one:
the learner finishes its run. The local runner acks requests as it reads them, so the
episodes that were running died with the pipeline; the learner writes their requests off
after --request_timeout_s and asks again, and every trajectory is accounted for."""

import json
import os
import signal
import sys
import time

import pytest

from localstack.processes import ProcessGroup
from trainer.telemetry.scalars import read_rows


def _pipeline_cmd(emu, subs, topics, store):
    return [
        sys.executable,
        "-m",
        "pipelines.rollout",
        "--runner=BundleBasedDirectRunner",
        "--streaming",
        f"--project={emu.project}",
        f"--requests_subscription={subs['requests']}",
        f"--records_topic={topics['records']}",
        f"--policy_root={store}",
        "--rows=2",
        "--seq_len=256",
        "--engine_slots=16",
        "--max_wait_s=0.5",
        "--commit_interval_s=0.1",
        "--policy_poll_s=0.2",
    ]


@pytest.mark.timeout(600)
def test_a_killed_pipeline_is_replaced_and_its_lost_requests_are_redone(pubsub_emulator, unique_name, tmp_path):
    emu = pubsub_emulator
    names = {k: unique_name(k) for k in ("requests", "records")}
    topics = {k: emu.create_topic(v) for k, v in names.items()}
    subs = {k: emu.create_subscription(v + "-sub", v, ack_deadline_s=10) for k, v in names.items()}
    store, logdir, summary = tmp_path / "store", tmp_path / "logs", tmp_path / "summary.json"
    learner_cmd = [
        sys.executable,
        "-m",
        "trainer.task",
        f"--requests_topic={topics['requests']}",
        f"--records_subscription={subs['records']}",
        f"--policy_root={store}",
        f"--checkpoint_dir={tmp_path / 'ckpt'}",
        "--max_steps=8",
        "--publish_every=2",
        "--batch_records=1",
        "--rows=2",
        "--seq_len=256",
        "--group_size=4",
        "--max_staleness=50",
        "--timeout_s=400",
        "--request_timeout_s=20",
        # Slow tools: episodes are still running when the pipeline is killed.
        '--env_config={"max_turns": 2, "tool_latency": "fixed:1.0"}',
        f"--logdir={logdir}",
        f"--summary_path={summary}",
    ]
    pipeline_cmd = _pipeline_cmd(emu, subs, topics, store)
    learner = ProcessGroup(learner_cmd, tmp_path / "learner.log").start()
    try:
        with ProcessGroup(pipeline_cmd, tmp_path / "pipeline1.log") as first:
            deadline = time.monotonic() + 300
            while not _rows(logdir) or _rows(logdir)[-1]["step"] < 2:
                assert learner.poll() is None, learner.log_tail()
                assert first.poll() is None, first.log_tail()
                assert time.monotonic() < deadline, "the learner did not reach step 2"
                time.sleep(0.5)
            os.killpg(first.pid, signal.SIGKILL)  # no goodbye: a preempted worker
            first.proc.wait(timeout=30)
        killed_at_step = _rows(logdir)[-1]["step"]
        with ProcessGroup(pipeline_cmd, tmp_path / "pipeline2.log") as second:
            while learner.poll() is None:
                assert second.poll() is None, second.log_tail()
                time.sleep(0.5)
        assert learner.poll() == 0, learner.log_tail()
    finally:
        learner.stop()

    s = json.loads(summary.read_text())
    assert s["steps"] == 8 and killed_at_step < 8
    acc = s["accounting"]
    assert acc["balanced"], acc
    # Episodes died with the first pipeline: their requests were written off and asked again.
    assert acc["written_off"] >= s["requests_redone"] > 0, s
    assert "written off, asked again" in (tmp_path / "learner.log").read_text()


def _rows(logdir):
    return read_rows(logdir / "learner" / "metrics.jsonl")
