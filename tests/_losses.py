"""Test helper: clipped PPO against the behaviour policy, as policy_loss computes it."""

from trainer.learning.step.losses import LossConfig, policy_loss


def ppo_clipped_loss(
    logp,
    behaviour_logp,
    advantages,
    mask,
    eps_low: float,
    eps_high: float,
    *,
    segment_ids=None,
    aggregation: str = "token-mean",
    max_segments: int = 8,
    norm_len: float | None = None,
):
    """ratio = pi_theta / mu; loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)."""
    cfg = LossConfig("ppo", eps_low, eps_high, aggregation, norm_len=norm_len)
    return policy_loss(logp, behaviour_logp, advantages, mask, segment_ids, cfg, max_segments=max_segments)
