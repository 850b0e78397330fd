"""Kill the learner mid-run and restart it: it resumes from its checkpoint at the same
policy version, feeder position and dedup set, never trains a record twice, and loses
none: records the killed learner had received but no checkpoint covered come back from
Pub/Sub (they were never acked) and are trained by its successor."""

import os
import signal
import time

import pytest

from core.contracts.run_summary import RunSummary
from core.contracts.store import PolicyStore
from core.telemetry.scalars import read_rows
from localstack.launch.processes import ProcessGroup
from tests import _commands as commands
from trainer.learning.data.consumer import RecordConsumer
from trainer.learning.persistence.checkpoint import LearnerCheckpointer


def _learner_cmd(emu, topics, subs, store, ckpt, max_steps, logdir, summary=None):
    return commands.learner(
        requests_topic=topics["requests"],
        records_subscription=subs["records"],
        policy_root=str(store),
        checkpoint_dir=str(ckpt),
        max_steps=max_steps,
        publish_every=2,
        batch_records=1,
        group_size=4,
        max_staleness=50,
        timeout_s=300,
        env_config={"max_turns": 2},
        # Short deadlines, so what the killed learner held comes back within the test.
        ack_deadline_s=10,
        ack_extend_every_s=3,
        logdir=str(logdir),
        summary_path=summary and str(summary),
        **commands.SMALL_LAYOUT,
    )


def _last_step(logdir) -> int:
    rows = read_rows(logdir / "learner" / "metrics.jsonl")
    return rows[-1]["step"] if rows else 0


def _drain(subscription: str, not_before: float = 0.0) -> set[str]:
    """Record ids left on `subscription`, pulled until it has stayed empty for 3 s and the
    clock has passed `not_before` (when a message pulled by the killed learner is back: its
    ack deadline lapsed)."""
    consumer = RecordConsumer(subscription, {(2, 256)})
    ids, quiet_until = set(), max(time.monotonic() + 3, not_before)
    while time.monotonic() < quiet_until:
        got = consumer.poll(max_messages=100, timeout_s=1.0)
        consumer.settle(got)  # no checkpointer: acked on the next poll
        if got:
            ids |= {r.record_id for r in got}
            quiet_until = max(time.monotonic() + 3, not_before)
    consumer.close()
    return ids


@pytest.mark.timeout(600)
def test_killed_learner_resumes_without_training_a_record_twice(pubsub_emulator, unique_name, tmp_path):
    emu = pubsub_emulator
    names = {k: unique_name(k) for k in ("requests", "records")}
    topics = {k: emu.create_topic(v) for k, v in names.items()}
    subs = {k: emu.create_subscription(v + "-sub", v, ack_deadline_s=10) for k, v in names.items()}
    tap = emu.create_subscription(names["records"] + "-tap", names["records"])  # every record published
    store, ckpt, summary = tmp_path / "store", tmp_path / "ckpt", tmp_path / "summary.json"
    pipeline_cmd = commands.rollout(
        emu.project,
        requests_subscription=subs["requests"],
        records_topic=topics["records"],
        policy_root=str(store),
        **commands.SMALL_LAYOUT,
        **commands.FAST_ROLLOUT,
    )
    with ProcessGroup(pipeline_cmd, tmp_path / "pipeline.log") as pipeline:
        cmd = _learner_cmd(emu, topics, subs, store, ckpt, 1000, tmp_path / "logs1")
        first = ProcessGroup(cmd, tmp_path / "learner1.log").start()
        reader, deadline = None, time.monotonic() + 240
        while time.monotonic() < deadline:
            assert first.poll() is None, first.log_tail()
            if reader is None and ckpt.exists():
                reader = LearnerCheckpointer(ckpt, read_only=True)
            # Killed after training past its checkpoint: records it holds that no checkpoint covers.
            if reader is not None and (reader.latest_step() or 0) >= 4 and _last_step(tmp_path / "logs1") % 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"no checkpoint at step >= 4:\n{first.log_tail()}")
        os.killpg(first.pid, signal.SIGKILL)  # no goodbye: a crash
        first.proc.wait(timeout=30)
        back_by = time.monotonic() + 10 + 2  # what it held is redelivered once its 10 s deadline lapses
        time.sleep(1.0)  # let a save that was in flight either land or not
        reader = LearnerCheckpointer(ckpt, read_only=True)
        step = reader.latest_step()
        meta = reader.read_meta(step)
        latest_before = PolicyStore(str(store)).latest_version()

        received_by_first = read_rows(tmp_path / "logs1" / "learner" / "metrics.jsonl")[-1]["data/records_received"]

        cmd = _learner_cmd(emu, topics, subs, store, ckpt, step + 4, tmp_path / "logs2", summary)
        second = ProcessGroup(cmd, tmp_path / "learner2.log").start()
        while second.poll() is None:
            assert pipeline.poll() is None, pipeline.log_tail()
            time.sleep(0.5)
        assert second.poll() == 0, second.log_tail()
    # The pipeline is stopped: what is left on the learner's subscription is what nobody trained.
    left_over = _drain(subs["records"], not_before=back_by)
    published = _drain(tap)  # nobody pulled these before: all there at once

    s = RunSummary.from_json(summary.read_text())
    assert s.resumed_from_step == step and s.steps == step + 4
    versions = s.policy_versions_published
    if latest_before == meta["learner_version"]:
        assert versions[0] == meta["learner_version"]  # continues at the same version
    else:  # killed between a publish and its checkpoint: restored params get a new number
        assert versions[0] == latest_before + 1
    assert versions == sorted(versions) and len(versions) >= 3
    already = set(meta["consumed_ids"])
    assert already and s.trained_record_ids
    assert already.isdisjoint(s.trained_record_ids)  # nothing trained twice
    # The kill left records the first learner had received but no checkpoint covered ...
    assert received_by_first > len(already)
    # ... and none is lost: each published record is in the checkpoint, trained by the second
    # learner, or still waiting on the subscription for the next one.
    lost = published - already - set(s.trained_record_ids) - left_over
    assert not lost, f"{len(lost)} of {len(published)} records lost"
