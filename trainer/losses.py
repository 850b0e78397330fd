"""RL losses as pure functions, readable top to bottom.

Shapes: everything per token is [N, T] (N packed rows); `mask` is the loss mask
(1 = tokens the policy generated). Aggregation is token-mean over the mask.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def group_relative_advantages(rewards, eps: float = 1e-6) -> np.ndarray:
    """GRPO: (r - mean(group)) / (std(group) + eps). A group whose rewards are all
    equal carries no signal: every advantage is exactly 0."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return r.astype(np.float32)
    centred = r - r.mean()
    std = r.std()
    if std < eps:
        return np.zeros_like(r, dtype=np.float32)
    return (centred / (std + eps)).astype(np.float32)


def masked_mean(x, mask):
    """Mean of x over mask; 0 (not NaN) when the mask is empty."""
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def ppo_clipped_loss(logp, behaviour_logp, advantages, mask, eps_low: float, eps_high: float):
    """Clipped importance-weighted policy gradient against the behaviour policy.

    ratio = pi_theta(a|s) / mu(a|s); loss = -min(ratio * A, clip(ratio, 1-eps_low, 1+eps_high) * A).
    Returns (loss, metrics) with cleanrl's metric names.
    """
    mask = mask.astype(jnp.float32)
    log_ratio = jnp.where(mask > 0, logp - behaviour_logp, 0.0)
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -masked_mean(jnp.minimum(unclipped, clipped), mask)
    metrics = {
        "losses/policy_loss": loss,
        # k3 estimator of KL(mu || pi): non-negative, low variance.
        "losses/approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
        "losses/clipfrac": masked_mean((jnp.abs(ratio - 1.0) > jnp.where(ratio > 1, eps_high, eps_low)).astype(jnp.float32), mask),
        "losses/ratio_mean": masked_mean(ratio, mask),
        "losses/ratio_max": jnp.max(jnp.where(mask > 0, ratio, 0.0)),
    }
    return loss, metrics


def entropy(logits, mask):
    """Mean per-token entropy of the policy over the masked positions (logits at t-1
    predict token t, so shift the mask)."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return masked_mean(ent, mask[:, 1:].astype(jnp.float32))
