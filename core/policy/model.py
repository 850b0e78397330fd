"""Decoder-only transformer policy (Flax NNX) that understands packed rows.

Attention is causal *and* restricted to the query's own segment, and RoPE uses the
per-segment positions, so a trajectory scores the same alone or packed with others.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from core.policy.config import ModelConfig


def rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
    """x: [B, T, H, D]; positions: [B, T]. Rotates pairs (x[..., :D/2], x[..., D/2:])."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[..., None].astype(jnp.float32) * freqs  # [B, T, half]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def segment_causal_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T] -> [B, 1, T, T] boolean: key k visible to query q iff k <= q and same segment.
    Padding (segment 0) attends to padding only, so no row is ever all-masked (no NaN)."""
    t = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (causal[None] & same)[:, None]


def _linear(d_in: int, d_out: int, axes: tuple[str, str], rngs: nnx.Rngs) -> nnx.Linear:
    """A bias-free Linear whose kernel carries logical axis names (trainer/learning/sharding.py
    maps them onto the mesh)."""
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), axes)
    return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=init, rngs=rngs)


class Attention(nnx.Module):
    """Grouped-query attention: n_heads query heads share n_kv_heads key/value heads,
    so the KV cache holds only n_kv_heads."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.head_dim = cfg.head_dim
        self.q = _linear(cfg.d_model, cfg.n_heads * cfg.head_dim, ("embed", "q_heads"), rngs)
        self.kv = _linear(cfg.d_model, 2 * cfg.n_kv_heads * cfg.head_dim, ("embed", "kv_heads"), rngs)
        self.out = _linear(cfg.n_heads * cfg.head_dim, cfg.d_model, ("q_heads", "embed"), rngs)

    def _project(self, x, positions):
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.cfg.n_heads, self.head_dim)
        k, v = jnp.split(self.kv(x).reshape(b, t, 2 * self.cfg.n_kv_heads, self.head_dim), 2, axis=2)
        return rope(q, positions, self.cfg.rope_base), rope(k, positions, self.cfg.rope_base), v

    def _attend(self, q, k, v, mask):
        groups = self.cfg.n_heads // self.cfg.n_kv_heads
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        y = nnx.dot_product_attention(q, k, v, mask=mask)
        return self.out(y.reshape(y.shape[0], y.shape[1], -1))

    def __call__(self, x, positions, mask):
        q, k, v = self._project(x, positions)
        return self._attend(q, k, v, mask)

    def decode(self, x, start, cache_k, cache_v):
        """A chunk of P tokens per row at positions start[b] + 0..P-1, written into the
        KV cache (writes past its end are dropped). x: [B, P, d]; caches: [B, H_kv, T, D],
        heads before time so each slot's history is contiguous per head. A query sees
        cached keys up to its own position: keys beyond it are stale (an earlier episode
        in this slot, or chunk padding) and masked out. The query heads of a group attend
        to their shared KV head directly (no repeated copy of the cache)."""
        b, p, _ = x.shape
        positions = start[:, None] + jnp.arange(p)[None, :]  # [B, P]
        q, k, v = self._project(x, positions)
        rows = jnp.arange(b)[:, None]
        cache_k = cache_k.at[rows, :, positions].set(k.astype(cache_k.dtype), mode="drop")
        cache_v = cache_v.at[rows, :, positions].set(v.astype(cache_v.dtype), mode="drop")
        groups = self.cfg.n_heads // self.cfg.n_kv_heads
        q = q.reshape(b, p, self.cfg.n_kv_heads, groups, self.head_dim)
        scores = jnp.einsum("bpkgd,bktd->bkgpt", q, cache_k) / jnp.sqrt(self.head_dim).astype(q.dtype)
        visible = jnp.arange(cache_k.shape[2])[None, None, :] <= positions[:, :, None]  # [B, P, T]
        scores = jnp.where(visible[:, None, None], scores, jnp.finfo(scores.dtype).min)
        y = jnp.einsum("bkgpt,bktd->bpkgd", jax.nn.softmax(scores, axis=-1), cache_v)
        return self.out(y.reshape(b, p, -1)), cache_k, cache_v


class MLP(nnx.Module):
    """SwiGLU feed-forward."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.gate = _linear(cfg.d_model, cfg.mlp_dim, ("embed", "mlp"), rngs)
        self.up = _linear(cfg.d_model, cfg.mlp_dim, ("embed", "mlp"), rngs)
        self.down = _linear(cfg.mlp_dim, cfg.d_model, ("mlp", "embed"), rngs)

    def __call__(self, x):
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


def _rms_norm(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.RMSNorm:
    return nnx.RMSNorm(cfg.d_model, scale_init=nnx.with_partitioning(nnx.initializers.ones, ("embed",)), rngs=rngs)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.attn_norm = _rms_norm(cfg, rngs)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = _rms_norm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, positions, mask):
        x = x + self.attn(self.attn_norm(x), positions, mask)
        return x + self.mlp(self.mlp_norm(x))

    def decode(self, x, start, cache_k, cache_v):
        h, cache_k, cache_v = self.attn.decode(self.attn_norm(x), start, cache_k, cache_v)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), cache_k, cache_v


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        # nnx.Embed's own default (std 1/sqrt(d_model)): tied output logits start near uniform.
        embed_init = nnx.with_partitioning(
            nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0), ("vocab", "embed")
        )
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, embedding_init=embed_init, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.n_layers)])
        self.final_norm = _rms_norm(cfg, rngs)

    def __call__(self, tokens, segment_ids, positions):
        """tokens, segment_ids, positions: int [B, T] -> logits float32 [B, T, vocab]."""
        mask = segment_causal_mask(segment_ids)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, positions, mask)
        return self.embed.attend(self.final_norm(x)).astype(jnp.float32)

    def decode(self, tokens, start, cache):
        """KV-cached chunk step: tokens int [B, P] at positions start[b] + 0..P-1;
        cache: a tuple with one (k, v) pair per layer, each [B, H_kv, T, D] (per-layer
        arrays, so a donated cache is updated in place, not re-stacked every step).
        Returns (logits [B, P, vocab], cache)."""
        x = self.embed(tokens)
        new_cache = []
        for block, (k, v) in zip(self.blocks, cache):
            x, k, v = block.decode(x, start, k, v)
            new_cache.append((k, v))
        logits = self.embed.attend(self.final_norm(x)).astype(jnp.float32)
        return logits, tuple(new_cache)

    def init_cache(self, batch: int, length: int, dtype=jnp.float32):
        shape = (batch, self.cfg.n_kv_heads, length, self.cfg.head_dim)
        return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(self.cfg.n_layers))


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Log-prob of tokens[:, t] given the prefix, read from logits[:, t-1]; 0 at t=0.
    Only meaningful where t-1 is in the same segment, which holds wherever the loss
    mask is 1 (every trajectory starts with a prompt token)."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def init_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """Parameters carry logical axis names as metadata only; trainer/learning/sharding.py places
    them on a mesh when there is one (eager sharding would demand a mesh here)."""
    with nnx.use_eager_sharding(False):
        return Transformer(cfg, nnx.Rngs(seed))


def split_params(model: Transformer):
    """(graphdef, params State): the pure pytree that jit, optax and the store handle."""
    return nnx.split(model, nnx.Param)


def abstract_tree(tree):
    """The shapes, dtypes and (where a leaf has one) shardings of a pytree, for restoring
    params or learner state from a store or checkpoint into the same layout."""
    return jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)) if hasattr(x, "shape") else x
        ),
        tree,
    )
