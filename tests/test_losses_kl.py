"""The KL penalty to the reference policy (trainer/learning/step/losses.py): the per-token
estimators by hand, and their importance weighting on the sampler's tokens
(`reference_kl`), which is what policy_loss adds."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_losses_offpolicy import random_batch

from trainer.learning.step.losses import KL_ESTIMATORS, LossConfig, aggregate, kl_penalty, policy_loss, reference_kl

E = math.exp


def test_kl_estimators_by_hand():
    logp = jnp.asarray([[-1.0, -2.0, -0.5]])
    ref = jnp.asarray([[-1.5, -1.0, -0.5]])  # log pi - log ref = 0.5, -1, 0
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, "k1")), [[0.5, -1.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, "k2")), [[0.125, 0.5, 0.0]], atol=1e-6)
    # k3 = e^(ref - logp) - (ref - logp) - 1: e^-0.5 + 0.5 - 1 = 0.106531; e^1 - 1 - 1 = 0.718282
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, "k3")), [[0.106531, 0.718282, 0.0]], atol=1e-6)
    # d k3 / d logp = 1 - e^(ref - logp)
    g = jax.grad(lambda lp: jnp.sum(kl_penalty(lp, ref, "k3")))(logp)
    np.testing.assert_allclose(np.asarray(g), [[1 - E(-0.5), 1 - E(1.0), 0.0]], atol=1e-6)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k4")


finite_logps = st.floats(-1e4, 0.0, allow_nan=False, width=32)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(finite_logps, finite_logps), min_size=1, max_size=32))
def test_k3_is_never_negative_and_all_vanish_on_policy(pairs):
    pairs = pairs + [(0.0, 0.0)] * (32 - len(pairs))  # one shape: eager ops compile once, not per length
    logp = jnp.asarray([[p for p, _ in pairs]], jnp.float32)
    ref = jnp.asarray([[r for _, r in pairs]], jnp.float32)
    k3 = np.asarray(kl_penalty(logp, ref, "k3"))
    assert np.isfinite(k3).all() and (k3 >= 0).all()
    for est in KL_ESTIMATORS:
        assert (np.asarray(kl_penalty(logp, logp, est)) == 0).all()


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_term_is_added_to_the_loss(estimator):
    logp, behaviour, adv, mask, seg = random_batch(6)
    ref = behaviour - 0.3
    base = LossConfig("ppo", 0.2, 0.28, "seq-mean-token-mean")
    with_kl = dataclasses.replace(base, kl_coef=0.25, kl_estimator=estimator)
    loss0, _ = policy_loss(logp, behaviour, adv, mask, seg, base, ref_logp=ref)
    loss1, m1 = policy_loss(logp, behaviour, adv, mask, seg, with_kl, ref_logp=ref)
    kl = aggregate(reference_kl(logp, behaviour, ref, estimator), mask, seg, "seq-mean-token-mean", 3)
    assert float(m1["losses/kl_ref"]) == pytest.approx(float(kl), rel=1e-6)
    assert float(loss1) == pytest.approx(float(loss0) + 0.25 * float(kl), rel=1e-6)
    assert float(m1["losses/policy_loss"]) == pytest.approx(float(loss0), rel=1e-6)
    assert float(m1["losses/total_loss"]) == pytest.approx(float(loss1), rel=1e-6)
    assert float(kl) != 0.0


def _distribution(draw_logits):
    return jax.nn.log_softmax(jnp.asarray(draw_logits, jnp.float32))


logits = st.lists(st.floats(-8.0, 8.0, allow_nan=False, width=32), min_size=5, max_size=5)


@settings(max_examples=200, deadline=None)
@given(logits, logits, logits)
def test_the_weighted_estimates_mu_expectation_is_the_kl_under_pi(pi, mu, ref):
    """Every token of a 5-token vocabulary, weighted by mu's probability (the sampler drew it):
    k1's and k3's weighted estimates average to KL(pi || ref) exactly, whatever mu is."""
    pi, mu, ref = (_distribution(x)[None, :] for x in (pi, mu, ref))
    exact = float(jnp.sum(jnp.exp(pi) * (pi - ref)))
    for estimator in ("k1", "k3"):
        under_mu = float(jnp.sum(jnp.exp(mu) * reference_kl(pi, mu, ref, estimator)))
        assert under_mu == pytest.approx(exact, rel=1e-3, abs=1e-4)
    assert float(jnp.sum(jnp.exp(pi) * reference_kl(pi, pi, ref, "k3"))) == pytest.approx(exact, rel=1e-3, abs=1e-4)


def test_a_token_the_policy_has_left_costs_little_not_e_to_the_log_ratio():
    """The SmolLM2 case: the sampler (the reference itself, v0) drew a token the policy now gives
    e^-15 of the reference's probability. Unweighted, k3 charges it e^15 nats; weighted, under 1,
    and its gradient is bounded too."""
    logp, ref = jnp.asarray([[-16.0]]), jnp.asarray([[-1.0]])
    assert float(kl_penalty(logp, ref, "k3")[0, 0]) > 3e6
    assert 0.0 <= float(reference_kl(logp, ref, ref, "k3")[0, 0]) < 1.0
    grad = jax.grad(lambda lp: jnp.sum(reference_kl(lp, ref, ref, "k3")))(logp)
    assert abs(float(grad[0, 0])) <= 1.0
    capped = reference_kl(jnp.asarray([[-0.1]]), jnp.asarray([[-9.0]]), ref, "k3", cap=2.0)
    assert float(capped[0, 0]) == pytest.approx(2.0 * float(kl_penalty(jnp.asarray([[-0.1]]), ref, "k3")[0, 0]))
