"""Kill the rollout pipeline mid-run (SIGKILL: a preempted worker) and start a new one:
the learner finishes its run. Episodes running in the killed job are gone; their requests
come back from Pub/Sub if the runner had not acked them yet, and otherwise the learner
writes them off after --request_timeout_s and asks again. Every trajectory is accounted for."""

import os
import signal
import time

import pytest

import environments
from core.contracts import pubsub_io
from core.contracts.rollout_request import RolloutRequest
from core.contracts.run_summary import RunSummary
from core.telemetry.scalars import read_rows
from localstack.launch.processes import ProcessGroup
from tests import _commands as commands
from trainer.learning.data.feeder import Feeder, TrajectoryCredits


def _pipeline_cmd(emu, subs, topics, store):
    return commands.rollout(
        emu.project,
        requests_subscription=subs["requests"],
        records_topic=topics["records"],
        policy_root=str(store),
        **commands.SMALL_LAYOUT,
        **commands.FAST_ROLLOUT,
    )


@pytest.mark.timeout(600)
def test_a_killed_pipeline_is_replaced_and_its_lost_requests_are_redone(pubsub_emulator, unique_name, tmp_path):
    emu = pubsub_emulator
    names = {k: unique_name(k) for k in ("requests", "records")}
    topics = {k: emu.create_topic(v) for k, v in names.items()}
    subs = {k: emu.create_subscription(v + "-sub", v, ack_deadline_s=10) for k, v in names.items()}
    store, logdir, summary = tmp_path / "store", tmp_path / "logs", tmp_path / "summary.json"
    learner_cmd = commands.learner(
        requests_topic=topics["requests"],
        records_subscription=subs["records"],
        policy_root=str(store),
        checkpoint_dir=str(tmp_path / "ckpt"),
        max_steps=8,
        publish_every=2,
        batch_records=1,
        group_size=4,
        max_staleness=50,
        timeout_s=400,
        request_timeout_s=20,
        # Slow tools: episodes are still running when the pipeline is killed.
        env_config={"max_turns": 2, "tool_latency": "fixed:1.0"},
        logdir=str(logdir),
        summary_path=str(summary),
        **commands.SMALL_LAYOUT,
    )
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

    s = RunSummary.from_json(summary.read_text())
    assert s.steps == 8 and killed_at_step < 8
    acc = s.accounting
    assert acc.balanced, acc
    # Requests the killed job had taken either came back from Pub/Sub to the new job (not
    # acked yet) or were written off after --request_timeout_s and asked again; which, depends
    # on where the kill caught them (test_a_request_that_never_comes_back_is_asked_again).
    assert acc.written_off >= s.requests_redone and acc.late <= acc.written_off, acc
    assert ("written off, asked again" in (tmp_path / "learner.log").read_text()) == (s.requests_redone > 0)


def _tasks(requests) -> list[dict]:
    return sorted((r.task for r in requests), key=lambda t: t["task_id"])


@pytest.mark.timeout(120)
def test_a_request_that_never_comes_back_is_asked_again(pubsub_emulator, unique_name):
    """No rollout job at all: every request is lost. After the timeout the feeder writes
    each off (its credits back) and publishes its prompt again under a new id."""
    emu = pubsub_emulator
    name = unique_name("requests")
    topic, sub = emu.create_topic(name), emu.create_subscription(name + "-sub", name)
    tasks = environments.make_tasks("calculator", 0, 3, "train")
    credits = TrajectoryCredits(8, request_timeout_s=1.0)  # two requests of 4
    feeder = Feeder(topic, tasks, credits, 4, "calculator")
    feeder.start()
    try:
        first = _pull_requests(emu, sub, 2)
        assert credits.outstanding == 8 and feeder.redo_timed_out() == 0  # not timed out yet
        time.sleep(1.2)
        assert feeder.redo_timed_out() == 2 and credits.written_off == 8
        again = _pull_requests(emu, sub, 2)
    finally:
        feeder.stop()
    assert _tasks(again) == _tasks(first)  # the same prompts (Pub/Sub keeps no order) ...
    assert not {r.request_id for r in again} & {r.request_id for r in first}  # ... as new requests
    assert feeder.redone == 2 and feeder.published == 2 and credits.outstanding == 8
    credits.returned(f"{first[0].request_id}/{i}" for i in range(4))  # the slow worker, after all
    assert credits.late == 4 and credits.outstanding == 8


def _pull_requests(emu, sub, n, timeout_s=30):
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        msgs = pubsub_io.pull(emu.subscriber(), sub, n - len(got), timeout_s=1.0)
        pubsub_io.ack(emu.subscriber(), sub, [m.ack_id for m in msgs])
        got += [RolloutRequest.from_bytes(m.message.data) for m in msgs]
    return got


def _rows(logdir):
    return read_rows(logdir / "learner" / "metrics.jsonl")
