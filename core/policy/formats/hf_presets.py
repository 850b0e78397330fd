"""config.json of real checkpoints (the keys that size them), as their model cards ship
them: the shapes the scale planner and the accelerator benchmark use where no weights can
travel. `preset_config(name)` is the ModelConfig core/policy/formats/hf_config.py reads from one."""

from __future__ import annotations

from core.policy.formats.hf_config import config_from_hf
from core.policy.model.config import ModelConfig

PRESETS = {
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_hidden_layers=30,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_hidden_layers=24,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
        rope_theta=1000000.0),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_hidden_layers=28,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
        rope_theta=1000000.0),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_hidden_layers=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, max_position_embeddings=32768,
        rope_theta=1000000.0),
}  # fmt: skip


def preset_config(name: str) -> ModelConfig:
    try:
        return config_from_hf(PRESETS[name.lower()], source=name)
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
