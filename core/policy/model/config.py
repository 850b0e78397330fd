"""The policy model's typed, self-validating config, and the named sizes.

One config describes every family the model code runs: the built-in byte-level policy
(the defaults) and the Hugging Face families read by core/policy/formats/hf_config.py (Qwen2/2.5,
Qwen3, Llama 3.x, Gemma 3 text). Each field that is not a plain size switches on one
feature; its default is what the built-in policy does, so the built-in configs build
exactly the modules and numerics they always had.
"""

from __future__ import annotations

import dataclasses

from core.config import configclass, derived
from core.policy.text import tokenizer

ROPE_KINDS = ("default", "linear", "llama3")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
FULL, SLIDING = "full_attention", "sliding_attention"  # HF's layer_types names


@configclass
class RopeConfig:
    """One RoPE setting, as HF's rope_parameters states it. `kind` is the rope_type:
    "default", "linear" (frequencies / factor) or "llama3" (Llama 3.1's banded rescale)."""

    base: float = derived(10_000.0, gt=0)
    kind: str = derived("default", choices=ROPE_KINDS)
    factor: float = derived(1.0, gt=0)
    low_freq_factor: float = derived(1.0)  # llama3 only
    high_freq_factor: float = derived(4.0)  # llama3 only
    original_max_position: int = derived(8192, ge=1)  # llama3 only

    def __post_init__(self):
        if self.kind == "llama3" and not (0 < self.low_freq_factor < self.high_freq_factor):
            raise ValueError("llama3 rope needs 0 < low_freq_factor < high_freq_factor")


@configclass
class ModelConfig:
    vocab_size: int = derived(tokenizer.VOCAB_SIZE, ge=1)
    d_model: int = derived(64, ge=1)
    n_layers: int = derived(2, ge=1)
    n_heads: int = derived(4, ge=1)
    n_kv_heads: int = derived(2, ge=1)  # grouped-query attention: n_heads / n_kv_heads query heads share a KV head
    mlp_dim: int = derived(256, ge=1)
    max_seq_len: int = derived(256, ge=1)
    rope: RopeConfig = RopeConfig()
    # Family features (defaults: the built-in policy).
    head_size: int | None = derived(None, ge=2)  # explicit head_dim (Qwen3, Gemma); None: d_model // n_heads
    norm_eps: float = derived(1e-6, gt=0)  # nnx.RMSNorm's default, which the built-in policy always used
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each query/key head before RoPE
    tie_embeddings: bool = True  # False: a separate lm_head (Llama 3 8B, Qwen2.5 7B)
    # the gated MLP's gate: SwiGLU, or GeGLU ("gelu_pytorch_tanh", Gemma)
    activation: str = derived("silu", choices=ACTIVATIONS)
    norm_offset: bool = False  # Gemma: RMSNorm scales by (1 + w), so w starts at zero
    sandwich_norms: bool = False  # Gemma: extra norms after attention and after the MLP
    embed_scale: bool = False  # Gemma: embeddings times sqrt(d_model)
    query_pre_attn_scalar: float | None = derived(None, gt=0)  # Gemma: scores scale 1/sqrt(this); None: head_dim
    # per layer FULL or SLIDING; (): every layer FULL
    layer_types: tuple[str, ...] = derived((), choices=(FULL, SLIDING))
    sliding_window: int = derived(0, ge=0)  # a SLIDING layer's query sees keys at q - k < sliding_window
    rope_local: RopeConfig | None = None  # Gemma: RoPE of SLIDING layers; None: `rope`

    def __post_init__(self):
        if self.head_size is None and (self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2):
            raise ValueError("d_model must split into n_heads heads of even size (RoPE pairs)")
        if self.head_size is not None and self.head_size % 2:
            raise ValueError(f"head_size must be even (RoPE pairs), got {self.head_size}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}")
        if self.layer_types and len(self.layer_types) != self.n_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.n_layers} layers")
        if SLIDING in self.layer_types and self.sliding_window <= 0:
            raise ValueError(f"sliding layers need sliding_window > 0, got {self.sliding_window}")

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.d_model // self.n_heads

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else FULL

    def layer_rope(self, i: int) -> RopeConfig:
        return self.rope_local if self.layer_type(i) == SLIDING and self.rope_local is not None else self.rope

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """The inverse of to_dict (a manifest's JSON: tuples come back as lists)."""
        d = dict(d)
        for key in ("rope", "rope_local"):
            if isinstance(d.get(key), dict):
                d[key] = RopeConfig(**d[key])
        d["layer_types"] = tuple(d.get("layer_types", ()))
        return cls(**d)


def check_vocab(cfg: ModelConfig, tokenizer_vocab_size: int) -> None:
    """A tokenizer whose ids reach past the embedding would index out of range; refuse the
    pair before anything runs. (HF vocabularies differ, so this is not the config's own check.)"""
    if tokenizer_vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the tokenizer's vocabulary ({tokenizer_vocab_size}) is larger than the model's "
            f"embedding (vocab_size {cfg.vocab_size})"
        )


MODEL_CONFIGS = {
    "tiny": ModelConfig(),  # CPU tests and the demo: ~0.1 M parameters
    "small": ModelConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, mlp_dim=1024, max_seq_len=512),
    "base": ModelConfig(d_model=1024, n_layers=12, n_heads=16, n_kv_heads=4, mlp_dim=2816, max_seq_len=2048),
    "1b": ModelConfig(d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, mlp_dim=5632, max_seq_len=4096),
}
for _cfg in MODEL_CONFIGS.values():  # the named sizes run with the byte tokenizer
    check_vocab(_cfg, tokenizer.VOCAB_SIZE)


def model_config(name: str) -> ModelConfig:
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model config {name!r}; known: {sorted(MODEL_CONFIGS)}") from None
