"""RL losses against hand-computed numbers: the advantage estimators (GRPO, RLOO,
Dr. GRPO), the clipped PPO loss, its metrics and gradient, and entropy. The off-policy
losses (aggregation, GSPO, TIS, decoupled PPO, KL) are in test_losses_offpolicy.py."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _losses import ppo_clipped_loss

from core.rl.advantages import ADVANTAGE_ESTIMATORS, dr_grpo_advantages, grpo_advantages, rloo_advantages
from trainer.learning.step.losses import LOG_RATIO_CLAMP, entropy, masked_mean


# ----------------------------------------------------------------------------- GRPO advantages
def test_grpo_advantages_by_hand():
    # mean 0.5, std 0.5 -> (r - 0.5) / 0.5
    np.testing.assert_allclose(grpo_advantages([1, 0, 0, 1]), [1, -1, -1, 1], atol=1e-5)
    # mean 2, population std sqrt(2/3)
    s = math.sqrt(2 / 3)
    np.testing.assert_allclose(grpo_advantages([1.0, 2.0, 3.0]), [-1 / s, 0, 1 / s], atol=1e-5)
    # one success in four: mean 0.25, std sqrt(0.1875)
    s = math.sqrt(0.1875)
    np.testing.assert_allclose(grpo_advantages([0, 0, 1, 0]), [-0.25 / s, -0.25 / s, 0.75 / s, -0.25 / s], atol=1e-5)
    out = grpo_advantages(np.array([1, 0, 0, 1], dtype=np.int64))
    assert out.dtype == np.float32 and out.shape == (4,)


@pytest.mark.parametrize("rewards", [[0.0] * 4, [1.0] * 8, [0.1] * 3, [-7.25, -7.25], [1e6] * 5, [0.3] * 16])
def test_equal_rewards_give_exactly_zero(rewards):
    adv = grpo_advantages(rewards)
    assert adv.dtype == np.float32 and adv.shape == (len(rewards),)
    assert (adv == 0.0).all()


def test_single_and_empty_groups():
    adv = grpo_advantages([3.5])
    assert adv.shape == (1,) and adv[0] == 0.0 and adv.dtype == np.float32
    empty = grpo_advantages([])
    assert empty.shape == (0,) and empty.dtype == np.float32


def test_advantages_sum_to_zero_and_have_unit_std():
    rng = np.random.default_rng(0)
    for _ in range(20):
        r = rng.normal(size=int(rng.integers(2, 17))) * 5
        adv = grpo_advantages(r)
        assert abs(adv.sum()) < 1e-4
        assert abs(adv.std() - 1.0) < 1e-4


# ----------------------------------------------------------------------------- RLOO and Dr. GRPO
def test_rloo_by_hand():
    # r_i - mean of the others. [1,0,0,1]: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3.
    np.testing.assert_allclose(rloo_advantages([1, 0, 0, 1]), [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=1e-6)
    # [1,2,3]: 1 - 2.5, 2 - 2, 3 - 1.5
    np.testing.assert_allclose(rloo_advantages([1.0, 2.0, 3.0]), [-1.5, 0.0, 1.5], atol=1e-6)
    # one success in four: 1 - 0 = 1; 0 - 1/3
    np.testing.assert_allclose(rloo_advantages([0, 0, 1, 0]), [-1 / 3, -1 / 3, 1.0, -1 / 3], atol=1e-6)
    # two samples: each one's baseline is the other
    np.testing.assert_allclose(rloo_advantages([3.0, 5.0]), [-2.0, 2.0], atol=1e-6)
    np.testing.assert_allclose(rloo_advantages([0, 1]), [-1.0, 1.0], atol=1e-6)


def test_dr_grpo_by_hand():
    np.testing.assert_allclose(dr_grpo_advantages([1, 0, 0, 1]), [0.5, -0.5, -0.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(dr_grpo_advantages([1.0, 2.0, 3.0]), [-1.0, 0.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(dr_grpo_advantages([0, 0, 1, 0]), [-0.25, -0.25, 0.75, -0.25], atol=1e-6)
    np.testing.assert_allclose(dr_grpo_advantages([3.0, 5.0]), [-1.0, 1.0], atol=1e-6)
    # no std: scaling the rewards scales the advantages (GRPO would not change)
    np.testing.assert_allclose(dr_grpo_advantages([0.0, 10.0]), [-5.0, 5.0], atol=1e-5)
    np.testing.assert_allclose(grpo_advantages([0.0, 10.0]), [-1.0, 1.0], atol=1e-5)


def test_grpo_two_samples_and_estimators_by_name():
    # mean 4, population std 1
    np.testing.assert_allclose(grpo_advantages([3.0, 5.0]), [-1.0, 1.0], atol=1e-5)
    # The names the pipeline's --advantage_estimator accepts give each estimator's numbers.
    assert sorted(ADVANTAGE_ESTIMATORS) == ["dr_grpo", "grpo", "rloo"]
    np.testing.assert_allclose(ADVANTAGE_ESTIMATORS["grpo"]([3.0, 5.0]), [-1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(ADVANTAGE_ESTIMATORS["rloo"]([1.0, 0.0, 0.0]), [1.0, -0.5, -0.5], atol=1e-6)
    np.testing.assert_allclose(ADVANTAGE_ESTIMATORS["dr_grpo"]([0.0, 10.0]), [-5.0, 5.0], atol=1e-6)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("rewards", [[0.0] * 4, [1.0] * 8, [0.1] * 3, [-7.25, -7.25], [1e6] * 5, [0.3] * 16, [3.5]])
def test_every_estimator_gives_exact_zeros_without_signal(name, rewards):
    adv = ADVANTAGE_ESTIMATORS[name](rewards)
    assert adv.dtype == np.float32 and adv.shape == (len(rewards),)
    assert (adv == 0.0).all()  # exact: the packer drops zero-signal groups by this test


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_handles_empty_and_int_groups(name):
    empty = ADVANTAGE_ESTIMATORS[name]([])
    assert empty.shape == (0,) and empty.dtype == np.float32
    out = ADVANTAGE_ESTIMATORS[name](np.array([1, 0, 0, 1], dtype=np.int64))
    assert out.dtype == np.float32 and out.shape == (4,) and out[0] > 0 > out[1]


def test_rloo_is_scaled_centred_rewards():
    rng = np.random.default_rng(3)
    for _ in range(20):
        r = rng.normal(size=int(rng.integers(2, 17))) * 5
        n = r.size
        np.testing.assert_allclose(rloo_advantages(r), n / (n - 1) * (r - r.mean()), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dr_grpo_advantages(r), r - r.mean(), rtol=1e-5, atol=1e-5)
        assert abs(rloo_advantages(r).sum()) < 1e-4


# ----------------------------------------------------------------------------- PPO clipped loss
EPS_LOW, EPS_HIGH = 0.2, 0.3  # clip range [0.8, 1.3]
# (ratio, advantage, min(ratio*A, clip(ratio)*A), counted by clipfrac, ratio if the gradient flows else 0)
CASES = [
    (0.50, +1.0, 0.50, 1, 0.50),  # below range, A>0: unclipped is the min, gradient flows
    (0.50, -1.0, -0.80, 1, 0.0),  # below range, A<0: clipped is the min, no gradient
    (1.50, +2.0, 2.60, 1, 0.0),  # above range, A>0: clipped, no gradient
    (1.50, -1.0, -1.50, 1, 1.50),  # above range, A<0: unclipped (pessimistic), gradient flows
    (1.10, +1.0, 1.10, 0, 1.10),  # inside
    (0.85, -2.0, -1.70, 0, 0.85),  # inside
    (1.25, +1.0, 1.25, 0, 1.25),  # inside only because eps_high (0.3) > eps_low (0.2)
    (0.75, +1.0, 0.75, 1, 0.75),  # outside only because eps_low (0.2) < eps_high (0.3)
]


def hand_case():
    """Two rows of 5 tokens: the 8 cases above plus 2 masked tokens with wild values."""
    n = len(CASES)
    behaviour = np.linspace(-3.0, -0.5, 10).astype(np.float32)
    ratio = np.array([c[0] for c in CASES] + [math.exp(30), math.exp(-30)])
    adv = np.array([c[1] for c in CASES] + [5.0, -5.0], np.float32)
    mask = np.array([1] * n + [0, 0], np.uint8)
    logp = (behaviour + np.log(ratio)).astype(np.float32)
    shape = (2, 5)
    return (
        jnp.asarray(logp.reshape(shape)),
        jnp.asarray(behaviour.reshape(shape)),
        jnp.asarray(adv.reshape(shape)),
        jnp.asarray(mask.reshape(shape)),
    )


def test_ppo_clipped_loss_by_hand():
    logp, behaviour, adv, mask = hand_case()
    loss, m = ppo_clipped_loss(logp, behaviour, adv, mask, EPS_LOW, EPS_HIGH)
    n = len(CASES)
    for r, a, expected_min, _, _ in CASES:  # the table itself, recomputed
        assert min(r * a, min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH) * a) == pytest.approx(expected_min)
    # 0.5 - 0.8 + 2.6 - 1.5 + 1.1 - 1.7 + 1.25 + 0.75 = 2.2; loss = -2.2 / 8
    assert float(loss) == pytest.approx(-2.2 / 8, abs=1e-5)
    assert float(m["losses/policy_loss"]) == pytest.approx(-0.275, abs=1e-5)
    assert float(m["losses/clipfrac"]) == pytest.approx(5 / 8, abs=1e-6)
    kl = sum((r - 1) - math.log(r) for r, *_ in CASES) / n
    assert float(m["losses/approx_kl"]) == pytest.approx(kl, abs=1e-5)
    assert float(m["losses/importance_weight_mean"]) == pytest.approx(sum(c[0] for c in CASES) / n, abs=1e-5)
    assert float(m["losses/importance_weight_max"]) == pytest.approx(1.5, abs=1e-5)  # the masked e^30 is ignored
    assert float(m["losses/total_loss"]) == pytest.approx(-0.275, abs=1e-5)  # no KL term
    assert set(m) == {
        "losses/policy_loss",
        "losses/total_loss",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/importance_weight_mean",
        "losses/importance_weight_max",
    }


def test_ppo_clipped_loss_gradient_by_hand():
    logp, behaviour, adv, mask = hand_case()
    grad = jax.grad(lambda lp: ppo_clipped_loss(lp, behaviour, adv, mask, EPS_LOW, EPS_HIGH)[0])(logp)
    n = len(CASES)
    # d(-min(...)/n)/d logp = -ratio * A / n where the unclipped term is the min, 0 where clipped.
    expected = np.array([-c[4] * c[1] / n for c in CASES] + [0.0, 0.0], np.float32).reshape(2, 5)
    np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-5)


def test_ppo_on_policy_is_minus_mean_advantage():
    rng = np.random.default_rng(1)
    logp = jnp.asarray(-rng.exponential(size=(3, 7)).astype(np.float32))
    adv = jnp.asarray(rng.normal(size=(3, 7)).astype(np.float32))
    mask = jnp.asarray((rng.random((3, 7)) < 0.5).astype(np.uint8))
    loss, m = ppo_clipped_loss(logp, logp, adv, mask, 0.2, 0.2)
    expected = -float((np.asarray(adv) * np.asarray(mask)).sum() / np.asarray(mask).sum())
    assert float(loss) == pytest.approx(expected, abs=1e-5)
    assert float(m["losses/approx_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(m["losses/clipfrac"]) == 0.0
    assert float(m["losses/importance_weight_mean"]) == pytest.approx(1.0, abs=1e-6)


def test_all_zero_mask_gives_zero_loss_and_finite_gradient():
    rng = np.random.default_rng(2)
    logp = jnp.asarray(rng.normal(size=(2, 6)).astype(np.float32) * 40)  # wild log-ratios, all masked
    behaviour = jnp.asarray(-rng.exponential(size=(2, 6)).astype(np.float32))
    adv = jnp.asarray(rng.normal(size=(2, 6)).astype(np.float32))
    mask = jnp.zeros((2, 6), jnp.uint8)
    loss, m = ppo_clipped_loss(logp, behaviour, adv, mask, 0.2, 0.28)
    assert float(loss) == 0.0
    for k, v in m.items():
        assert np.isfinite(float(v)), k
    assert float(m["losses/approx_kl"]) == 0.0 and float(m["losses/clipfrac"]) == 0.0
    grad = jax.grad(lambda lp: ppo_clipped_loss(lp, behaviour, adv, mask, 0.2, 0.28)[0])(logp)
    assert np.isfinite(np.asarray(grad)).all()
    assert (np.asarray(grad) == 0).all()


@pytest.mark.parametrize("log_ratio", [50.0, -50.0])
@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_extreme_ratios_stay_finite(log_ratio, advantage):
    behaviour = jnp.full((1, 4), -1.0, jnp.float32)
    logp = behaviour.at[0, 1].add(log_ratio)
    adv = jnp.full((1, 4), advantage, jnp.float32)
    mask = jnp.ones((1, 4), jnp.uint8)
    loss, m = ppo_clipped_loss(logp, behaviour, adv, mask, 0.2, 0.2)
    assert np.isfinite(float(loss))
    for k, v in m.items():
        assert np.isfinite(float(v)), k
    assert float(m["losses/clipfrac"]) == pytest.approx(0.25)
    grad = jax.grad(lambda lp: ppo_clipped_loss(lp, behaviour, adv, mask, 0.2, 0.2)[0])(logp)
    assert np.isfinite(np.asarray(grad)).all()
    # Expected min term for the extreme token: the pessimistic side of the clip, with the
    # log-ratio clamped to +-20 first (so e^50 * A never reaches the sum or the grad norm).
    assert LOG_RATIO_CLAMP == 20.0
    r = math.exp(max(min(log_ratio, 20.0), -20.0))
    extreme = min(r * advantage, min(max(r, 0.8), 1.2) * advantage)
    assert float(loss) == pytest.approx(-(3 * advantage + extreme) / 4, rel=1e-5)
    # Ratio-1 tokens are inside the clip: gradient -A/4. The extreme token is past the clamp
    # (or clipped, or has ratio e^-20): its gradient is 0 up to e^-20 * A / 4.
    np.testing.assert_allclose(np.asarray(grad)[0], [-advantage / 4, 0.0, -advantage / 4, -advantage / 4], atol=1e-7)


def test_masked_mean():
    x = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert float(masked_mean(x, jnp.asarray([[1.0, 0, 1], [0, 0, 1]]))) == pytest.approx(10 / 3)
    assert float(masked_mean(x, jnp.zeros((2, 3)))) == 0.0


# ----------------------------------------------------------------------------- entropy
@pytest.mark.parametrize("vocab", [2, 7, 64])
def test_entropy_of_uniform_logits_is_log_vocab(vocab):
    logits = jnp.full((2, 5, vocab), 3.25, jnp.float32)
    mask = jnp.ones((2, 5), jnp.uint8)
    assert float(entropy(logits, mask)) == pytest.approx(math.log(vocab), abs=1e-5)


def test_entropy_uses_logits_one_step_before_the_masked_token():
    # Position 1's logits predict token 2; only token 2 is in the mask.
    p = np.array([0.25, 0.75])
    logits = np.zeros((1, 4, 2), np.float32)
    logits[0, 0] = [0.0, 50.0]  # near-deterministic: entropy ~0
    logits[0, 1] = np.log(p)
    logits[0, 2] = [0.0, 0.0]  # uniform: entropy log 2
    mask = jnp.asarray([[0, 0, 1, 0]], jnp.uint8)
    expected = -(p * np.log(p)).sum()
    assert float(entropy(jnp.asarray(logits), mask)) == pytest.approx(expected, abs=1e-5)
    # A mask only on the first token has nothing before it: entropy is 0, not NaN.
    assert float(entropy(jnp.asarray(logits), jnp.asarray([[1, 0, 0, 0]], jnp.uint8))) == 0.0


def test_grpo_divides_by_the_std_plus_eps_and_an_empty_group_warns_nothing():
    """Mutation testing (make mutation) found both unchecked."""
    want = np.float32(0.5 / (0.5 + 1e-6))
    np.testing.assert_array_equal(grpo_advantages([0.0, 1.0]), [-want, want])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's std of nothing would warn (and give nan)
        for estimator in ADVANTAGE_ESTIMATORS.values():
            out = estimator([])
            assert out.shape == (0,) and out.dtype == np.float32
