"""Kill the learner mid-run and restart it: it resumes from its checkpoint at the same
policy version, feeder position and dedup set, and never trains a record twice."""

import json
import os
import signal
import sys
import time

import pytest

from localstack.processes import ProcessGroup
from trainer.contracts.store import PolicyStore
from trainer.learning.checkpoint import LearnerCheckpointer


def _learner_cmd(emu, topics, subs, store, ckpt, max_steps, summary=None):
    return [
        sys.executable,
        "-m",
        "trainer.task",
        f"--requests_topic={topics['requests']}",
        f"--records_subscription={subs['records']}",
        f"--policy_root={store}",
        f"--checkpoint_dir={ckpt}",
        f"--max_steps={max_steps}",
        "--publish_every=2",
        "--batch_records=1",
        "--rows=2",
        "--seq_len=256",
        "--group_size=4",
        "--max_staleness=50",
        "--timeout_s=300",
        '--env_config={"max_turns": 2}',
        *([f"--summary_path={summary}"] if summary else []),
    ]


@pytest.mark.timeout(600)
def test_killed_learner_resumes_without_training_a_record_twice(pubsub_emulator, unique_name, tmp_path):
    emu = pubsub_emulator
    names = {k: unique_name(k) for k in ("requests", "records")}
    topics = {k: emu.create_topic(v) for k, v in names.items()}
    subs = {k: emu.create_subscription(v + "-sub", v) for k, v in names.items()}
    store, ckpt, summary = tmp_path / "store", tmp_path / "ckpt", tmp_path / "summary.json"
    pipeline_cmd = [
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
    with ProcessGroup(pipeline_cmd, tmp_path / "pipeline.log") as pipeline:
        first = ProcessGroup(_learner_cmd(emu, topics, subs, store, ckpt, 1000), tmp_path / "learner1.log").start()
        reader, deadline = None, time.monotonic() + 240
        while time.monotonic() < deadline:
            assert first.poll() is None, first.log_tail()
            if reader is None and ckpt.exists():
                reader = LearnerCheckpointer(ckpt, read_only=True)
            if reader is not None and (reader.latest_step() or 0) >= 4:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no checkpoint at step >= 4:\n{first.log_tail()}")
        os.killpg(first.pid, signal.SIGKILL)  # no goodbye: a crash
        first.proc.wait(timeout=30)
        time.sleep(1.0)  # let a save that was in flight either land or not
        reader = LearnerCheckpointer(ckpt, read_only=True)
        step = reader.latest_step()
        meta = reader.read_meta(step)
        latest_before = PolicyStore(str(store)).latest_version()

        second = ProcessGroup(
            _learner_cmd(emu, topics, subs, store, ckpt, step + 4, summary), tmp_path / "learner2.log"
        ).start()
        while second.poll() is None:
            assert pipeline.poll() is None, pipeline.log_tail()
            time.sleep(0.5)
        assert second.poll() == 0, second.log_tail()

    s = json.loads(summary.read_text())
    assert s["resumed_from_step"] == step and s["steps"] == step + 4
    versions = s["policy_versions_published"]
    if latest_before == meta["learner_version"]:
        assert versions[0] == meta["learner_version"]  # continues at the same version
    else:  # killed between a publish and its checkpoint: restored params get a new number
        assert versions[0] == latest_before + 1
    assert versions == sorted(versions) and len(versions) >= 3
    already = set(meta["consumed_ids"])
    assert already and s["trained_record_ids"]
    assert already.isdisjoint(s["trained_record_ids"])  # nothing trained twice
