"""Run in a subprocess with 8 virtual CPU devices: one learner step per mesh layout.
Prints JSON {layout: {"loss", "grad_norm", "params": [a few flattened values]}}."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(__file__))

import jax
import numpy as np
from _learner_data import random_record
from flax import nnx

from core.policy.model.config import ModelConfig
from trainer.learning.step.learner import Learner, LearnerConfig
from trainer.learning.step.sharding import make_mesh

assert jax.device_count() == 8, jax.devices()
cfg = ModelConfig(max_seq_len=64, n_heads=4, n_kv_heads=2)
records = [random_record(1), random_record(2)]
out = {}
for layout in ["single", "8x1", "4x2", "2x4"]:
    mesh = None if layout == "single" else make_mesh(*map(int, layout.split("x")))
    learner = Learner(cfg, LearnerConfig(batch_records=2, learning_rate=1e-2), mesh=mesh)
    _, grads = learner.loss_and_grads(records)
    grads = [np.asarray(x).ravel() for x in jax.tree.leaves(nnx.to_pure_dict(grads))]
    metrics = learner.train_step(records)
    leaves = [np.asarray(x).ravel() for x in jax.tree.leaves(nnx.to_pure_dict(learner.params))]
    shard_counts = sorted({len(x.sharding.device_set) for x in jax.tree.leaves(learner.params)})
    out[layout] = {
        "loss": metrics["losses/policy_loss"],
        "grad_norm": metrics["losses/grad_norm"],
        "grads": np.concatenate(grads).tolist(),
        "params": np.concatenate(leaves).tolist(),
        "devices_per_param": shard_counts,
    }
print(json.dumps(out))
