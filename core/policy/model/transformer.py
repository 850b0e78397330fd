"""Decoder-only transformer policy (Flax NNX) that understands packed rows.

Attention is causal *and* restricted to the query's own segment, and RoPE uses the
per-segment positions, so a trajectory scores the same alone or packed with others.
Given a bound on segment length (`span`), long rows compute only the band of keys a
query can see (core/policy/model/banded_attention.py) instead of the dense [T, T] mask.

One implementation serves every family in core/policy/model/config.py: the built-in byte-level
policy and the Hugging Face checkpoints (Qwen2/2.5, Qwen3, Llama 3.x, Gemma 3 text). A
module that only some family has (biases, q/k norms, a separate lm_head, Gemma's extra
norms) exists only when the config asks for it, so the built-in param tree is unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core.policy.model.banded_attention import Band, band_block, banded_attention
from core.policy.model.config import SLIDING, ModelConfig
from core.policy.model.rope import apply_rope, inverse_frequencies, rope_table
from core.policy.model.splash_attention import Segments, splash_attention

# How a training forward attends: "xla" (the dense segment-causal mask, or the band where
# segments are short) or "splash" (Pallas' flash kernel with segment ids: TPU).
ATTENTION_IMPLS = ("xla", "splash")


def segment_causal_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T] -> [B, 1, T, T] boolean: key k visible to query q iff k <= q and same segment.
    Padding (segment 0) attends to padding only, so no row is ever all-masked (no NaN)."""
    t = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (causal[None] & same)[:, None]


def window_mask(positions: jax.Array, window: int) -> jax.Array:
    """[B, T] -> [B, 1, T, T]: key within `window` positions before the query (HF's sliding
    window: q - k < window). Combined with the segment mask, positions are per segment."""
    return ((positions[:, :, None] - positions[:, None, :]) < window)[:, None]


def _linear(d_in: int, d_out: int, axes: tuple[str, str], rngs: nnx.Rngs, bias: bool = False) -> nnx.Linear:
    """A Linear whose kernel (and bias, if any) carries logical axis names
    (trainer/learning/step/sharding.py maps them onto the mesh)."""
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), axes)
    bias_init = nnx.with_partitioning(nnx.initializers.zeros_init(), axes[1:])
    return nnx.Linear(d_in, d_out, use_bias=bias, kernel_init=init, bias_init=bias_init, rngs=rngs)


class OffsetRMSNorm(nnx.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + w) in float32, cast back to x's dtype; w starts at 0."""

    def __init__(self, dim: int, eps: float, axis_name: str):
        init = nnx.with_partitioning(nnx.initializers.zeros_init(), (axis_name,))
        self.scale = nnx.Param(init(jax.random.key(0), (dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)


def _norm(cfg: ModelConfig, rngs: nnx.Rngs, dim: int | None = None, axis_name: str = "embed"):
    dim = cfg.d_model if dim is None else dim
    if cfg.norm_offset:
        return OffsetRMSNorm(dim, cfg.norm_eps, axis_name)
    init = nnx.with_partitioning(nnx.initializers.ones, (axis_name,))
    return nnx.RMSNorm(dim, epsilon=cfg.norm_eps, scale_init=init, rngs=rngs)


class Attention(nnx.Module):
    """Grouped-query attention: n_heads query heads share n_kv_heads key/value heads,
    so the KV cache holds only n_kv_heads. k and v share one fused projection (`kv`)."""

    def __init__(self, cfg: ModelConfig, layer: int, rngs: nnx.Rngs):
        self.cfg = cfg
        self.head_dim = cfg.head_dim
        # A sliding layer's window; 0: full attention.
        self.window = cfg.sliding_window if cfg.layer_type(layer) == SLIDING else 0
        self.rope = cfg.layer_rope(layer)
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, 2 * cfg.n_kv_heads * cfg.head_dim
        self.q = _linear(cfg.d_model, q_dim, ("embed", "q_heads"), rngs, bias=cfg.qkv_bias)
        self.kv = _linear(cfg.d_model, kv_dim, ("embed", "kv_heads"), rngs, bias=cfg.qkv_bias)
        self.out = _linear(q_dim, cfg.d_model, ("q_heads", "embed"), rngs)
        if cfg.qk_norm:  # one norm over each head's features, shared by every head
            self.q_norm = _norm(cfg, rngs, cfg.head_dim, "head_dim")
            self.k_norm = _norm(cfg, rngs, cfg.head_dim, "head_dim")

    def _project(self, x, positions):
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.cfg.n_heads, self.head_dim)
        k, v = jnp.split(self.kv(x).reshape(b, t, 2 * self.cfg.n_kv_heads, self.head_dim), 2, axis=2)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq = inverse_frequencies(self.rope, self.head_dim)
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

    def _score_divisor(self) -> float:
        """Scores are divided by sqrt(head_dim), or by sqrt(query_pre_attn_scalar) (Gemma)."""
        scalar = self.cfg.query_pre_attn_scalar
        return float(np.sqrt(self.head_dim if scalar is None else scalar))

    def _attend(self, q, k, v, mask):
        if isinstance(mask, Band):  # packed rows of short segments: only the band is computed
            y = banded_attention(q, k, v, mask, self.window, self._score_divisor())
        elif isinstance(mask, Segments):  # the flash kernel: no [T, T] scores, masked blocks skipped
            y = splash_attention(q, k, v, mask, self.window, self._score_divisor())
        else:
            # Grouped heads read their KV head directly; scores and softmax in float32
            # whatever the compute dtype.
            y = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0 / self._score_divisor())
        return self.out(y.reshape(y.shape[0], y.shape[1], -1))

    def __call__(self, x, positions, mask):
        q, k, v = self._project(x, positions)
        return self._attend(q, k, v, mask)

    def decode(self, x, start, cache_k, cache_v, read_len: int | None = None):
        """A chunk of P tokens per row at positions start[b] + 0..P-1, written into the
        KV cache (writes past its end are dropped). x: [B, P, d]; caches: [B, H_kv, T, D],
        heads before time so each slot's history is contiguous per head. A query sees
        cached keys up to its own position (and, in a sliding layer, within its window):
        keys beyond it are stale (an earlier episode in this slot, or chunk padding) and
        masked out. The query heads of a group attend to their shared KV head directly
        (no repeated copy of the cache). read_len (static): only the first read_len cache
        positions are read (decoding is bound by reading the cache: its filled part is what
        counts); every query that matters must sit below it."""
        b, p, _ = x.shape
        positions = start[:, None] + jnp.arange(p)[None, :]  # [B, P]
        q, k, v = self._project(x, positions)
        rows = jnp.arange(b)[:, None]
        cache_k = cache_k.at[rows, :, positions].set(k.astype(cache_k.dtype), mode="drop")
        cache_v = cache_v.at[rows, :, positions].set(v.astype(cache_v.dtype), mode="drop")
        keys, values = (cache_k, cache_v) if read_len is None else (cache_k[:, :, :read_len], cache_v[:, :, :read_len])
        groups = self.cfg.n_heads // self.cfg.n_kv_heads
        q = q.reshape(b, p, self.cfg.n_kv_heads, groups, self.head_dim)
        scores = jnp.einsum("bpkgd,bktd->bkgpt", q, keys) / jnp.asarray(self._score_divisor(), q.dtype)
        offset = positions[:, :, None] - jnp.arange(keys.shape[2])[None, None, :]  # [B, P, T]: q - k
        visible = (offset >= 0) & (offset < self.window) if self.window else offset >= 0
        scores = jnp.where(visible[:, None, None], scores, jnp.finfo(scores.dtype).min)
        # Weights times values as [g * p, T] @ [T, D] per (slot, KV head): the layout XLA:CPU
        # runs as one fast batched matmul (the output order bpkgd made it a generic dot,
        # 20x slower per layer at 64 slots); the small result is transposed after.
        weights = jax.nn.softmax(scores, axis=-1).reshape(b, self.cfg.n_kv_heads, groups * p, -1)
        y = jnp.einsum("bkqt,bktd->bkqd", weights, values).reshape(b, self.cfg.n_kv_heads, groups, p, -1)
        return self.out(y.transpose(0, 3, 1, 2, 4).reshape(b, p, -1)), cache_k, cache_v


class MLP(nnx.Module):
    """Gated feed-forward: SwiGLU, or GeGLU with the tanh-approximated GELU (Gemma)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.activation = cfg.activation
        self.gate = _linear(cfg.d_model, cfg.mlp_dim, ("embed", "mlp"), rngs)
        self.up = _linear(cfg.d_model, cfg.mlp_dim, ("embed", "mlp"), rngs)
        self.down = _linear(cfg.mlp_dim, cfg.d_model, ("mlp", "embed"), rngs)

    def __call__(self, x):
        gate = self.gate(x)
        gate = jax.nn.silu(gate) if self.activation == "silu" else jax.nn.gelu(gate, approximate=True)
        return self.down(gate * self.up(x))


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rngs: nnx.Rngs):
        self.attn_norm = _norm(cfg, rngs)
        self.attn = Attention(cfg, layer, rngs)
        self.mlp_norm = _norm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)
        self.sandwich = cfg.sandwich_norms
        if cfg.sandwich_norms:  # Gemma: each sub-layer's output is normed before the residual add
            self.post_attn_norm = _norm(cfg, rngs)
            self.post_mlp_norm = _norm(cfg, rngs)

    def _residual_mlp(self, x):
        h = self.mlp(self.mlp_norm(x))
        return x + (self.post_mlp_norm(h) if self.sandwich else h)

    def _residual_attn(self, x, h):
        return x + (self.post_attn_norm(h) if self.sandwich else h)

    def __call__(self, x, positions, mask):
        x = self._residual_attn(x, self.attn(self.attn_norm(x), positions, mask))
        return self._residual_mlp(x)

    def decode(self, x, start, cache_k, cache_v, read_len: int | None = None):
        h, cache_k, cache_v = self.attn.decode(self.attn_norm(x), start, cache_k, cache_v, read_len)
        return self._residual_mlp(self._residual_attn(x, h)), cache_k, cache_v


def _layer_mask(layer, segment_ids, positions, span, block, attention="xla"):
    """The mask a layer attends under: the flash kernel's segments, a Band (banded
    attention, which applies the layer's window itself) or the dense segment-causal mask,
    windowed for a sliding layer."""
    if attention == "splash":
        return Segments(segment_ids, span)
    block = None if span is None else band_block(segment_ids.shape[1], span, block)
    if block is not None:
        return Band(segment_ids, positions, span, block)
    mask = segment_causal_mask(segment_ids)
    return mask & window_mask(positions, layer.attn.window) if layer.attn.window else mask


def _remat_layer(layer, x, segment_ids, positions, span, block, attention):
    """One layer under jax.checkpoint: only its input is saved for the backward pass; the
    mask is rebuilt inside from the (small, integer) segment ids and positions."""
    graphdef, state = nnx.split(layer)

    def run(state, x, segment_ids, positions):
        layer = nnx.merge(graphdef, state)
        return layer(x, positions, _layer_mask(layer, segment_ids, positions, span, block, attention))

    return jax.checkpoint(run)(state, x, segment_ids, positions)


def _uniform(blocks) -> bool:
    """Whether every layer has the same structure and static settings (window, RoPE, LoRA
    targets): then one compiled layer body serves them all."""
    first = nnx.graphdef(blocks[0])
    return all(nnx.graphdef(b) == first for b in blocks[1:])


def _scan_layers(blocks, x, segment_ids, positions, span, block, remat, attention):
    """The layers as one lax.scan over their params stacked at trace time: XLA compiles
    one layer instead of n_layers copies (a 30-layer step compiled in a fraction of the
    time), while the param tree stays a list of layers (checkpoints, LoRA, the store).
    Stacking costs one pass over the weights, fused with the compute-dtype cast. With
    remat only each layer's input is kept for the backward pass."""
    graphdef = nnx.graphdef(blocks[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b) for b in blocks])
    mask = _layer_mask(blocks[0], segment_ids, positions, span, block, attention)  # the same for every layer
    attn = blocks[0].attn
    table = rope_table(positions, inverse_frequencies(attn.rope, attn.head_dim))  # once, not once a layer

    def run(x, state):
        return nnx.merge(graphdef, state)(x, table, mask)

    if remat:
        run = jax.checkpoint(run)
    x, _ = jax.lax.scan(lambda x, state: (run(x, state), None), x, stacked)
    return x


def _logits(h, w, spec: str):
    """Float32 logits of a vocabulary projection, accumulated in float32 from operands in
    their common dtype: bf16 logits would carry about 0.1 of error at magnitude 20, which
    log-probs and importance ratios cannot afford."""
    dt = jnp.promote_types(h.dtype, w.dtype)
    return jnp.einsum(spec, h.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        # nnx.Embed's own default (std 1/sqrt(d_model)): tied output logits start near uniform.
        embed_init = nnx.with_partitioning(
            nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0), ("vocab", "embed")
        )
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, embedding_init=embed_init, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, i, rngs) for i in range(cfg.n_layers)])
        self.final_norm = _norm(cfg, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = _linear(cfg.d_model, cfg.vocab_size, ("embed", "vocab"), rngs)

    def _embed(self, tokens):
        # The table's own dtype (nnx.Embed would promote a bf16 table's rows to its float32
        # `dtype`, and with them every activation of a mixed-precision step or a bf16 engine).
        x = jnp.take(self.embed.embedding[...], tokens, axis=0)
        if self.cfg.embed_scale:
            # As HF's Gemma: sqrt(d_model) rounded to float32, then to the embedding's dtype.
            x = x * jnp.asarray(np.float32(self.cfg.d_model**0.5), x.dtype)
        return x

    def __call__(self, tokens, segment_ids, positions, span: int | None = None, block: int | None = None):
        """tokens, segment_ids, positions: int [B, T] -> logits float32 [B, T, vocab].

        span: a bound on every segment's length (static). Given, and the rows long enough
        that it pays, attention is banded (core/policy/model/banded_attention.py; `block`: its
        query block size, default there): the same logits wherever a token is not padding,
        provided no segment is longer than span. None: the dense segment-causal mask."""
        return self.head(self.hidden(tokens, segment_ids, positions, span, block))

    def hidden(self, tokens, segment_ids, positions, span=None, block=None, remat: bool = False, attention="xla"):
        """The final-normed hidden states [B, T, d] that `head` projects to logits (a loss
        can project them a chunk at a time: core/policy/model/logprobs.py). remat: each layer's
        activations are recomputed in the backward pass instead of kept, so a step keeps
        one [B, T, d] per layer (jax.checkpoint), not every intermediate. attention: one
        of ATTENTION_IMPLS ("splash": the flash kernel, exact for any span). The compute
        dtype is the params' (a mixed-precision step passes bf16 copies)."""
        if attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {attention!r}")
        x = self._embed(tokens)
        if _uniform(self.blocks):
            x = _scan_layers(self.blocks, x, segment_ids, positions, span, block, remat, attention)
            return self.final_norm(x)
        for layer in self.blocks:  # Gemma's sliding and full layers differ: one body each
            if remat:
                x = _remat_layer(layer, x, segment_ids, positions, span, block, attention)
            else:
                x = layer(x, positions, _layer_mask(layer, segment_ids, positions, span, block, attention))
        return self.final_norm(x)

    def head(self, h):
        """Hidden states [..., d] -> float32 logits [..., vocab], accumulated in float32."""
        if self.cfg.tie_embeddings:
            return _logits(h, self.embed.embedding[...], "...d,vd->...v")
        if type(self.lm_head) is nnx.Linear and self.lm_head.bias is None:
            return _logits(h, self.lm_head.kernel[...], "...d,dv->...v")
        return self.lm_head(h).astype(jnp.float32)  # a LoRA-wrapped head

    def decode(self, tokens, start, cache, last=None, read_len: int | None = None):
        """KV-cached chunk step: tokens int [B, P] at positions start[b] + 0..P-1;
        cache: a tuple with one (k, v) pair per layer, each [B, H_kv, T, D] (per-layer
        arrays, so a donated cache is updated in place, not re-stacked every step).
        Returns (logits [B, P, vocab], cache); with `last` (int [B]), the logits of chunk
        position last[b] only, [B, vocab]: a prefill chunk of 64 need not project 64
        positions onto the vocabulary to sample one token. read_len (static): attention
        reads only the first read_len cache positions (Attention.decode)."""
        x = self._embed(tokens)
        new_cache = []
        for block, (k, v) in zip(self.blocks, cache):
            x, k, v = block.decode(x, start, k, v, read_len)
            new_cache.append((k, v))
        if last is not None:
            x = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
        return self.head(self.final_norm(x)), tuple(new_cache)

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
    """Parameters carry logical axis names as metadata only; trainer/learning/step/sharding.py places
    them on a mesh when there is one (eager sharding would demand a mesh here)."""
    with nnx.use_eager_sharding(False):
        return Transformer(cfg, nnx.Rngs(seed))


def abstract_model(cfg: ModelConfig) -> Transformer:
    """The model's structure, shapes and axis annotations with no arrays allocated: the
    skeleton a checkpoint's weights are loaded into."""
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0)))


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
