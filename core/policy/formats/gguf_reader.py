"""A llama.cpp GGUF file -> a Hugging Face config dict and HF-named float32 arrays.

`read_gguf(path)` reads the metadata and the tensor directory (not the weights) and refuses,
naming the key or the tensor, whatever the import cannot represent exactly: an architecture
other than llama, qwen2, qwen3, gemma3 (text); a quantisation outside QUANTS; a missing
metadata key; a missing, extra or mis-shaped tensor; a file cut short. `GGUFModel.array()`
then dequantises one tensor at a time (`gguf.quants.dequantize`, what transformers' GGUF
loader calls too) and undoes what llama.cpp's converter did to the HF weights:
  - llama: Q and K rows are permuted per head from HF's rotate-half RoPE layout to ggml's
    interleaved one; the inverse permutation restores HF's.
  - gemma3: every RMSNorm weight is stored with 1 added (ggml's norm is `x * w`, Gemma's
    `x * (1 + w)`); 1 is subtracted in float32, as transformers does.
qwen2/qwen3 are stored as in HF. The config goes through core/policy/formats/hf_config.py both ways,
so what is written is exactly what the project's loaders read.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from core.policy.formats.hf_config import config_from_hf, hf_config_dict
from core.policy.model.config import ModelConfig

Q = GGMLQuantizationType
QUANTS = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K})
# GGUF general.architecture -> HF model_type (llama.cpp's "gemma3" file holds the text tower only).
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",  # Llama's name for the norm before the MLP
}
_GEMMA_BLOCK = {
    **_BLOCK,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's precomputed llama3 RoPE factors (Llama 3.1+)


class _Reader(GGUFReader):
    """GGUFReader that names what a cut-short file lacks instead of failing on a reshape."""

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
        if end > len(self.data):
            raise _Truncated(end)
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs, fields):
        for field in fields:  # parts: name_len, name, n_dims, dims, type, offset
            name = bytes(field.parts[1]).decode("utf-8", "replace")
            raw = int(field.parts[4][0])
            if raw not in Q._value2member_map_:
                raise ValueError(f"tensor {name}: ggml type id {raw} is unknown to the gguf package")
            block, size = GGML_QUANT_SIZES[Q(raw)]
            if int(field.parts[3][0]) % block:
                raise ValueError(f"tensor {name}: rows of {int(field.parts[3][0])} are not whole {Q(raw).name} blocks")
            end = int(start_offs) + int(field.parts[5][0]) + int(np.prod(field.parts[3])) * size // block
            if end > len(self.data):
                raise ValueError(f"tensor {name}: truncated: its data ends at byte {end} of {len(self.data)}")
        super()._build_tensors(start_offs, fields)


class _Truncated(Exception):
    def __init__(self, end: int):
        self.end = end


def _open(path: Path) -> GGUFReader:
    reader = _Reader.__new__(_Reader)  # bound first: a failed __init__ leaves the keys it read
    try:
        reader.__init__(path)
        return reader
    except _Truncated as e:
        keys = [k for k in getattr(reader, "fields", {}) if not k.startswith("GGUF.")]
        where = f"after metadata key {keys[-1]!r}" if keys else "in the header"
        raise ValueError(f"{path}: truncated {where}: needs byte {e.end}, the file has {path.stat().st_size}") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    except (KeyError, IndexError, OverflowError) as e:  # the gguf package's own refusals
        raise ValueError(f"{path}: not a readable GGUF file: {e!r}") from None


def _metadata(reader: GGUFReader) -> dict:
    """key -> value (str, number, bool, or a list of them), as gguf decodes it."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


@dataclasses.dataclass(frozen=True)
class GGUFModel:
    path: Path
    arch: str  # general.architecture
    metadata: dict
    cfg: ModelConfig
    config: dict  # config.json, without dtype and token ids (the import sets them)
    tensors: dict  # HF name -> the ReaderTensor holding it

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(int(n) for n in reversed(t.shape)) for name, t in self.tensors.items()}

    def array(self, name: str) -> np.ndarray:
        """The HF tensor `name` as float32 in HF layout, dequantised from the file."""
        t = self.tensors[name]
        x = dequantize(t.data, t.tensor_type)
        want = tuple(int(n) for n in reversed(t.shape))
        if x.shape != want:  # a quantised tensor whose rows do not hold whole blocks
            raise ValueError(f"{self.path}: tensor {t.name}: dequantised to {list(x.shape)}, header says {list(want)}")
        x = np.asarray(x, np.float32)
        if self.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = self.cfg.n_heads if name.endswith("q_proj.weight") else self.cfg.n_kv_heads
            x = unpermute_rows(x, heads)
        if self.arch == "gemma3" and t.name.endswith("norm.weight"):
            x = x - np.float32(1)
        return x


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """ggml's interleaved RoPE rows -> HF's rotate-half rows. Per head, llama.cpp wrote HF
    row (half r, index i) at position 2 i + r, i.e. viewed the head's rows as (2, d/2) and
    transposed them to (d/2, 2); this transposes them back."""
    rows = w.shape[0]
    x = w.reshape(heads, rows // heads // 2, 2, *w.shape[1:])
    return np.ascontiguousarray(x.swapaxes(1, 2).reshape(w.shape))


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half rows -> ggml's interleaved ones: what llama.cpp's converter does."""
    rows = w.shape[0]
    x = w.reshape(heads, 2, rows // heads // 2, *w.shape[1:])
    return np.ascontiguousarray(x.swapaxes(1, 2).reshape(w.shape))


def read_gguf(path: str | Path) -> GGUFModel:
    """The file's metadata, config and checked tensor directory; every refusal is here."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    reader = _open(path)
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch is None:
        raise ValueError(f"{path}: metadata key general.architecture: missing")
    if arch not in FAMILIES:
        raise ValueError(f"{path}: general.architecture: {arch!r} is not supported; supported: {', '.join(FAMILIES)}")
    by_name = {t.name: t for t in reader.tensors}
    hf = _hf_config(path, arch, meta, by_name)
    if arch == "llama" and _ROPE_FREQS in by_name:
        t = by_name.pop(_ROPE_FREQS)
        hf["rope_scaling"] = _llama3_scaling(path, dequantize(t.data, t.tensor_type), hf)
    cfg = config_from_hf(hf, source=f"{path} (config built from its metadata)")  # refuses what the model lacks
    config = hf_config_dict(cfg)
    return GGUFModel(path, arch, meta, cfg, config, _tensors(path, arch, cfg, by_name))


def _hf_config(path: Path, arch: str, meta: dict, tensors: dict) -> dict:
    """The HF config.json keys the metadata states, in transformers' names."""

    def key(name, default=None, required=True):
        value = meta.get(f"{arch}.{name}", default)
        if value is None and required:
            raise ValueError(f"{path}: metadata key {arch}.{name}: missing")
        return value

    heads = key("attention.head_count")
    d_model = key("embedding_length")
    kv = key("attention.head_count_kv", heads)
    if isinstance(kv, list):  # per layer in some files; one value is all a family here has
        if len(set(kv)) != 1:
            raise ValueError(f"{path}: metadata key {arch}.attention.head_count_kv: differs per layer {kv}")
        kv = kv[0]
    # llama.cpp's own default for a head's width: embedding_length / head_count.
    head_dim = key("attention.key_length", key("rope.dimension_count", d_model // heads))
    for name in ("attention.value_length", "rope.dimension_count"):
        if key(name, head_dim) != head_dim:
            raise ValueError(f"{path}: metadata key {arch}.{name}: {key(name)} differs from the head width {head_dim}")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size", len(tokens) if tokens is not None else None)
    eps = key("attention.layer_norm_rms_epsilon")
    family = FAMILIES[arch]
    d = {
        "model_type": family,
        "vocab_size": vocab,
        "hidden_size": d_model,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "max_position_embeddings": key("context_length"),
        # Stored as float32: its shortest float32 spelling is the checkpoint's (1e-05, not 9.99e-06).
        "rms_norm_eps": float(str(np.float32(eps))),
        "rope_theta": float(key("rope.freq_base", 1_000_000.0 if arch == "gemma3" else 10_000.0)),
        "rope_scaling": _rope_scaling(path, arch, meta),
        # llama.cpp writes output.weight only when it is not the embedding matrix.
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if arch == "gemma3":
        window = key("attention.sliding_window")
        pattern = key("attention.sliding_window_pattern", 6)  # llama.cpp's fixed Gemma 3 pattern when absent
        n = d["num_hidden_layers"]
        sliding = pattern if isinstance(pattern, list) else [(i + 1) % pattern != 0 for i in range(n)]
        d.update(
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=window,
            layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
            rope_local_base_freq=float(key("rope.freq_base_swa", 10_000.0)),
            # llama.cpp scales queries by 1/sqrt(hidden/heads) for the 62-layer 27B, else 1/sqrt(head_dim).
            query_pre_attn_scalar=d_model // heads if n == 62 else head_dim,
        )
    if arch == "qwen2" and head_dim * heads != d_model:
        raise ValueError(f"{path}: metadata key {arch}.attention.key_length: qwen2 needs hidden/heads ({head_dim})")
    return d


def _rope_scaling(path: Path, arch: str, meta: dict) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind != "linear":
        raise ValueError(f"{path}: metadata key {arch}.rope.scaling.type: {kind!r} is not supported (none, linear)")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if factor is None:
        raise ValueError(f"{path}: metadata key {arch}.rope.scaling.factor: missing (needed by linear scaling)")
    return {"rope_type": "linear", "factor": float(factor)}


def llama3_factors(base: float, head_dim: int, factor: float, low: float, high: float, original: int):
    """Each RoPE frequency's divisor under Llama 3's scaling: 1 at short wavelengths, `factor`
    at long ones, a smooth blend between (what llama.cpp stores as rope_freqs.weight)."""
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    smooth = np.clip((original * inv / (2 * math.pi) - low) / (high - low), 0.0, 1.0)
    return 1.0 / ((1 - smooth) / factor + smooth)


def _llama3_scaling(path: Path, freqs: np.ndarray, hf: dict) -> dict:
    """rope_freqs.weight holds the divisors, not the parameters HF's config wants. The factor
    is the largest divisor; the rest is accepted only as Meta's constants (low 1, high 4,
    8192 original positions: Llama 3.1-3.3), checked against every divisor."""
    where = f"{path}: tensor {_ROPE_FREQS}"
    if hf["rope_scaling"] is not None:
        raise ValueError(f"{where}: present with {hf['model_type']}.rope.scaling.type set; one RoPE scaling only")
    freqs = np.asarray(freqs, np.float64).reshape(-1)
    params = {"factor": float(np.float32(freqs.max())), "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    want = llama3_factors(hf["rope_theta"], hf["head_dim"], *params.values(), 8192)
    if freqs.shape != want.shape or not np.allclose(freqs, want, rtol=1e-5, atol=0):
        raise ValueError(f"{where}: RoPE factors that are not Llama 3's (low 1, high 4, 8192 positions)")
    return {"rope_type": "llama3", **params, "original_max_position_embeddings": 8192}


def _tensors(path: Path, arch: str, cfg: ModelConfig, by_name: dict) -> dict:
    """HF name -> ReaderTensor, every tensor accounted for and of the shape cfg implies."""
    want = _expected(cfg)
    table = _GEMMA_BLOCK if arch == "gemma3" else _BLOCK
    out = {}
    for name, t in by_name.items():
        hf = _hf_name(name, table, cfg.n_layers)
        if hf is None or hf not in want:
            raise ValueError(f"{path}: tensor {name}: not part of a {arch} model of this config")
        shape = tuple(int(n) for n in reversed(t.shape))
        if shape != want[hf]:
            raise ValueError(f"{path}: tensor {name}: shape {list(shape)}, the metadata implies {list(want[hf])}")
        if t.tensor_type not in QUANTS:
            known = ", ".join(q.name for q in sorted(QUANTS))
            raise ValueError(f"{path}: tensor {name}: type {t.tensor_type.name} is not supported; supported: {known}")
        out[hf] = t
    missing = [hf for hf in want if hf not in out]
    if missing:
        gguf_names = {v: k for k, v in _names(table, cfg.n_layers).items()}
        raise ValueError(f"{path}: tensor {gguf_names[missing[0]]}: missing (HF {missing[0]})")
    return {hf: out[hf] for hf in want}  # HF order: embeddings, layers, norm, head


def _names(table: dict, n_layers: int) -> dict[str, str]:
    out = {f"{g}.weight": f"{h}.weight" for g, h in _TOP.items()}
    for i in range(n_layers):
        for g, h in table.items():
            for suffix in ("weight", "bias"):
                out[f"blk.{i}.{g}.{suffix}"] = f"model.layers.{i}.{h}.{suffix}"
    return out


def _hf_name(name: str, table: dict, n_layers: int) -> str | None:
    top, _, suffix = name.rpartition(".")
    if top in _TOP and suffix == "weight":
        return f"{_TOP[top]}.weight"
    parts = top.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_layers:
        h = table.get(parts[2])
        return h and f"model.layers.{int(parts[1])}.{h}.{suffix}"
    return None


def _expected(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor of cfg's checkpoint, in HF's order."""
    d, hd, f = cfg.d_model, cfg.head_dim, cfg.mlp_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    out = {"model.embed_tokens.weight": (cfg.vocab_size, d)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (d,)
        out.update({p + f"self_attn.{n}_proj.weight": (r, d) for n, r in (("q", q), ("k", kv), ("v", kv))})
        if cfg.qkv_bias:
            out.update({p + f"self_attn.{n}_proj.bias": (r,) for n, r in (("q", q), ("k", kv), ("v", kv))})
        if cfg.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        out[p + "self_attn.o_proj.weight"] = (d, q)
        out.update({p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d)})
        out[p + "mlp.down_proj.weight"] = (d, f)
        if cfg.sandwich_norms:
            for n in ("pre_feedforward_layernorm", "post_attention_layernorm", "post_feedforward_layernorm"):
                out[p + f"{n}.weight"] = (d,)
        else:
            out[p + "post_attention_layernorm.weight"] = (d,)
    out["model.norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, d)
    return out
