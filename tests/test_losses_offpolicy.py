"""The off-policy side of trainer/learning/step/losses.py against hand-computed numbers: aggregation
over packed rows, GSPO-token, truncated importance sampling, decoupled PPO, extreme
ratios, the config's checks, jit and the non-finite guard."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _losses import ppo_clipped_loss

from trainer.learning.step.losses import (
    AGGREGATIONS,
    ALGORITHMS,
    KL_ESTIMATORS,
    LossConfig,
    aggregate,
    all_finite,
    policy_loss,
)

E = math.exp


# ----------------------------------------------------------------------------- aggregation
def packed_example():
    """2 rows x 7 tokens, 5 sequences of different lengths, one with no masked token:
    row 0: seg 1 = x[0:3] (masked 2, 4), seg 2 = x[3:5] (masked 6), seg 3 = x[5] (none), pad
    row 1: seg 1 = x[0] (masked 1), seg 2 = x[1:4] (masked 3, 5), seg 3 = x[4:6] (7, -1), pad
    Unmasked values are wild (inf included) and must not matter."""
    x = np.array([[10, 2, 4, 99, 6, 77, np.inf], [1, 50, 3, 5, 7, -1, -np.inf]], np.float32)
    seg = np.array([[1, 1, 1, 2, 2, 3, 0], [1, 2, 2, 2, 3, 3, 0]], np.int32)
    mask = np.array([[0, 1, 1, 0, 1, 0, 0], [1, 0, 1, 1, 1, 1, 0]], np.uint8)
    return jnp.asarray(x), jnp.asarray(mask), jnp.asarray(seg)


# per sequence (masked tokens): (0,1) 2+4=6 len 2; (0,2) 6 len 1; (0,3) none; (1,1) 1 len 1;
# (1,2) 3+5=8 len 2; (1,3) 7-1=6 len 2. Five sequences count.
@pytest.mark.parametrize(
    "mode, norm_len, expected",
    [
        ("token-mean", None, 27 / 8),  # (6 + 6 + 1 + 8 + 6) / 8 tokens
        ("seq-mean-token-mean", None, (3 + 6 + 1 + 4 + 3) / 5),  # means 3, 6, 1, 4, 3
        ("seq-mean-token-sum", None, 27 / 5),  # sums 6, 6, 1, 8, 6
        ("seq-mean-token-sum", 4.0, 27 / 5 / 4),
    ],
)
@pytest.mark.parametrize("max_segments", [3, 8])
def test_aggregation_modes_by_hand(mode, norm_len, expected, max_segments):
    x, mask, seg = packed_example()
    got = aggregate(x, mask, seg, mode, max_segments, norm_len=norm_len)
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_aggregation_gradients_by_hand():
    x, mask, seg = packed_example()
    x = jnp.where(jnp.isfinite(x), x, 0.0)
    g = jax.grad(lambda v: aggregate(v, mask, seg, "seq-mean-token-mean", 3))(x)
    # d/dx = 1 / (len(seq) * 5 sequences): 0.1 for length 2, 0.2 for length 1, 0 where masked
    expected = np.array([[0, 0.1, 0.1, 0, 0.2, 0, 0], [0.2, 0, 0.1, 0.1, 0.1, 0.1, 0]], np.float32)
    np.testing.assert_allclose(np.asarray(g), expected, atol=1e-6)
    g = jax.grad(lambda v: aggregate(v, mask, seg, "seq-mean-token-sum", 3, norm_len=4.0))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(mask) / (5 * 4.0), atol=1e-6)
    g = jax.grad(lambda v: aggregate(v, mask, seg, "token-mean", 3))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(mask) / 8.0, atol=1e-6)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_empty_mask_aggregates_to_zero_with_finite_gradient(mode):
    x, _, seg = packed_example()
    mask = jnp.zeros_like(seg)
    assert float(aggregate(x, mask, seg, mode, 3)) == 0.0
    g = jax.grad(lambda v: aggregate(v, mask, seg, mode, 3))(x)  # x holds +-inf (masked, like everything)
    assert np.isfinite(np.asarray(g)).all() and (np.asarray(g) == 0).all()


def test_aggregation_refuses_bad_arguments():
    x, mask, seg = packed_example()
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(x, mask, seg, "seq-sum")
    with pytest.raises(ValueError, match="needs segment_ids"):
        aggregate(x, mask, None, "seq-mean-token-mean")
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(x, mask, seg, "token-mean", norm_len=4.0)


def test_ppo_clipped_loss_takes_aggregation_modes():
    # on-policy: the per-token loss is -A, so the loss is -aggregate(A)
    x, mask, seg = packed_example()
    adv = jnp.where(jnp.isfinite(x), x, 0.0)
    logp = jnp.full(x.shape, -1.0)
    loss, _ = ppo_clipped_loss(
        logp, logp, adv, mask, 0.2, 0.2, segment_ids=seg, aggregation="seq-mean-token-mean", max_segments=3
    )
    assert float(loss) == pytest.approx(-17 / 5, rel=1e-6)


# ----------------------------------------------------------------------------- GSPO-token
EPS_LOW, EPS_HIGH = 0.2, 0.3  # clip range [0.8, 1.3]


def gspo_example():
    """Four sequences, each 2 generated tokens, with per-token log-ratios that differ
    inside a sequence (so token-level PPO would give other numbers):
      S1 row 0 seg 1: log-ratios 0.1, 0.3  -> mean 0.2,  s = e^0.2  = 1.2214 in range, A = +1
      S2 row 0 seg 2: 0.5, 0.7             -> mean 0.6,  s = e^0.6  = 1.8221 > 1.3,    A = +1 (clipped)
      S3 row 1 seg 1: -0.4, -0.2 (+ a prompt token with log-ratio 5) -> s = e^-0.3 = 0.7408 < 0.8, A = -2 (clipped)
      S4 row 1 seg 2: 0.25, 0.35           -> mean 0.3,  s = e^0.3  = 1.3499 > 1.3,    A = -1 (unclipped: pessimistic)
    """
    log_ratio = np.array([[0.1, 0.3, 0.5, 0.7, 0.0, 0.0], [5.0, -0.4, -0.2, 0.25, 0.35, 0.0]], np.float32)
    seg = np.array([[1, 1, 2, 2, 0, 0], [1, 1, 1, 2, 2, 0]], np.int32)
    mask = np.array([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0]], np.uint8)
    adv = np.array([[1, 1, 1, 1, 0, 0], [-2, -2, -2, -1, -1, 0]], np.float32)
    behaviour = np.linspace(-4.0, -0.5, 12).reshape(2, 6).astype(np.float32)
    logp = behaviour + log_ratio
    return tuple(jnp.asarray(a) for a in (logp, behaviour, adv, mask, seg))


def gspo_cfg(**kw):
    return LossConfig("gspo_token", EPS_LOW, EPS_HIGH, "seq-mean-token-mean", **kw)


def test_gspo_token_value_is_the_sequence_level_clipped_objective():
    logp, behaviour, adv, mask, seg = gspo_example()
    loss, m = policy_loss(logp, behaviour, adv, mask, seg, gspo_cfg())
    # min(s A, clip(s) A) per sequence: e^0.2, 1.3 (clipped), 0.8 * -2 = -1.6 (clipped), -e^0.3
    expected = -(E(0.2) + 1.3 - 1.6 - E(0.3)) / 4  # = 0.107114
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(loss) == pytest.approx(0.107114, abs=1e-5)
    assert float(m["losses/clipfrac"]) == pytest.approx(6 / 8)  # S2, S3, S4 are out of range
    s = [E(0.2), E(0.6), E(-0.3), E(0.3)]
    assert float(m["losses/importance_weight_mean"]) == pytest.approx(sum(s) / 4, rel=1e-5)
    assert float(m["losses/importance_weight_max"]) == pytest.approx(E(0.6), rel=1e-5)
    # token-level PPO on the same data differs (its ratios are e^0.1, e^0.3, ...)
    ppo_loss, _ = policy_loss(logp, behaviour, adv, mask, seg, dataclasses.replace(gspo_cfg(), algorithm="ppo"))
    assert abs(float(ppo_loss) - expected) > 1e-3


def test_gspo_token_gradient_is_sequence_ratio_over_length_times_advantage():
    logp, behaviour, adv, mask, seg = gspo_example()
    grad = jax.grad(lambda lp: policy_loss(lp, behaviour, adv, mask, seg, gspo_cfg())[0])(logp)
    # d loss / d logp_t = -s_i * A_i / (|seq_i| * 4 sequences) where the unclipped term is
    # the min, else 0. S1: -e^0.2 / 8 = -0.152675; S4: +e^0.3 / 8 = +0.168732.
    g1, g4 = -E(0.2) * 1 / (2 * 4), -E(0.3) * -1 / (2 * 4)
    expected = np.array([[g1, g1, 0, 0, 0, 0], [0, 0, 0, g4, g4, 0]], np.float32)
    np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-6)
    assert g1 == pytest.approx(-0.152675, abs=1e-6) and g4 == pytest.approx(0.168732, abs=1e-6)


def test_gspo_token_with_unequal_lengths_and_token_mean():
    # one row: seq 1 has 1 token (log-ratio 0.2), seq 2 has 3 tokens (0.0, 0.1, -0.1 -> mean 0)
    lr = jnp.asarray([[0.2, 0.0, 0.1, -0.1]])
    seg = jnp.asarray([[1, 2, 2, 2]])
    mask = jnp.ones((1, 4))
    adv = jnp.asarray([[1.0, 2.0, 2.0, 2.0]])
    cfg = LossConfig("gspo_token", 0.5, 0.5, "token-mean")
    f = lambda lp: policy_loss(lp, jnp.zeros((1, 4)), adv, mask, seg, cfg)[0]
    # token-mean over 4 tokens: (e^0.2 * 1 + 3 * (1 * 2)) / 4; gradient s_i * A_i / 4 tokens
    assert float(f(lr)) == pytest.approx(-(E(0.2) + 6) / 4, rel=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(f)(lr))[0], [-E(0.2) / 4, -0.5, -0.5, -0.5], atol=1e-6)


# ----------------------------------------------------------------------------- TIS and decoupled PPO
def tis_example():
    """One row of 3 tokens. pi_prox / mu = 3, 0.5, 1; pi_theta / pi_prox = 1.1, 1.5, 0.5;
    A = +1, +1, -1; clip range [0.8, 1.2]. Per-token min terms: 1.1 (in range),
    1.2 (clipped), -0.8 (clipped: the pessimistic side)."""
    behaviour = jnp.full((1, 3), -1.0)
    proximal = behaviour + jnp.log(jnp.asarray([[3.0, 0.5, 1.0]]))
    logp = proximal + jnp.log(jnp.asarray([[1.1, 1.5, 0.5]]))
    adv = jnp.asarray([[1.0, 1.0, -1.0]])
    return logp, behaviour, proximal, adv, jnp.ones((1, 3)), jnp.ones((1, 3), jnp.int32)


def test_tis_caps_the_behaviour_weight():
    logp, behaviour, proximal, adv, mask, seg = tis_example()
    cfg = LossConfig("ppo", 0.2, 0.2, tis_cap=2.0)
    loss, m = policy_loss(logp, behaviour, adv, mask, seg, cfg, proximal_logp=proximal)
    # weights min(3, 2) = 2, 0.5, 1: -(2 * 1.1 + 0.5 * 1.2 + 1 * -0.8) / 3 = -2 / 3
    assert float(loss) == pytest.approx(-2 / 3, rel=1e-5)
    assert float(m["losses/tis_capfrac"]) == pytest.approx(1 / 3)
    assert float(m["losses/behaviour_weight_max"]) == pytest.approx(3.0, rel=1e-5)  # before the cap
    assert float(m["losses/behaviour_weight_mean"]) == pytest.approx(4.5 / 3, rel=1e-5)
    assert float(m["losses/importance_weight_max"]) == pytest.approx(1.5, rel=1e-5)  # pi_theta / pi_prox
    grads = jax.grad(
        lambda lp, px: policy_loss(lp, behaviour, adv, mask, seg, cfg, proximal_logp=px)[0], argnums=(0, 1)
    )(logp, proximal)
    # only token 0 is unclipped: -w * ratio * A / 3 = -2 * 1.1 / 3; nothing flows into pi_prox
    np.testing.assert_allclose(np.asarray(grads[0]), [[-2 * 1.1 / 3, 0, 0]], atol=1e-6)
    assert (np.asarray(grads[1]) == 0).all()


def test_decoupled_ppo_uses_the_uncapped_weight_unless_capped():
    logp, behaviour, proximal, adv, mask, seg = tis_example()
    loss, m = policy_loss(
        logp, behaviour, adv, mask, seg, LossConfig("decoupled_ppo", 0.2, 0.2), proximal_logp=proximal
    )
    assert float(loss) == pytest.approx(-(3 * 1.1 + 0.5 * 1.2 - 0.8) / 3, rel=1e-5)
    assert "losses/tis_capfrac" not in m
    capped, _ = policy_loss(
        logp, behaviour, adv, mask, seg, LossConfig("decoupled_ppo", 0.2, 0.2, tis_cap=2.0), proximal_logp=proximal
    )
    assert float(capped) == pytest.approx(-2 / 3, rel=1e-5)


def random_batch(seed, shape=(3, 10)):
    rng = np.random.default_rng(seed)
    behaviour = -rng.exponential(size=shape).astype(np.float32)
    logp = behaviour + rng.normal(scale=0.3, size=shape).astype(np.float32)
    adv = rng.normal(size=shape).astype(np.float32)
    seg = np.sort(rng.integers(0, 4, size=shape), axis=1).astype(np.int32)
    mask = ((rng.random(shape) < 0.7) & (seg > 0)).astype(np.uint8)
    return tuple(jnp.asarray(a) for a in (logp, behaviour, adv, mask, seg))


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize(
    "variant",
    [dict(algorithm="decoupled_ppo"), dict(algorithm="decoupled_ppo", tis_cap=1.0), dict(algorithm="ppo", tis_cap=2.0)],
)
def test_decoupled_ppo_and_tis_reduce_to_ppo_when_proximal_is_behaviour(mode, variant):
    logp, behaviour, adv, mask, seg = random_batch(4)
    ppo = LossConfig("ppo", 0.2, 0.28, mode)
    other = dataclasses.replace(ppo, **variant)
    f_ppo = lambda lp: policy_loss(lp, behaviour, adv, mask, seg, ppo)[0]
    f_other = lambda lp: policy_loss(lp, behaviour, adv, mask, seg, other, proximal_logp=behaviour)[0]
    assert float(f_other(logp)) == pytest.approx(float(f_ppo(logp)), rel=1e-6, abs=1e-7)
    np.testing.assert_allclose(np.asarray(jax.grad(f_other)(logp)), np.asarray(jax.grad(f_ppo)(logp)), atol=1e-7)
    assert abs(float(f_ppo(logp))) > 1e-3  # the comparison is not 0 == 0


def test_proximal_logp_required_exactly_when_used():
    logp, behaviour, adv, mask, seg = random_batch(5)
    with pytest.raises(ValueError, match="required"):
        policy_loss(logp, behaviour, adv, mask, seg, LossConfig("decoupled_ppo"))
    with pytest.raises(ValueError, match="required"):
        policy_loss(logp, behaviour, adv, mask, seg, LossConfig("ppo", tis_cap=2.0))
    with pytest.raises(ValueError, match="unused"):
        policy_loss(logp, behaviour, adv, mask, seg, LossConfig("ppo"), proximal_logp=behaviour)
    assert LossConfig("decoupled_ppo").needs_proximal and LossConfig("gspo_token", tis_cap=3.0).needs_proximal
    assert not LossConfig("ppo").needs_proximal
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(logp, behaviour, adv, mask, seg, LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="needs segment_ids"):
        policy_loss(logp, behaviour, adv, mask, None, LossConfig("gspo_token"))
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        policy_loss(logp, behaviour[:, :-1], adv, mask, seg, LossConfig())


# ----------------------------------------------------------------------------- extreme ratios
CONFIGS = [
    LossConfig(a, 0.2, 0.28, agg, tis_cap=cap, kl_coef=0.1, kl_estimator=KL_ESTIMATORS[i % 3])
    for i, (a, agg, cap) in enumerate((a, agg, cap) for a in ALGORITHMS for agg in AGGREGATIONS for cap in (None, 2.0))
]


@pytest.mark.parametrize("extreme", [50.0, -50.0, 1e4, -1e4])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.algorithm}-{c.aggregation}-{c.tis_cap}-{c.kl_estimator}")
def test_extreme_log_ratios_give_finite_loss_metrics_and_grads(cfg, extreme):
    logp, behaviour, adv, mask, seg = random_batch(7)
    mask = mask.at[0, :].set(seg[0] > 0)
    # one generated token far off in every relation: pi vs mu, pi vs pi_prox, pi_prox vs mu, pi vs ref
    logp = logp.at[1, 2].add(extreme)
    proximal = (behaviour + 0.1).at[0, 3].add(-extreme) if cfg.needs_proximal else None
    ref = (behaviour - 0.2).at[2, 5].add(extreme)
    behaviour = behaviour.at[0, 1].add(extreme)
    f = lambda lp, px: policy_loss(lp, behaviour, adv, mask, seg, cfg, proximal_logp=px, ref_logp=ref)
    loss, metrics = f(logp, proximal)
    assert np.isfinite(float(loss))
    for k, v in metrics.items():
        assert np.isfinite(float(v)), k
    grad = jax.grad(lambda lp: f(lp, proximal)[0])(logp)
    assert np.isfinite(np.asarray(grad)).all()
    assert bool(all_finite(loss, metrics, grad))


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(algorithm="grpo"), "loss must be one of"),
        (dict(aggregation="sum"), "aggregation must be one of"),
        (dict(kl_estimator="k4"), "kl_estimator must be one of"),
        (dict(eps_low=1.0), "eps_low"),
        (dict(eps_low=1.5), "eps_low"),
        (dict(eps_low=-0.1), "eps_low"),
        (dict(eps_high=-0.1), "eps_high"),
        (dict(kl_coef=-0.01), "kl_coef"),
        (dict(kl_coef=float("nan")), "kl_coef"),
        (dict(tis_cap=0.0), "tis_cap"),
        (dict(tis_cap=-1.0), "tis_cap"),
        (dict(norm_len=512.0), "norm_len"),  # with token-mean
        (dict(aggregation="seq-mean-token-sum", norm_len=0.0), "norm_len"),
    ],
)
def test_loss_config_refuses_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        LossConfig(**kw)


def test_loss_config_is_frozen_and_hashable():
    cfg = LossConfig("gspo_token", 3e-4, 4e-4, "seq-mean-token-sum", tis_cap=2.0, kl_coef=0.01, norm_len=512.0)
    assert hash(cfg) == hash(dataclasses.replace(cfg))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.eps_low = 0.5


# ----------------------------------------------------------------------------- jit
def test_policy_loss_jits_once_for_new_values():
    cfg = LossConfig("decoupled_ppo", 0.2, 0.28, "seq-mean-token-mean", tis_cap=2.0, kl_coef=0.05)
    step = jax.jit(jax.value_and_grad(policy_loss, has_aux=True), static_argnames=("cfg",))
    fn = jax.jit(policy_loss, static_argnames=("cfg",))
    results = []
    for seed in (8, 9):
        logp, behaviour, adv, mask, seg = random_batch(seed)
        args = (logp, behaviour, adv, mask, seg)
        kw = dict(proximal_logp=behaviour + 0.05, ref_logp=behaviour - 0.1)
        loss, _ = fn(*args, cfg=LossConfig(**dataclasses.asdict(cfg)), **kw)  # an equal config: same entry
        eager, _ = policy_loss(*args, cfg, **kw)
        assert float(loss) == pytest.approx(float(eager), rel=1e-5)
        (_, metrics), grad = step(*args, cfg=cfg, **kw)
        assert bool(jax.jit(all_finite)(grad, metrics))
        results.append(float(loss))
    assert results[0] != results[1]
    assert fn._cache_size() == 1 and step._cache_size() == 1


# ----------------------------------------------------------------------------- non-finite guard
def test_all_finite():
    ok = {"w": jnp.ones((2, 3)), "b": [jnp.zeros(4), jnp.asarray(3, jnp.int32)]}
    assert bool(all_finite(ok)) and bool(all_finite(ok, jnp.asarray(1.0)))
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        assert not bool(all_finite(ok, {"x": jnp.ones(5).at[2].set(bad)}))
    assert not bool(jax.jit(all_finite)(jnp.asarray([1.0, jnp.nan])))
    assert bool(all_finite())  # nothing to check
    assert all_finite(ok).shape == () and all_finite(ok).dtype == jnp.bool_
