"""Packed-row attention through Pallas' splash-attention kernel (TPU): a flash-attention
forward and backward that never holds a [T, T] score matrix and skips every key block the
static part of the mask rules out.

The mask is split the way the kernel wants it:
- static (block-sparse, known at trace time): causal, and a band of `left` keys before the
  query where segments are at most `span` long or the layer is a sliding window;
- dynamic: same segment, through the kernel's segment ids (padding is segment 0, so a
  padding query sees padding only, and never an empty row).
A query therefore sees exactly the keys of the dense segment-causal mask.

Grouped-query attention runs the kernel's multi-query form once per KV head (vmapped): the
query heads of a group share their KV head without a repeated copy. Rows are padded to
whole blocks with segment 0. Off a TPU the kernel runs in Pallas' interpreter (slow: tests
only). Scores are divided by `divisor` by scaling q first (the kernel does not scale).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

DEFAULT_BLOCK = 512  # query and key block of every kernel (forward, dq, dkv); rows pad to a multiple of 128


@dataclasses.dataclass(frozen=True)
class Segments:
    """What the kernel needs besides q, k and v (arrays traced, the rest static)."""

    segment_ids: jax.Array  # int [B, T]; 0 = padding
    span: int | None  # no segment is longer than this (None: unbounded)
    block: int = DEFAULT_BLOCK


def _block_sizes(block: int) -> sk.BlockSizes:
    return sk.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )


@functools.lru_cache(maxsize=64)
def _kernel(t: int, groups: int, left: int | None, block: int, interpret: bool):
    """The kernel for rows of t tokens (a multiple of block): causal, and at most `left`
    keys before the query when given."""
    head = sm.CausalMask((t, t)) if left is None else sm.LocalMask((t, t), (left, 0), 0)
    mask = sm.MultiHeadMask([head] * groups)
    # The block-sparsity tables become concrete arrays even when first built inside a
    # trace, so the cached kernel never holds another trace's values.
    with jax.ensure_compile_time_eval():
        return sk.make_splash_mqa_single_device(mask, block_sizes=_block_sizes(block), interpret=interpret)


def splash_attention(q, k, v, segments: Segments, window: int = 0, divisor: float | None = None):
    """q: [B, T, Hq, D]; k, v: [B, T, Hkv, D]. Key k is visible to query q iff same segment,
    k <= q, and with `window` > 0, q - k < window. Returns [B, T, Hq, D] in q's dtype."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    groups = hq // hkv
    lefts = [n - 1 for n in (segments.span, window) if n]
    left = min(lefts) if lefts else None
    # Rows pad to whole 128-token tiles, and the block is the largest that divides them
    # (1,152 tokens: blocks of 384, not 512 over 1,536 padded).
    tp = -(-t // 128) * 128
    block = max(b for b in range(128, min(segments.block, tp) + 1, 128) if tp % b == 0)
    pad = ((0, 0), (0, tp - t), (0, 0), (0, 0))
    divisor = float(d) ** 0.5 if divisor is None else divisor
    q = jnp.pad(q * jnp.asarray(1.0 / divisor, q.dtype), pad)
    k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    seg = jnp.pad(segments.segment_ids.astype(jnp.int32), ((0, 0), (0, tp - t)))
    kernel = _kernel(tp, groups, left, block, jax.default_backend() != "tpu")

    qh = q.reshape(b, tp, hkv, groups, d).transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, D]
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, Hkv, T, D]

    def one(qg, kg, vg, s):
        return kernel(qg, kg, vg, sk.SegmentIds(s, s))

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None))
    y = jax.vmap(per_head, in_axes=(0, 0, 0, 0))(qh, kh, vh, seg)  # [B, Hkv, G, T, D]
    return y.transpose(0, 3, 1, 2, 4).reshape(b, tp, hq, d)[:, :t].astype(q.dtype)
