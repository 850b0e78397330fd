"""A learner of SmolLM2-135M-Instruct's shape (random weights, 135 M parameters, a 1.6 GB
checkpoint with Adam's state) and the records it trains on, built the same way in the
test and in the child process the test kills mid-save (tests/test_crash_real_size.py)."""

from __future__ import annotations

from core.policy.model.config import ModelConfig
from tests._learner_data import random_record
from trainer.learning.step.learner import Learner, LearnerConfig

SMOLLM2_SHAPE = ModelConfig(
    vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, mlp_dim=1536, max_seq_len=256
)


def learner() -> Learner:
    return Learner(SMOLLM2_SHAPE, LearnerConfig(batch_records=1, learning_rate=1e-4, seed=0))


def record(step: int):
    return random_record(step, rows=2, seq_len=128, vocab=SMOLLM2_SHAPE.vocab_size)


def meta(version: int, steps: int) -> dict:
    """What Publisher.checkpoint writes: the version, feeder position and dedup set."""
    return {
        "learner_version": version,
        "feeder_position": steps,
        "consumed_ids": {record(s).record_id: 0 for s in range(1, steps + 1)},
    }
