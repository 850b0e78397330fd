"""The mixed-precision step (bf16 weights and activations, float32 params, optimizer state,
logits and loss) against the float32 step on the same batch: the loss, the gradient's norm
and direction, and the policy's log-probs within stated tolerances; and nothing it keeps
leaves float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _learner_data import random_record

from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model
from trainer.learning.step.gradients import ComputeConfig
from trainer.learning.step.learner import Learner, LearnerConfig
from trainer.learning.step.losses import LossConfig

# Wide enough that bf16's 8-bit mantissa is exercised by real dot products.
CFG = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=384, max_seq_len=64, vocab_size=300)
RECORDS = [random_record(1, vocab=300), random_record(2, vocab=300)]
# Stated tolerances: bf16 rounds each operand to about 3 significant digits; sums stay f32.
LOSS_RTOL, GRAD_NORM_RTOL, MIN_GRAD_COSINE = 0.02, 0.05, 0.99


def _learner(dtype: str) -> Learner:
    compute = ComputeConfig(dtype=dtype, remat="off", micro_batches=1)
    lcfg = LearnerConfig(batch_records=2, compute=compute, loss=LossConfig())
    return Learner(CFG, lcfg, model=init_model(CFG, 0))


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])


def test_the_bfloat16_step_matches_the_float32_step_within_tolerance():
    (loss32, m32), g32 = _learner("float32").loss_and_grads(RECORDS)
    (loss16, m16), g16 = _learner("bfloat16").loss_and_grads(RECORDS)
    assert abs(float(loss16) - float(loss32)) <= LOSS_RTOL * abs(float(loss32)), (loss16, loss32)
    n32, n16 = float(optax.tree.norm(g32)), float(optax.tree.norm(g16))
    assert n32 > 0 and abs(n16 - n32) <= GRAD_NORM_RTOL * n32, (n16, n32)
    a, b = _flat(g32), _flat(g16)
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= MIN_GRAD_COSINE
    # The policy's entropy (a mean over every trained token's full softmax) agrees too.
    np.testing.assert_allclose(float(m16["losses/entropy"]), float(m32["losses/entropy"]), rtol=0.01)


def test_a_bfloat16_step_keeps_params_and_optimizer_state_in_float32():
    learner = _learner("bfloat16")
    before = jax.tree.map(np.array, learner.params)
    metrics = learner.train_step(RECORDS)
    assert np.isfinite(metrics["losses/grad_norm"]) and metrics["losses/skipped_nonfinite"] == 0
    for tree in (learner.params, learner.opt_state):
        floats = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
        assert floats and all(x.dtype == jnp.float32 for x in floats)
    after = jax.tree.leaves(learner.params)
    assert max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(after, jax.tree.leaves(before))) > 0
