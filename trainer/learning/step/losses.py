"""RL losses as pure functions, readable top to bottom (cleanrl style).

Shapes: every per-token array is [N, T] (N packed rows of T tokens).
  mask            loss mask: 1 = a token the policy generated; only these carry loss
  segment_ids     0 = padding, 1..k = the trajectories packed into a row; a *sequence*
                  is one (row, segment id) pair
  logp            log pi_theta(token): the params being trained
  behaviour_logp  log mu(token): what the rollout sampler used (maybe versions old)
  proximal_logp   log pi_prox(token): the learner's params before this update
  ref_logp        log pi_ref(token): the frozen reference policy of the KL penalty

Everything in JAX here jits with static shapes: per-sequence reductions use a one-hot
over segment ids 1..max_segments (static), never a Python loop or a boolean index.
Two numerical rules keep values and gradients finite: masked positions are replaced by
0 *before* any arithmetic (garbage there never reaches a value or a gradient), and
log-ratios are clamped to +-LOG_RATIO_CLAMP before exp (as verl does), so float32 never
overflows and squared gradient norms stay finite.

Group advantages live in core.rl.advantages (the pipeline computes them too).
Sections: 2. aggregation  3. KL estimators  4. config  5. policy losses
6. entropy and the non-finite guard.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from core.config import configclass, knob
from core.contracts.record_shape import DEFAULT_MAX_SEGMENTS_PER_ROW

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 4.9e8: far outside any clip range, far from f32 overflow
ALGORITHMS = ("ppo", "gspo_token", "decoupled_ppo")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")


# ----------------------------------------------------------------------------- 2. aggregation
def masked_mean(x, mask, total=None):
    """Mean of x over mask; 0 (not NaN) when the mask is empty. total: the denominator (the
    masked tokens of the whole batch when x is one micro-batch of it: the micro-batches'
    results then sum to the whole batch's)."""
    mask = mask > 0
    count = jnp.sum(mask) if total is None else total
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(count, 1)


def batch_totals(mask, segment_ids, max_segments: int) -> dict:
    """The whole batch's denominators: masked tokens, and sequences with a masked token.
    A micro-batch's loss divided by these (not its own) sums to the whole batch's loss, so
    accumulated gradients equal the whole batch's."""
    mask = mask > 0
    present = per_sequence_sum(mask.astype(jnp.float32), segment_ids, max_segments) > 0
    return {"tokens": jnp.sum(mask).astype(jnp.float32), "sequences": jnp.sum(present).astype(jnp.float32)}


def segment_one_hot(segment_ids, max_segments: int):
    """[N, T] segment ids -> [N, T, S] float one-hot over sequences 1..S; padding (0) and
    ids above max_segments match nothing, so max_segments must cover the packer's limit."""
    return (segment_ids[..., None] == jnp.arange(1, max_segments + 1)).astype(jnp.float32)


def per_sequence_sum(x, segment_ids, max_segments: int):
    """[N, T] -> [N, S]: the sum of x over each sequence. An elementwise product and a
    reduction (XLA fuses them), not a matmul, so it stays exact f32 on TPU too."""
    return jnp.sum(x[..., None] * segment_one_hot(segment_ids, max_segments), axis=1)


def aggregate(
    per_token,
    mask,
    segment_ids=None,
    mode: str = "token-mean",
    max_segments: int = 8,
    norm_len: float | None = None,
    totals: dict | None = None,
):
    """Reduce a per-token loss [N, T] to a scalar over the masked tokens.

    token-mean           sum over all masked tokens / number of masked tokens (DAPO)
    seq-mean-token-mean  mean over sequences of each sequence's token mean (GRPO paper)
    seq-mean-token-sum   mean over sequences of each sequence's token sum, divided by the
                         constant norm_len if given (Dr. GRPO uses the max response length)
    Sequences without a masked token do not count. An empty mask gives 0, and a 0
    gradient, never NaN. totals (batch_totals of the whole batch): divide by its counts,
    for a micro-batch of that batch.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")
    if norm_len is not None and mode != "seq-mean-token-sum":
        raise ValueError(f"norm_len only applies to seq-mean-token-sum, not {mode!r}")
    mask = mask > 0
    x = jnp.where(mask, per_token, 0.0)
    if mode == "token-mean":
        return jnp.sum(x) / jnp.maximum(jnp.sum(mask) if totals is None else totals["tokens"], 1)
    if segment_ids is None:
        raise ValueError(f"aggregation {mode!r} needs segment_ids")
    seq_sum = per_sequence_sum(x, segment_ids, max_segments)  # [N, S]
    seq_len = per_sequence_sum(mask.astype(jnp.float32), segment_ids, max_segments)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / jnp.maximum(seq_len, 1.0)
    else:
        per_seq = seq_sum if norm_len is None else seq_sum / norm_len
    present = seq_len > 0
    count = jnp.sum(present) if totals is None else totals["sequences"]
    return jnp.sum(jnp.where(present, per_seq, 0.0)) / jnp.maximum(count, 1)


# ----------------------------------------------------------------------------- 3. KL estimators
def kl_penalty(logp, ref_logp, estimator: str = "k3"):
    """Per-token estimators of KL(pi || ref) (Schulman, "Approximating KL divergence"):
      k1 = log pi - log ref                       unbiased, high variance, can be < 0
      k2 = 0.5 (log pi - log ref)^2               biased, low variance, >= 0
      k3 = ref/pi - log(ref/pi) - 1               unbiased, low variance, >= 0
    They are unbiased for tokens sampled from pi; ours come from the behaviour policy mu,
    so with stale data they estimate a mu-weighted KL (close to it while pi ~ mu).
    k3 clamps log(ref/pi) to +-LOG_RATIO_CLAMP so it never overflows."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * jnp.square(log_ratio)
    if estimator == "k3":
        x = jnp.clip(-log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return jnp.maximum(jnp.expm1(x) - x, 0.0)  # e^x - 1 - x >= 0; expm1 keeps it exact near 0
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def reference_kl(logp, behaviour_logp, ref_logp, estimator: str = "k3", cap: float | None = None):
    """Per-token KL(pi || ref) estimates on tokens the sampler mu drew: kl_penalty weighted by
    sg(pi / mu) (capped at `cap` when given), so that their mu-expectation is the pi-expectation
    the estimators assume. Unweighted, a token the policy has since made unlikely costs
    e^(log ref - log pi) under k3: SmolLM2's first RL steps put 12-49 nats on it, and the
    penalty's gradient (norm 392-676) buried the policy's."""
    log_w = jnp.clip(logp - behaviour_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weight = jax.lax.stop_gradient(jnp.exp(log_w))
    if cap is not None:
        weight = jnp.minimum(weight, cap)
    return weight * kl_penalty(logp, ref_logp, estimator)


# ----------------------------------------------------------------------------- 4. config
@configclass
class LossConfig:
    """Everything policy_loss needs besides arrays. Frozen and hashable: pass it to jit as
    a static argument."""

    algorithm: str = knob("ppo", "the policy loss", choices=ALGORITHMS, flag="loss")
    eps_low: float = knob(0.2, "the ratio is clipped to [1 - eps_low, 1 + eps_high] (DAPO clip-higher)", ge=0, lt=1)
    eps_high: float = knob(0.28, "the upper clip of the ratio, 1 + eps_high", ge=0)
    aggregation: str = knob("token-mean", "how per-token losses reduce to one", choices=AGGREGATIONS)
    tis_cap: float | None = knob(None, "truncated importance sampling cap C of min(pi_prox / mu, C) (unset: off)", gt=0)
    kl_coef: float = knob(
        0.0,
        "weight of the KL penalty to the reference (the v0 policy), on the sampler's tokens weighted by pi/mu",
        ge=0,
    )
    kl_estimator: str = knob("k3", "the per-token KL estimator", choices=KL_ESTIMATORS)
    norm_len: float | None = knob(None, "seq-mean-token-sum only: divide sequence sums by this (unset: do not)", gt=0)

    def __post_init__(self):
        if self.norm_len is not None and self.aggregation != "seq-mean-token-sum":
            raise ValueError(f"norm_len only applies to seq-mean-token-sum, not {self.aggregation!r}")

    @property
    def needs_proximal(self) -> bool:
        """Whether policy_loss needs proximal_logp (an extra forward pass with the params
        before this update, under stop_gradient)."""
        return self.algorithm == "decoupled_ppo" or self.tis_cap is not None


# ----------------------------------------------------------------------------- 5. policy losses
def clipped_surrogate(ratio, advantages, eps_low: float, eps_high: float):
    """Per-token PPO loss: -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)."""
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -jnp.minimum(ratio * advantages, clipped * advantages)


def sequence_mean_per_token(x, mask, segment_ids, max_segments: int):
    """[N, T] -> [N, T]: each token gets the mean of x over its sequence's masked tokens
    (0 on padding)."""
    onehot = segment_one_hot(segment_ids, max_segments)  # [N, T, S]
    mask = (mask > 0).astype(jnp.float32)
    sums = jnp.sum((x * mask)[..., None] * onehot, axis=1)  # [N, S]
    means = sums / jnp.maximum(jnp.sum(mask[..., None] * onehot, axis=1), 1.0)
    return jnp.sum(onehot * means[:, None, :], axis=-1)


def policy_loss(
    logp,
    behaviour_logp,
    advantages,
    mask,
    segment_ids,
    cfg: LossConfig,
    proximal_logp=None,
    ref_logp=None,
    totals: dict | None = None,
    max_segments: int = DEFAULT_MAX_SEGMENTS_PER_ROW,
):
    """The policy loss of cfg.algorithm, aggregated by cfg.aggregation, plus
    cfg.kl_coef * aggregate(reference_kl(logp, behaviour_logp, ref_logp)). Returns (loss, metrics).

    ppo            ratio = pi_theta / mu, clipped to [1 - eps_low, 1 + eps_high].
    gspo_token     GSPO-token: s_i = exp(mean over sequence i's tokens of log(pi_theta / mu));
                   the per-token ratio sg(s_i) * pi_theta / sg(pi_theta) has the value s_i
                   (so the clip acts on the whole sequence) and a per-token gradient.
    decoupled_ppo  ratio = pi_theta / pi_prox (the params before this update), and each
                   token's term is weighted by w = sg(pi_prox / mu): the PPO trust region is
                   kept around the learner's own policy however stale the sampler was.
    tis_cap = C    truncated importance sampling: w = sg(min(pi_prox / mu, C)); the ratio is
                   then taken against pi_prox for any algorithm (ppo + tis_cap is decoupled
                   PPO with a capped weight, as in Yao et al. on sampler/learner mismatch).
    Diagnostics use token means over the mask, whatever the aggregation.
    totals: batch_totals of the whole batch when these arrays are one micro-batch of it:
    the loss and the mean diagnostics are then this part's share (they sum over the parts).
    max_segments: static, at least the packer's segments per row (the record layout's):
    the seq-* aggregations and gspo_token sum over segment ids 1..max_segments.
    """
    shapes = {a.shape for a in (logp, behaviour_logp, advantages, mask) if a is not None}
    for extra in (segment_ids, proximal_logp, ref_logp):
        shapes |= {extra.shape} if extra is not None else set()
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"per-token arrays must all be [N, T]; got shapes {sorted(shapes)}")
    if (cfg.aggregation != "token-mean" or cfg.algorithm == "gspo_token") and segment_ids is None:
        raise ValueError(f"{cfg.algorithm} with {cfg.aggregation} needs segment_ids")
    if cfg.needs_proximal != (proximal_logp is not None):
        raise ValueError(
            f"proximal_logp is {'required' if cfg.needs_proximal else 'unused'} with "
            f"algorithm={cfg.algorithm!r}, tis_cap={cfg.tis_cap}"
        )
    if cfg.kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    mask = mask > 0
    agg = functools.partial(
        aggregate,
        mask=mask,
        segment_ids=segment_ids,
        mode=cfg.aggregation,
        max_segments=max_segments,
        norm_len=cfg.norm_len,
        totals=totals,
    )
    mean = functools.partial(masked_mean, total=None if totals is None else totals["tokens"])

    def log_ratio(a, b):  # masked, clamped log(a / b)
        return jnp.clip(jnp.where(mask, a - b, 0.0), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    metrics = {}
    # 1. The policy the ratio is taken against, and the behaviour weight for staleness.
    if cfg.needs_proximal:
        anchor_logp = jax.lax.stop_gradient(proximal_logp)
        behaviour_weight = jnp.exp(log_ratio(anchor_logp, behaviour_logp))  # pi_prox / mu
        metrics["losses/behaviour_weight_mean"] = mean(behaviour_weight, mask)
        metrics["losses/behaviour_weight_max"] = jnp.max(jnp.where(mask, behaviour_weight, 0.0))
        if cfg.tis_cap is not None:
            metrics["losses/tis_capfrac"] = mean(behaviour_weight > cfg.tis_cap, mask)
            behaviour_weight = jnp.minimum(behaviour_weight, cfg.tis_cap)
    else:
        anchor_logp, behaviour_weight = behaviour_logp, 1.0

    # 2. The importance ratio that gets clipped.
    if cfg.algorithm == "gspo_token":
        raw = jnp.where(mask, logp - anchor_logp, 0.0)
        seq_log_ratio = sequence_mean_per_token(raw, mask, segment_ids, max_segments)
        seq_ratio = jnp.exp(jnp.clip(jax.lax.stop_gradient(seq_log_ratio), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        live_logp = jnp.where(mask, logp, 0.0)
        ratio = seq_ratio * jnp.exp(live_logp - jax.lax.stop_gradient(live_logp))
    else:
        ratio = jnp.exp(log_ratio(logp, anchor_logp))

    # 3. Clipped surrogate, weighted per token, aggregated.
    per_token = jax.lax.stop_gradient(behaviour_weight) * clipped_surrogate(
        ratio, advantages, cfg.eps_low, cfg.eps_high
    )
    pg_loss = agg(per_token)
    loss = pg_loss

    # 4. KL penalty to the reference policy, on the sampler's tokens (importance-weighted).
    if ref_logp is not None:
        live = [jnp.where(mask, x, 0.0) for x in (logp, behaviour_logp, ref_logp)]
        kl = reference_kl(*live, cfg.kl_estimator, cfg.tis_cap)
        metrics["losses/kl_ref"] = agg(kl)
        loss = loss + cfg.kl_coef * metrics["losses/kl_ref"]

    # 5. Diagnostics (cleanrl names). approx_kl: k3 estimate of KL(mu || pi_theta).
    behaviour_log_ratio = log_ratio(logp, behaviour_logp)
    out_of_range = (ratio < 1.0 - cfg.eps_low) | (ratio > 1.0 + cfg.eps_high)
    metrics.update(
        {
            "losses/policy_loss": pg_loss,
            "losses/total_loss": loss,
            "losses/approx_kl": mean(jnp.expm1(behaviour_log_ratio) - behaviour_log_ratio, mask),
            "losses/clipfrac": mean(out_of_range, mask),
            "losses/importance_weight_mean": mean(ratio, mask),
            "losses/importance_weight_max": jnp.max(jnp.where(mask, ratio, 0.0)),
        }
    )
    return loss, metrics


# ----------------------------------------------------------------------------- 6. entropy, guard
def entropy(logits, mask):
    """Mean per-token entropy of the policy over the masked positions (logits at t-1
    predict token t, so shift the mask)."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return masked_mean(ent, mask[:, 1:].astype(jnp.float32))


def all_finite(*trees):
    """A scalar bool array: True iff every leaf of every argument (arrays or pytrees such
    as grads and metrics) is free of NaN and inf. jit-able; the learner skips an update
    when it is False."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(trees)]
    return functools.reduce(jnp.logical_and, leaves, jnp.asarray(True))
