"""Which Hugging Face tensor fills which NNX parameter, per family (one table each).

Loading (hf_weights.py) and export (hf_export.py) read the same table, so what goes in
and what comes out cannot drift apart. A row names our parameter's path below a layer
(or at the top) and the HF tensor(s) it holds. Our `kv` projection fuses HF's k_proj and
v_proj along its output axis ([k | v]); Linear kernels are HF weights transposed
([in, out] here, [out, in] there).
"""

from __future__ import annotations

import dataclasses

from core.policy.formats.hf_config import hf_family
from core.policy.model.config import ModelConfig

_TOP = {
    ("embed", "embedding"): ("model.embed_tokens.weight",),
    ("final_norm", "scale"): ("model.norm.weight",),
    ("lm_head", "kernel"): ("lm_head.weight",),
}
_LAYER = {
    ("attn_norm", "scale"): ("input_layernorm.weight",),
    ("attn", "q", "kernel"): ("self_attn.q_proj.weight",),
    ("attn", "q", "bias"): ("self_attn.q_proj.bias",),
    ("attn", "kv", "kernel"): ("self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    ("attn", "kv", "bias"): ("self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    ("attn", "out", "kernel"): ("self_attn.o_proj.weight",),
    ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight",),
    ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight",),
    ("mlp", "gate", "kernel"): ("mlp.gate_proj.weight",),
    ("mlp", "up", "kernel"): ("mlp.up_proj.weight",),
    ("mlp", "down", "kernel"): ("mlp.down_proj.weight",),
    # Llama's name for the norm before the MLP.
    ("mlp_norm", "scale"): ("post_attention_layernorm.weight",),
}
# Gemma 3 reuses "post_attention_layernorm" for the norm *after* attention.
_GEMMA_LAYER = {
    **_LAYER,
    ("mlp_norm", "scale"): ("pre_feedforward_layernorm.weight",),
    ("post_attn_norm", "scale"): ("post_attention_layernorm.weight",),
    ("post_mlp_norm", "scale"): ("post_feedforward_layernorm.weight",),
}
KEY_MAPS = {"qwen2": _LAYER, "qwen3": _LAYER, "llama": _LAYER, "gemma3_text": _GEMMA_LAYER}


@dataclasses.dataclass(frozen=True)
class Slot:
    """HF tensor `hf_key` is part `part` of `parts` equal slices (last axis) of our
    parameter at `path`; `transpose` for Linear kernels."""

    hf_key: str
    path: tuple
    part: int
    parts: int
    transpose: bool

    def hf_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
        shape = (*ours[:-1], ours[-1] // self.parts)
        return tuple(reversed(shape)) if self.transpose else shape


def slots(cfg: ModelConfig, paths) -> list[Slot]:
    """One Slot per HF tensor for our parameter paths (those of the model cfg builds).
    A path with no row is a bug in this table, never skipped."""
    table = KEY_MAPS[hf_family(cfg)]
    out = []
    for path in paths:
        if path[0] == "blocks":
            names = table.get(tuple(path[2:]))
            names = names and tuple(f"model.layers.{path[1]}.{n}" for n in names)
        else:
            names = _TOP.get(tuple(path))
        if not names:
            raise KeyError(f"no Hugging Face tensor maps to parameter {'.'.join(map(str, path))}")
        for i, name in enumerate(names):
            out.append(Slot(name, tuple(path), i, len(names), path[-1] == "kernel"))
    return out
