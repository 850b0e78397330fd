"""Model FLOPs of a training step, counted from the config and the batch's segments: what
MFU divides by the step time. Shared by the learner (its telemetry's MFU), the benchmarks
and the scale planner.

Per trained token, 6 N for the weights it multiplies (forward 2 N, backward 4 N; N without
an untied input embedding, which is a lookup), and per visible (query, key) pair and
layer, 12 W for attention (QK^T and AV, 2 W FLOPs each, times 3 for the backward; W =
query heads x head dim). A segment of n tokens has n (n + 1) / 2 causal pairs (fewer in a
sliding layer). Padding, remat's recomputed forward and keys masked out cost the device
time but are not model FLOPs: MFU counts only the work the model needs.

XLA's cost analysis cannot replace this count: it counts a loop's body once, and the step
runs its layers, micro-batches and logit chunks in loops. tests/test_step_memory.py checks
the count against XLA's on a step whose loops run once.
"""

from __future__ import annotations

import numpy as np

from core.policy.model.config import SLIDING, ModelConfig


def count_params(cfg: ModelConfig) -> int:
    """The parameters core/policy/model/transformer.py builds for cfg (tests check it against the model)."""
    d, hd, q, kv = cfg.d_model, cfg.head_dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv) if cfg.qkv_bias else 0) + (2 * hd if cfg.qk_norm else 0)
    norms = (4 if cfg.sandwich_norms else 2) * d
    layer = attn + 3 * d * cfg.mlp_dim + norms
    embed = cfg.vocab_size * d
    return embed * (1 if cfg.tie_embeddings else 2) + cfg.n_layers * layer + d


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters a token multiplies by: all but an untied input embedding (a lookup)."""
    return count_params(cfg) - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)


def segment_lengths(segment_ids: np.ndarray) -> np.ndarray:
    """The length of every segment (id > 0) of every row of a [rows, T] array."""
    segment_ids = np.asarray(segment_ids)
    out = []
    for row in segment_ids:
        _, counts = np.unique(row[row > 0], return_counts=True)
        out.extend(counts.tolist())
    return np.asarray(out, np.int64)


def causal_pairs(lengths: np.ndarray, window: int = 0) -> float:
    """Visible (query, key) pairs of segments of these lengths: n (n + 1) / 2 each, or with
    a sliding window w, each query sees min(its position + 1, w) keys."""
    n = np.asarray(lengths, np.float64)
    full = n * (n + 1) / 2
    if not window:
        return float(full.sum())
    w = float(window)
    banded = np.where(n <= w, full, w * (w + 1) / 2 + (n - w) * w)
    return float(banded.sum())


def train_flops(cfg: ModelConfig, lengths: np.ndarray, trainable: str = "all", reference: bool = False) -> float:
    """Model FLOPs of one forward + backward over segments of these lengths.

    trainable "all": every weight gets its gradient (6 N a token); "adapter" (LoRA): the
    frozen weights pass gradients to activations only (4 N; the adapter's own FLOPs are
    under 1 % at rank 8 and not counted). reference: a KL reference forward as well
    (2 N a token, 4 W a pair and layer)."""
    tokens = float(np.asarray(lengths).sum())
    width = cfg.n_heads * cfg.head_dim
    pairs = sum(
        causal_pairs(lengths, cfg.sliding_window if cfg.layer_type(i) == SLIDING else 0) for i in range(cfg.n_layers)
    )
    n = matmul_params(cfg)
    weights = (6 if trainable == "all" else 4) * n * tokens
    flops = weights + 12 * width * pairs
    if reference:
        flops += 2 * n * tokens + 4 * width * pairs
    return flops
