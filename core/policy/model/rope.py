"""Rotary position embeddings: the frequencies of each supported rope type, and their
application to [B, T, H, D] heads at explicit (per-segment) positions.

The frequencies follow transformers' own float32 arithmetic step by step, so a checkpoint's
positions rotate here exactly as there. They are constants of the (static) config,
computed once per trace in NumPy: nothing about them is traced or recompiled.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from core.policy.model.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """float32 [head_dim / 2]: the angle per position of each rotated pair."""
    # NumPy 2 keeps Python scalars weak, so every step below stays float32 as in torch.
    inv = (1.0 / (rope.base ** (np.arange(0, head_dim, 2).astype(np.float32) / head_dim))).astype(np.float32)
    if rope.kind == "linear":
        return (inv / np.float32(rope.factor)).astype(np.float32)
    if rope.kind == "llama3":
        return _llama3(inv, rope)
    return inv


def _llama3(inv: np.ndarray, rope: RopeConfig) -> np.ndarray:
    """Llama 3.1's rescale: long wavelengths divided by `factor`, short ones kept, and a
    smooth blend between the two bands."""
    factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    old_len = rope.original_max_position
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
    smooth = ((np.float32(old_len) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RopeTable:
    """The sines and cosines [B, T, D/2] of some positions, computed once for every layer
    that shares a RoPE setting (the layers of a scanned step), not once per layer."""

    sin: jax.Array
    cos: jax.Array


def rope_table(positions: jax.Array, inv_freq: np.ndarray) -> RopeTable:
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)  # [B, T, half]
    return RopeTable(jnp.sin(angles), jnp.cos(angles))


def apply_rope(x: jax.Array, positions, inv_freq: np.ndarray) -> jax.Array:
    """x: [B, T, H, D]; positions: [B, T], or their RopeTable. Rotates pairs
    (x[..., :D/2], x[..., D/2:]), the layout HF checkpoints use (rotate_half)."""
    half = x.shape[-1] // 2
    table = positions if isinstance(positions, RopeTable) else rope_table(positions, inv_freq)
    sin, cos = table.sin[:, :, None, :], table.cos[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
