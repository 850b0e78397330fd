"""The policy model's typed, self-validating config, and the named sizes."""

from __future__ import annotations

import dataclasses

from core.policy import tokenizer


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = tokenizer.VOCAB_SIZE
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: n_heads / n_kv_heads query heads share a KV head
    mlp_dim: int = 256
    max_seq_len: int = 256
    rope_base: float = 10_000.0

    def __post_init__(self):
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_dim", "max_seq_len"):
            if getattr(self, f) <= 0:
                raise ValueError(f"ModelConfig.{f} must be positive, got {getattr(self, f)}")
        if self.vocab_size < tokenizer.VOCAB_SIZE:
            raise ValueError(f"vocab_size {self.vocab_size} < tokenizer's {tokenizer.VOCAB_SIZE}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("d_model must split into n_heads heads of even size (RoPE pairs)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


MODEL_CONFIGS = {
    "tiny": ModelConfig(),  # CPU tests and the demo: ~0.1 M parameters
    "small": ModelConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, mlp_dim=1024, max_seq_len=512),
    "base": ModelConfig(d_model=1024, n_layers=12, n_heads=16, n_kv_heads=4, mlp_dim=2816, max_seq_len=2048),
    "1b": ModelConfig(d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, mlp_dim=5632, max_seq_len=4096),
}


def model_config(name: str) -> ModelConfig:
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model config {name!r}; known: {sorted(MODEL_CONFIGS)}") from None
