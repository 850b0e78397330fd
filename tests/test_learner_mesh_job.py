"""What runs is what is tested: the learner job (`python -m trainer.task`) trains end to
end on a (data=4, model=2) mesh of 8 virtual CPU devices, from records on the real
Pub/Sub emulator, and publishes policy versions that load back."""

import os
import time

import jax
import numpy as np
import pytest
from _learner_data import random_record
from flax import nnx

from core.contracts import pubsub_io
from core.contracts.record_shape import LayoutConfig
from core.contracts.records import attributes, encode
from core.contracts.run_summary import RunSummary
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import abstract_tree, init_model, split_params
from localstack.launch.commands import learner_command
from localstack.launch.processes import ProcessGroup
from trainer.config import LearnerJobConfig
from trainer.learning.data.staleness import StalenessConfig
from trainer.learning.step.learner import LearnerConfig

STEPS, RECORDS = 4, 6


@pytest.mark.timeout(600)
def test_learner_job_trains_on_a_4x2_mesh_of_virtual_devices(pubsub_emulator, unique_name, tmp_path):
    emu = pubsub_emulator
    requests, records = unique_name("requests"), unique_name("records")
    emu.create_topic(requests)
    records_topic = emu.create_topic(records)
    sub = emu.create_subscription(records + "-sub", records)
    publisher = pubsub_io.publisher_client()
    published = []
    for i in range(RECORDS):  # 4 rows of 64: the batch's rows split over the data axis
        rec = random_record(1000 + i, rows=4, seq_len=64)
        pubsub_io.publish(publisher, records_topic, encode(rec), **attributes(rec)).result(timeout=30)
        published.append(rec.record_id)

    store, summary_path = tmp_path / "store", tmp_path / "summary.json"
    cfg = LearnerJobConfig(
        requests_topic=emu.topic_path(requests),
        records_subscription=sub,
        policy_root=str(store),
        mesh="data=4,model=2",
        max_steps=STEPS,
        timeout_s=240.0,
        summary_path=str(summary_path),
        layout=LayoutConfig(rows=4, seq_len=64, max_segments_per_row=3),
        learner=LearnerConfig(batch_records=1, publish_every=2),
        staleness=StalenessConfig(max_staleness=50),
    )
    cmd = learner_command(cfg)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    with ProcessGroup(cmd, tmp_path / "learner.log", env) as learner:
        deadline = time.monotonic() + 300
        while learner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert learner.poll() == 0, learner.log_tail()

    summary = RunSummary.from_json(summary_path.read_text())
    assert summary.mesh == {"data": 4, "model": 2}
    assert summary.steps == STEPS
    assert summary.compiled_train_steps == 1  # one shape, one compile, on the mesh too
    assert summary.policy_versions_published == [0, 1, 2]
    assert set(summary.trained_record_ids) <= set(published)
    assert len(summary.trained_record_ids) == STEPS  # batch_records=1: one record per step
    assert summary.last_metrics["losses/skipped_nonfinite"] == 0.0
    # The versions the mesh learner wrote load back as plain params, and training moved them.
    target = abstract_tree(nnx.to_pure_dict(split_params(init_model(ModelConfig(), 0))[1]))
    store = PolicyStore(store)
    assert store.latest_version() == 2
    v0, v2 = store.load(0, target), store.load(2, target)
    moved = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(v0), jax.tree.leaves(v2))]
    assert any(moved)
