"""The learner step: sharding equivalence on 8 virtual devices, zero recompiles."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from _learner_data import random_record

from core.policy.model.config import ModelConfig
from trainer.learning.step.learner import Learner, LearnerConfig

HERE = os.path.dirname(__file__)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_meshes_give_the_same_loss_gradients_and_update_as_one_device():
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "_sharding_probe.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    base = out["single"]
    assert base["loss"] != 0 and base["grad_norm"] > 0
    for layout in ("8x1", "4x2", "2x4"):
        got = out[layout]
        np.testing.assert_allclose(got["loss"], base["loss"], rtol=1e-5, err_msg=layout)
        np.testing.assert_allclose(got["grad_norm"], base["grad_norm"], rtol=1e-4, err_msg=layout)
        np.testing.assert_allclose(
            got["grads"], base["grads"], rtol=1e-4, atol=1e-6, err_msg=layout
        )  # float32 sums in another order
        # Adam's first step is lr * g / (|g| + eps): near-zero gradients can round either
        # way, so the updated weights agree to within the learning rate, not bit for bit.
        diff = np.abs(np.asarray(got["params"]) - np.asarray(base["params"]))
        assert np.mean(diff > 2e-5) < 1e-3 and diff.max() <= 2 * 1e-2, layout
    assert out["8x1"]["devices_per_param"] == [8]  # replicated over the data axis
    assert max(out["2x4"]["devices_per_param"]) == 8 and out["2x4"] != out["8x1"]


def test_fifty_steps_of_varied_data_compile_once():
    learner = Learner(ModelConfig(max_seq_len=64), LearnerConfig(batch_records=2))
    for step in range(50):
        learner.train_step([random_record(2 * step), random_record(2 * step + 1)])
    assert learner.steps == 50
    assert learner.compiled_variants() == 1


def test_wrong_batch_size_is_refused():
    learner = Learner(ModelConfig(max_seq_len=64), LearnerConfig(batch_records=2))
    with pytest.raises(ValueError, match="expected 2 records"):
        learner.train_step([random_record(0)])


def test_kl_to_reference_and_loss_choices_train():
    """Each algorithm and the KL term run through the real jitted step; the KL to the
    reference is 0 before the first update and positive after a few."""
    from trainer.learning.step.losses import LossConfig

    records = [random_record(7), random_record(8)]
    for loss in (
        LossConfig(),
        LossConfig(algorithm="gspo_token", aggregation="seq-mean-token-mean"),
        LossConfig(algorithm="decoupled_ppo", tis_cap=2.0, aggregation="seq-mean-token-sum"),
        LossConfig(kl_coef=0.1, kl_estimator="k3"),
    ):
        learner = Learner(ModelConfig(max_seq_len=64), LearnerConfig(batch_records=2, learning_rate=1e-2, loss=loss))
        if loss.kl_coef:
            with pytest.raises(ValueError, match="reference"):
                learner.train_step(records)
            learner.set_reference(learner.params)
        first = learner.train_step(records)
        for _ in range(3):
            last = learner.train_step(records)
        assert np.isfinite(last["losses/policy_loss"]) and last["losses/skipped_nonfinite"] == 0
        if loss.kl_coef:
            assert first["losses/kl_ref"] == pytest.approx(0.0, abs=1e-6) and last["losses/kl_ref"] > 1e-6


def test_non_finite_update_is_skipped_and_counted():
    learner = Learner(ModelConfig(max_seq_len=64), LearnerConfig(batch_records=1))
    rec = random_record(3)
    before = [np.asarray(x).copy() for x in jax.tree.leaves(learner.params)]
    # The record decoder refuses NaN, so this only happens if the model itself overflows;
    # simulate that by poisoning the weights' input: huge advantages overflow the loss.
    rec.advantages[rec.loss_mask == 1] = np.float32(3e38)
    out = learner.train_step([rec])
    assert out["losses/skipped_nonfinite"] == 1 and learner.skipped_nonfinite == 1
    after = jax.tree.leaves(learner.params)
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(before, after))


def test_learning_rate_warmup_makes_the_first_steps_small():
    """Adam's first step moves every weight by about the learning rate: with a warmup of
    w steps, step k (from 0) moves them by (k + 1) / (w + 1) of that."""

    def first_step_move(warmup: int) -> float:
        learner = Learner(ModelConfig(max_seq_len=64), LearnerConfig(batch_records=1, lr_warmup_steps=warmup))
        before = [np.asarray(x) for x in jax.tree.leaves(learner.params)]
        learner.train_step([random_record(0)])
        after = [np.asarray(x) for x in jax.tree.leaves(learner.params)]
        return max(float(np.abs(a - b).max()) for a, b in zip(after, before))

    plain, warm = first_step_move(0), first_step_move(9)
    assert plain > 0 and warm == pytest.approx(plain / 10, rel=0.05)


@pytest.mark.parametrize("warmup", [0, 4])
def test_learning_rate_decay_ends_at_its_floor(warmup):
    """After the warmup the rate falls monotonically from lr to lr * (1 - lr_decay) at the
    run's last step; without lr_decay it stays at lr."""
    from trainer.learning.step.learner import learning_rate_schedule

    cfg = LearnerConfig(learning_rate=1e-3, lr_warmup_steps=warmup, lr_decay=0.9)
    sched = learning_rate_schedule(cfg, total_steps=20)
    rates = [float(sched(k)) for k in range(21)]
    assert rates[warmup] == pytest.approx(1e-3)
    assert rates[20] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(rates[warmup:], rates[warmup + 1 :]))
    assert learning_rate_schedule(LearnerConfig(learning_rate=1e-3), None) == 1e-3
    with pytest.raises(ValueError, match="lr_decay needs more steps"):
        learning_rate_schedule(cfg, total_steps=warmup)
    # The learner logs the rate each step used.
    learner = Learner(ModelConfig(max_seq_len=64), dataclasses.replace(cfg, batch_records=1), total_steps=20)
    used = [learner.train_step([random_record(k)])["optimizer/learning_rate"] for k in range(warmup + 2)]
    assert used == pytest.approx(rates[: warmup + 2])
