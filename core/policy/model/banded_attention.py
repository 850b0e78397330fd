"""Banded (block-local) attention over packed rows whose segments are at most `span` tokens.

A query at row index i sees only keys of its own segment at or before it; a segment is
contiguous and at most `span` tokens long, so every visible key lies in [i - (span - 1), i].
The row is cut into query blocks of `block` tokens; query block j needs key blocks
j - W .. j only, W = ceil((span - 1) / block). Scores cost T x (W + 1) x block instead of
T x T, and every non-padding query gets exactly the dense segment-causal result.

Padding (segment 0) sees the padding inside its band only (the dense mask lets it see all
earlier padding): no real token ever reads a padding row, so no logit that is scored
changes, and each padding query still sees itself, so nothing is all-masked (no NaN).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

# Smaller blocks waste fewer keys past the span (a query block reads W + 1 key blocks); on
# CPU, 4x1024 rows with span 256 step in 1.67 / 1.71 / 2.17 / 3.05 s at blocks 32 / 64 /
# 128 / 256 (one run), and the same tokens in 256-token rows took 1.57-1.79 s in three
# runs of benchmarks/attention.py (docs/BENCHMARKS.md, "Fill").
# An accelerator may want 128 (its matmul tile): the Transformer takes `block`.
DEFAULT_BLOCK = 64
_NO_SEGMENT = -1  # the segment id of the row's padding to a block multiple: matches no real id


@dataclasses.dataclass(frozen=True)
class Band:
    """What every layer's banded attention needs besides q, k and v (Python-side only:
    span and block are static, the arrays are the traced batch's)."""

    segment_ids: jax.Array  # int [B, T]
    positions: jax.Array  # int [B, T], restarting at 0 per segment
    span: int  # no segment is longer than this
    block: int  # query block size


def band_block(t: int, span: int, block: int | None = None) -> int | None:
    """The query block size for rows of `t` tokens whose segments are at most `span` long
    (default: min(DEFAULT_BLOCK, span)); None when each query block's keys would cover the
    whole row anyway, so the dense path is as cheap (and short rows keep it exactly)."""
    if type(span) is not int or span <= 0:
        raise ValueError(f"span must be a positive int, got {span!r}")
    block = block or min(DEFAULT_BLOCK, span)
    if type(block) is not int or block <= 0:
        raise ValueError(f"block must be a positive int, got {block!r}")
    return block if (_halo(span, block) + 1) * block < t else None


def _halo(span: int, block: int) -> int:
    """W: how many key blocks before its own a query block may need."""
    return -(-(span - 1) // block)


def _pad_time(x: jax.Array, before: int, after: int, value) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[1] = (before, after)
    return jnp.pad(x, widths, constant_values=value)


def _key_windows(x: jax.Array, halo: int, block: int, value) -> jax.Array:
    """x: [B, nb * block, ...] -> [B, nb, (halo + 1) * block, ...]: for query block j, the
    key blocks j - halo .. j in order (before the row's start: `value`). Static shifted
    slices, stacked: no gather, jit- and grad-friendly."""
    b, t = x.shape[:2]
    nb = t // block
    blocks = _pad_time(x, halo * block, 0, value).reshape(b, nb + halo, block, *x.shape[2:])
    stacked = jnp.stack([blocks[:, w : w + nb] for w in range(halo + 1)], axis=2)
    return stacked.reshape(b, nb, (halo + 1) * block, *x.shape[2:])


def banded_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, band: Band, window: int = 0, divisor: float | None = None
) -> jax.Array:
    """q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] (grouped-query: Hq a multiple of Hkv, each
    group reads its KV head directly, no repeated copy). Key k is visible to query q iff
    same segment, k <= q, and with `window` > 0 positions q - k < window (HF's sliding
    window). Scores are divided by `divisor` (default sqrt(D)). Returns [B, T, Hq, D]."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    groups = hq // hkv
    span, block = band.span, band.block
    halo, nb = _halo(span, block), -(-t // block)
    tail = nb * block - t  # the row is padded to whole blocks; those queries are dropped at the end
    divisor = float(np.sqrt(d)) if divisor is None else divisor

    qb = _pad_time(q, 0, tail, 0).reshape(b, nb, block, hkv, groups, d)
    kb = _key_windows(_pad_time(k, 0, tail, 0), halo, block, 0)  # [B, nb, S, Hkv, D]
    vb = _key_windows(_pad_time(v, 0, tail, 0), halo, block, 0)
    seg = _pad_time(band.segment_ids, 0, tail, _NO_SEGMENT)
    seg_q, seg_k = seg.reshape(b, nb, block), _key_windows(seg, halo, block, _NO_SEGMENT)

    # Query row minus key row is the same for every block: a static [block, S] causal mask.
    # The row distance below span is implied by the segments; it keeps the band explicit.
    offset = (np.arange(block)[:, None] + halo * block) - np.arange((halo + 1) * block)[None, :]
    visible = jnp.asarray((offset >= 0) & (offset < span))[None, None]
    visible = visible & (seg_q[..., :, None] == seg_k[..., None, :])  # [B, nb, block, S]
    if window:
        pos = _pad_time(band.positions, 0, tail, 0)
        pos_q, pos_k = pos.reshape(b, nb, block), _key_windows(pos, halo, block, 0)
        visible = visible & ((pos_q[..., :, None] - pos_k[..., None, :]) < window)

    scores = jnp.einsum("bnqhgd,bnshd->bnhgqs", qb, kb) / jnp.asarray(divisor, q.dtype)
    # Softmax in float32 whatever the compute dtype; every query sees at least itself.
    scores = jnp.where(visible[:, :, None, None], scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    y = jnp.einsum("bnhgqs,bnshd->bnqhgd", weights, vb)
    return y.reshape(b, nb * block, hq, d)[:, :t]
