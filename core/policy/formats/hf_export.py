"""NNX params -> a Hugging Face checkpoint directory that transformers loads.

Writes config.json (hf_config.hf_config_dict), model.safetensors (one file, through the
same key map the loader reads, hf_keys.py) and generation_config.json. The built-in
byte-level policy exports as LlamaForCausalLM with tied embeddings: its layer is Llama's
(pre-norm RMSNorm with eps 1e-6, rotate-half RoPE with base 10,000, SwiGLU, GQA, no biases),
so transformers computes the same function. The tokenizer files are not written here.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from core.policy.formats.hf_config import hf_config_dict
from core.policy.formats.hf_keys import slots
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import Transformer, abstract_model

_NAMES = {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16"}


def flat_params(params) -> dict[tuple, np.ndarray]:
    """path -> array, from a Transformer, a params State, or the pure dict a policy store
    holds (whose list indices may come back as strings)."""
    if isinstance(params, Transformer):
        params = nnx.state(params, nnx.Param)
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    out = {}

    def walk(node, path):
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, (*path, int(key) if isinstance(key, str) and key.isdigit() else key))
        else:
            out[path] = np.asarray(node)

    walk(params, ())
    return out


def checked_params(cfg: ModelConfig, params) -> tuple[dict, dict]:
    """(path -> array, path -> shape the model of cfg has): ValueError naming the first
    parameter missing from the model, not part of it, or of another shape."""
    flat = flat_params(params)
    _, state = nnx.split(abstract_model(cfg))
    want = {path: tuple(var.get_value().shape) for path, var in nnx.to_flat_state(state)}
    for path in sorted(set(want) ^ set(flat), key=str):
        which = "missing from" if path in want else "not part of"
        raise ValueError(f"parameter {'.'.join(map(str, path))} is {which} the model of this config")
    for path, shape in want.items():
        if flat[path].shape != shape:
            raise ValueError(
                f"parameter {'.'.join(map(str, path))} has shape {flat[path].shape}, config implies {shape}"
            )
    return flat, want


def export_checkpoint(out_dir: str | Path, cfg: ModelConfig, params, bos_token_id=None, eos_token_id=None) -> Path:
    """Writes the checkpoint into out_dir (created if needed) and returns it. params must be
    exactly the model's of cfg (every path, every shape), all float32 or all bfloat16."""
    out_dir = Path(out_dir)
    flat, want = checked_params(cfg, params)
    dtypes = {flat[p].dtype for p in want}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _NAMES:
        raise ValueError(f"params must be all float32 or all bfloat16, got {sorted(map(str, dtypes))}")
    dtype = next(iter(dtypes))
    config = hf_config_dict(cfg, _NAMES[dtype], bos_token_id, eos_token_id)  # refuses unrepresentable configs
    tensors = {}
    for s in slots(cfg, want):
        x = np.split(flat[s.path], s.parts, axis=-1)[s.part]
        tensors[s.hf_key] = np.ascontiguousarray(x.T if s.transpose else x)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {k: v for k, v in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)) if v is not None}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out_dir
