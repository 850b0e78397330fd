"""Tiny random Hugging Face checkpoints of each supported family, written with
transformers' own save_pretrained (no hub, no network), for the equivalence tests.

Every parameter is redrawn at a scale where each feature shows in the logits (norm weights
away from their init, biases non-zero), so a mapping or numerics mistake cannot hide.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import transformers

VOCAB = 300
COMMON = dict(vocab_size=VOCAB, intermediate_size=64, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)

# family -> (config class, kwargs): each exercises its family's features.
FAMILIES = {
    # q/k/v biases, tied embeddings
    "qwen2": (transformers.Qwen2Config, dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, tie_word_embeddings=True)),
    # q/k norms, explicit head_dim (16 != 32 / 4), untied lm_head
    "qwen3": (transformers.Qwen3Config, dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)),
    # llama3 rope scaling with every band populated (original context 16, head_dim 16), untied lm_head
    "llama": (transformers.LlamaConfig, dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    # sliding window 5 < the sequences, full/sliding layers with their own RoPE (linear on full),
    # query_pre_attn_scalar != head_dim, GQA 4:1
    "gemma3_text": (transformers.Gemma3TextConfig, dict(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        query_pre_attn_scalar=12, sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
}  # fmt: skip


def hf_model(family: str, seed: int = 0, overrides: dict | None = None) -> transformers.PreTrainedModel:
    cls, kwargs = FAMILIES[family]
    torch.manual_seed(seed)
    config = cls(**{**COMMON, **kwargs, **(overrides or {})})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    offset = family == "gemma3_text"  # Gemma's norms scale by (1 + w)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((0.0 if offset else 1.0) + 0.3 * torch.randn_like(p))
            elif "embed" in name:
                p.copy_(0.5 * torch.randn_like(p))
            elif p.ndim == 2:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.generation_config.eos_token_id = None  # greedy runs the full length, as ours does
    return model.eval()


def save(model, path: Path, dtype=torch.float32) -> Path:
    copy.deepcopy(model).to(dtype).save_pretrained(path)
    return path


def load_hf(path: Path) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    model.generation_config.eos_token_id = None
    return model.eval()


def legacy_layout(config: dict) -> dict:
    """The same config.json as real Qwen2.5 / Llama 3.2 / Gemma 3 checkpoints ship it: top-level
    rope_theta + rope_scaling (old key "type"), Gemma's rope_local_base_freq and
    sliding_window_pattern instead of rope_parameters and layer_types."""
    d = dict(config)
    rope = d.pop("rope_parameters")
    if d["model_type"] == "gemma3_text":
        full, local = dict(rope["full_attention"]), rope["sliding_attention"]
        d["rope_local_base_freq"] = local["rope_theta"]
        pattern = 2  # FAMILIES' layer_types is the pattern-2 layout: sliding, full, sliding
        assert d.pop("layer_types") == [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(3)
        ]
        d["sliding_window_pattern"] = pattern
        d.pop("_sliding_window_pattern", None)
    else:
        full = dict(rope)
    d["rope_theta"] = full.pop("rope_theta")
    kind = full.pop("rope_type")
    d["rope_scaling"] = None if kind == "default" else {"type": kind, **full}
    return d


def rewrite_config(path: Path, edit) -> Path:
    """Applies edit(dict) to path/config.json in place."""
    file = Path(path) / "config.json"
    d = json.loads(file.read_text())
    edit(d)
    file.write_text(json.dumps(d))
    return path


# config.json of real checkpoints, as they ship (abridged to the keys that matter): the
# top-level rope layout, nulls, and each family's own way of saying sliding windows.
REAL_CONFIGS = {
    "Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2", hidden_act="silu", hidden_size=896, intermediate_size=4864, max_position_embeddings=32768,
        max_window_layers=21, num_attention_heads=14, num_hidden_layers=24, num_key_value_heads=2, rms_norm_eps=1e-06,
        rope_theta=1000000.0, sliding_window=32768, tie_word_embeddings=True, use_sliding_window=False,
        vocab_size=151936, torch_dtype="bfloat16"),
    "Qwen3-0.6B": dict(
        model_type="qwen3", attention_bias=False, head_dim=128, hidden_act="silu", hidden_size=1024,
        intermediate_size=3072, max_position_embeddings=40960, max_window_layers=28, num_attention_heads=16,
        num_hidden_layers=28, num_key_value_heads=8, rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000,
        sliding_window=None, tie_word_embeddings=True, use_sliding_window=False, vocab_size=151936),
    "Llama-3.2-1B": dict(
        model_type="llama", attention_bias=False, head_dim=64, hidden_act="silu", hidden_size=2048,
        intermediate_size=8192, max_position_embeddings=131072, mlp_bias=False, num_attention_heads=32,
        num_hidden_layers=16, num_key_value_heads=8, pretraining_tp=1, rms_norm_eps=1e-05,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        rope_theta=500000.0, tie_word_embeddings=True, vocab_size=128256),
    "gemma-3-1b-it": dict(
        model_type="gemma3_text", attention_bias=False, attn_logit_softcapping=None, final_logit_softcapping=None,
        head_dim=256, hidden_activation="gelu_pytorch_tanh", hidden_size=1152, intermediate_size=6912,
        max_position_embeddings=32768, num_attention_heads=4, num_hidden_layers=26, num_key_value_heads=1,
        query_pre_attn_scalar=256, rms_norm_eps=1e-06, rope_local_base_freq=10000, rope_scaling=None,
        rope_theta=1000000, sliding_window=512, sliding_window_pattern=6, vocab_size=262144),
    "gemma-3-4b-text": dict(  # the 4B's text_config: linear RoPE scaling on its global layers
        model_type="gemma3_text", head_dim=256, hidden_size=2560, intermediate_size=10240,
        max_position_embeddings=131072, num_attention_heads=8, num_hidden_layers=34, num_key_value_heads=4,
        query_pre_attn_scalar=256, rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=1000000.0,
        sliding_window=1024, vocab_size=262208),
}  # fmt: skip


def hf_inverse_frequencies(config: dict) -> dict[str, torch.Tensor]:
    """transformers' own RoPE frequencies per layer type for a config.json dict."""
    hf = transformers.AutoConfig.for_model(**config)
    models = transformers.models
    if config["model_type"] == "gemma3_text":
        rotary = models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding(hf)
        return {t: getattr(rotary, f"{t}_inv_freq") for t in set(hf.layer_types)}
    rotary = {
        "qwen2": models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding,
        "qwen3": models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding,
        "llama": models.llama.modeling_llama.LlamaRotaryEmbedding,
    }[config["model_type"]](hf)
    return {"full_attention": rotary.inv_freq, "sliding_attention": rotary.inv_freq}
