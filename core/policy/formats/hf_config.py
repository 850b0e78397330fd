"""A Hugging Face checkpoint's config.json <-> ModelConfig.

Reads both layouts real checkpoints ship: top-level `rope_theta` + `rope_scaling` (Qwen2.5,
Llama 3.2, Gemma 3 with `rope_local_base_freq`) and transformers 5's `rope_parameters`
(flat, or nested per layer type for Gemma 3). A missing key takes the default of the
family's transformers config class, so a checkpoint means here what it means there. An
unsupported model_type, rope type or feature is refused by name: ValueError naming the
file and the key. Writing uses the top-level layout, which transformers 4 and 5 both read.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.policy.model.config import FULL, ROPE_KINDS, SLIDING, ModelConfig, RopeConfig

FAMILIES = ("qwen2", "qwen3", "llama", "gemma3_text")
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
# transformers' class defaults for keys a config.json may leave out.
_MAX_POSITIONS = {"qwen2": 32768, "qwen3": 32768, "llama": 2048, "gemma3_text": 131072}
_TIED = {"qwen2": False, "qwen3": False, "llama": False, "gemma3_text": True}
_ROPE_THETA = {"qwen2": 10_000.0, "qwen3": 10_000.0, "llama": 10_000.0, "gemma3_text": 1_000_000.0}
_GEMMA_LOCAL_THETA = 10_000.0
_ROPE_KEYS = {
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "partial_rotary_factor",
}


def _refuse(source: str, key: str, why: str) -> ValueError:
    return ValueError(f"{source}: {key}: {why}")


def read_hf_config(checkpoint: str | Path) -> ModelConfig:
    """ModelConfig of the checkpoint directory's config.json."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise ValueError(f"{path}: no such file (a Hugging Face checkpoint directory has a config.json)")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    return config_from_hf(d, source=str(path))


def config_from_hf(d: dict, source: str = "config.json") -> ModelConfig:
    family = d.get("model_type")
    if family == "gemma3":
        raise _refuse(source, "model_type", "'gemma3' is the multimodal model; only the text model gemma3_text runs")
    if family not in FAMILIES:
        raise _refuse(source, "model_type", f"{family!r} is not supported; supported: {', '.join(FAMILIES)}")
    if d.get("quantization_config") is not None:
        raise _refuse(source, "quantization_config", "quantized checkpoints are not supported")

    def need(key):
        if d.get(key) is None:
            raise _refuse(source, key, "missing")
        return d[key]

    gemma = family == "gemma3_text"
    d_model, n_heads = need("hidden_size"), need("num_attention_heads")
    head_dim = d.get("head_dim") or {"qwen3": 128, "gemma3_text": 256}.get(family, d_model // n_heads)
    _features(d, family, source)
    act_key = "hidden_activation" if gemma else "hidden_act"
    activation = d.get(act_key) or ("gelu_pytorch_tanh" if gemma else "silu")
    if activation not in (("gelu_pytorch_tanh", "silu") if gemma else ("silu",)):
        raise _refuse(source, act_key, f"{activation!r} is not supported")
    max_pos = d.get("max_position_embeddings") or _MAX_POSITIONS[family]
    layer_types, window = _layer_types(d, family, need("num_hidden_layers"), source)
    rope, rope_local = _ropes(d, family, max_pos, source)
    if not layer_types or rope_local == rope:
        rope_local = None
    try:
        return ModelConfig(
            vocab_size=need("vocab_size"),
            d_model=d_model,
            n_layers=need("num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=d.get("num_key_value_heads") or n_heads,
            mlp_dim=need("intermediate_size"),
            max_seq_len=max_pos,
            rope=rope,
            head_size=None if head_dim * n_heads == d_model else head_dim,
            norm_eps=float(d.get("rms_norm_eps") or 1e-6),
            qkv_bias=family == "qwen2",
            qk_norm=family in ("qwen3", "gemma3_text"),
            tie_embeddings=bool(d.get("tie_word_embeddings", _TIED[family])),
            activation=activation,
            norm_offset=gemma,
            sandwich_norms=gemma,
            embed_scale=gemma,
            query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or 256) if gemma else None,
            layer_types=layer_types,
            sliding_window=window,
            rope_local=rope_local,
        )
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def _features(d: dict, family: str, source: str) -> None:
    """Refuses the switches of features the model code does not implement."""
    off = {"attention_bias": False, "mlp_bias": False, "use_bidirectional_attention": False}
    if family == "qwen2":
        off.pop("attention_bias")  # Qwen2 always has q/k/v biases; the key is not read there
    for key, value in off.items():
        if d.get(key, value) not in (value, None):
            raise _refuse(source, key, f"{d[key]!r} is not supported (only {value})")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if d.get(key) is not None:
            raise _refuse(source, key, f"softcapping ({d[key]!r}) is not supported")


def _layer_types(d: dict, family: str, n_layers: int, source: str) -> tuple[tuple[str, ...], int]:
    """(layer_types, sliding_window), canonical: ((), 0) when no layer slides."""
    if family in ("qwen2", "qwen3"):
        # As transformers: the window exists only with use_sliding_window.
        window = d.get("sliding_window") if d.get("use_sliding_window") else None
        default = [SLIDING if window and i >= d.get("max_window_layers", 28) else FULL for i in range(n_layers)]
    elif family == "gemma3_text":
        window = d.get("sliding_window", 4096)
        pattern = d.get("sliding_window_pattern", 6)
        default = [SLIDING if (i + 1) % pattern else FULL for i in range(n_layers)]
    else:
        window, default = None, [FULL] * n_layers
    types = d.get("layer_types") or default
    if len(types) != n_layers or set(types) - {FULL, SLIDING}:
        raise _refuse(source, "layer_types", f"{types!r}: need {n_layers} of {FULL!r} or {SLIDING!r}")
    if family == "llama" and SLIDING in types:
        raise _refuse(source, "layer_types", "llama has no sliding-window layers")
    if not window or SLIDING not in types:
        return (), 0
    return tuple(types), int(window)


def _ropes(d: dict, family: str, max_pos: int, source: str) -> tuple[RopeConfig, RopeConfig]:
    """(RoPE of full layers, RoPE of sliding layers), from either layout."""
    params, scaling = d.get("rope_parameters"), d.get("rope_scaling")
    if params is not None and scaling is not None:
        raise _refuse(source, "rope_scaling", "both rope_scaling and rope_parameters are set; keep one")
    theta = d.get("rope_theta") or _ROPE_THETA[family]
    local_theta = d.get("rope_local_base_freq") or _GEMMA_LOCAL_THETA
    if params is None:  # top-level layout; Gemma's scaling applies to its full layers only
        full = {"rope_theta": theta, **(scaling or {})}
        local = {"rope_theta": local_theta} if family == "gemma3_text" else full
        key = "rope_scaling"
        return _rope(full, max_pos, d, source, key), _rope(local, max_pos, d, source, key)
    if not isinstance(params, dict):
        raise _refuse(source, "rope_parameters", f"{params!r} is not a mapping")
    if FULL in params or SLIDING in params:  # nested per layer type
        fallback = {FULL: theta, SLIDING: local_theta if family == "gemma3_text" else theta}
        extra = set(params) - {FULL, SLIDING}
        if extra:
            raise _refuse(source, f"rope_parameters.{sorted(extra)[0]}", "not a supported layer type")
        ropes = [
            _rope({"rope_theta": fallback[t], **(params.get(t) or {})}, max_pos, d, source, f"rope_parameters.{t}")
            for t in (FULL, SLIDING)
        ]
        return ropes[0], ropes[1]
    flat = {"rope_theta": theta, **params}
    if family == "gemma3_text":  # a flat dict on Gemma is its full layers' setting
        local = _rope({"rope_theta": local_theta}, max_pos, d, source, "rope_parameters")
        return _rope(flat, max_pos, d, source, "rope_parameters"), local
    rope = _rope(flat, max_pos, d, source, "rope_parameters")
    return rope, rope


def _rope(p: dict, max_pos: int, d: dict, source: str, key: str) -> RopeConfig:
    kind = p.get("rope_type", p.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise _refuse(source, f"{key}.rope_type", f"{kind!r} is not supported; supported: {', '.join(ROPE_KINDS)}")
    unknown = sorted(set(p) - _ROPE_KEYS)
    if unknown:  # e.g. mrope_section: a feature of a rope this code does not implement
        raise _refuse(source, f"{key}.{unknown[0]}", "not supported")
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise _refuse(source, f"{key}.partial_rotary_factor", "partial rotary embeddings are not supported")

    def need(name):
        if p.get(name) is None:
            raise _refuse(source, f"{key}.{name}", f"missing (needed by rope_type {kind!r})")
        return float(p[name])

    fields = {"base": float(p["rope_theta"]), "kind": kind}
    if kind in ("linear", "llama3"):
        fields["factor"] = need("factor")
    if kind == "llama3":
        original = p.get("original_max_position_embeddings") or d.get("original_max_position_embeddings") or max_pos
        fields.update(
            low_freq_factor=need("low_freq_factor"),
            high_freq_factor=need("high_freq_factor"),
            original_max_position=int(original),
        )
    try:
        return RopeConfig(**fields)
    except ValueError as e:
        raise _refuse(source, key, str(e)) from None


def hf_family(cfg: ModelConfig) -> str:
    """The HF model_type that represents cfg exactly, or ValueError naming what none does."""
    gemma = (cfg.norm_offset, cfg.sandwich_norms, cfg.embed_scale, cfg.query_pre_attn_scalar is not None)
    if any(gemma) or cfg.activation != "silu":
        if not all(gemma) or not cfg.qk_norm or cfg.qkv_bias:
            raise ValueError("Gemma features without the whole Gemma 3 layer have no HF model_type")
        return "gemma3_text"
    if cfg.rope_local is not None:
        raise ValueError("a RoPE per layer type exists only in gemma3_text")
    if cfg.qkv_bias:
        if cfg.qk_norm:
            raise ValueError("q/k/v biases with q/k norms have no HF model_type")
        return "qwen2"
    if cfg.qk_norm:
        return "qwen3"
    if cfg.layer_types:
        raise ValueError("sliding-window layers without q/k/v biases or q/k norms have no HF model_type")
    return "llama"


def _number(x: float) -> int | float:
    """An integral value as an int: transformers 5 checks config field types strictly."""
    return int(x) if float(x).is_integer() else x


def _rope_scaling(rope: RopeConfig) -> dict | None:
    if rope.kind == "default":
        return None
    out = {"rope_type": rope.kind, "factor": rope.factor}
    if rope.kind == "llama3":
        out.update(
            low_freq_factor=rope.low_freq_factor,
            high_freq_factor=rope.high_freq_factor,
            original_max_position_embeddings=rope.original_max_position,
        )
    return out


def hf_config_dict(cfg: ModelConfig, dtype: str = "float32", bos_token_id=None, eos_token_id=None) -> dict:
    """config.json for cfg (top-level rope layout); the inverse of config_from_hf."""
    family = hf_family(cfg)
    out = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_theta": cfg.rope.base,
        "rope_scaling": _rope_scaling(cfg.rope),
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,  # transformers 4's name
        "dtype": dtype,  # transformers 5's name
    }
    if family == "gemma3_text":
        local = cfg.rope_local or cfg.rope
        if local.kind != "default":
            raise ValueError("gemma3_text's sliding layers take only a RoPE base (rope_local_base_freq)")
        out.update(
            hidden_activation=cfg.activation,
            query_pre_attn_scalar=_number(cfg.query_pre_attn_scalar),
            rope_local_base_freq=local.base,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            attention_bias=False,
        )
    else:
        out["hidden_act"] = cfg.activation
    if family == "qwen2" and cfg.head_size is not None:
        raise ValueError("qwen2 has no explicit head_dim: head_dim must be hidden_size / num_attention_heads")
    if family in ("llama", "qwen3"):
        out["attention_bias"] = False
    if family == "gemma3_text":
        out["layer_types"] = list(cfg.layer_types) or [FULL] * cfg.n_layers
        out["sliding_window"] = cfg.sliding_window or cfg.max_seq_len
    elif cfg.layer_types:
        first = cfg.layer_types.index(SLIDING)
        if any(t != SLIDING for t in cfg.layer_types[first:]):
            raise ValueError(f"{family} slides a suffix of its layers only (max_window_layers)")
        out.update(use_sliding_window=True, sliding_window=cfg.sliding_window, max_window_layers=first)
        out["layer_types"] = list(cfg.layer_types)
    return out
