"""One train step moves the policy the way the advantages say: up for tokens with a
positive advantage, down for a negative one, and not at all when every advantage is 0."""

import jax
import numpy as np
from _learner_data import random_record
from flax import nnx

from core.policy.model.config import ModelConfig
from core.policy.model.transformer import token_logprobs
from trainer.learning.step.learner import Learner, LearnerConfig


def logprobs(learner: Learner, rec) -> np.ndarray:
    model = nnx.merge(learner.graphdef, learner.params)
    logits = model(rec.tokens, rec.segment_ids, rec.positions)
    return np.asarray(token_logprobs(logits, rec.tokens))


def on_policy_record(learner: Learner, seed: int, advantage_of_segment) -> object:
    """A record whose behaviour log-probs are the learner's own (ratio 1: the clip is idle)
    and whose advantage is a function of each token's segment id."""
    rec = random_record(seed, rows=4, seq_len=64, vocab=264)
    generated = rec.loss_mask == 1
    rec.behaviour_logprobs = np.where(generated, logprobs(learner, rec), 0).astype(np.float32)
    rec.advantages = np.where(generated, advantage_of_segment(rec.segment_ids), 0).astype(np.float32)
    return rec.validate()


def test_step_raises_positive_and_lowers_negative_advantage_tokens():
    learner = Learner(ModelConfig(max_seq_len=64), LearnerConfig(batch_records=1, learning_rate=1e-2))
    rec = on_policy_record(learner, 3, lambda seg: np.where(seg % 2 == 1, 1.0, -1.0))
    before = logprobs(learner, rec)
    metrics = learner.train_step([rec])
    after = logprobs(learner, rec)
    assert metrics["losses/grad_norm"] > 0 and metrics["losses/skipped_nonfinite"] == 0
    gen = rec.loss_mask == 1
    up, down = gen & (rec.advantages > 0), gen & (rec.advantages < 0)
    assert up.sum() > 20 and down.sum() > 20
    assert after[up].mean() > before[up].mean() + 1e-3
    assert after[down].mean() < before[down].mean() - 1e-3
    # On-policy batch: every ratio is 1, so the clip took no part in this step.
    assert metrics["losses/clipfrac"] == 0.0


def test_step_with_all_advantages_zero_changes_nothing():
    learner = Learner(ModelConfig(max_seq_len=64), LearnerConfig(batch_records=1, learning_rate=1e-2))
    rec = on_policy_record(learner, 4, lambda seg: np.zeros_like(seg, dtype=np.float32))
    params_before = [np.asarray(x).copy() for x in jax.tree.leaves(nnx.to_pure_dict(learner.params))]
    metrics = learner.train_step([rec])
    params_after = [np.asarray(x) for x in jax.tree.leaves(nnx.to_pure_dict(learner.params))]
    assert metrics["losses/grad_norm"] == 0.0
    for a, b in zip(params_before, params_after):
        np.testing.assert_array_equal(a, b)
