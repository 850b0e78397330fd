"""Tiny GGUF files written here, as llama.cpp's converter would write them, for the import tests.

`write(path, family, ...)` makes a random model of the family (d_model 64, 2 layers, 4 query
and 2 key/value heads of 16, MLP 256) with its tokenizer (the family's tiny BPE from
localstack/fixtures/tiny_tokenizers.py, as tokenizer.ggml.* metadata) and chat template,
and returns what the import must give back: every weight in HF layout, as float32.

Weights are stored in a mix of the supported types. The quantised ones are made in HF row
order (gguf.quants.quantize where it can; random blocks with sane scales for Q4_K and Q6_K,
which it cannot write) and the expected HF weight is their dequantisation; then, as
llama.cpp does, llama's Q and K rows are permuted per head to ggml's interleaved RoPE layout
(whole rows move, so the blocks move with them) and Gemma's norms get 1 added. The keyword
arguments bend one thing at a time for the refusal tests.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

from core.policy.formats.gguf_reader import permute_rows
from localstack.fixtures.tiny_tokenizers import build

Q = gguf.GGMLQuantizationType
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3")
TOKENIZERS = {"llama": "llama3", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}
HF_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
D, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF = 64, 2, 4, 2, 16, 256
# GGUF tensor (in layer 0 / 1 where it differs) -> type. ffn_down's rows are FF = 256 long:
# the K-quants' 256-value blocks fit there only.
PLAN = {
    "token_embd": Q.Q8_0,
    "output": Q.F16,
    "attn_q": Q.Q4_0,
    "attn_k": Q.Q4_1,
    "attn_v": Q.Q8_0,
    "attn_output": Q.BF16,
    "ffn_gate": Q.Q4_0,
    "ffn_up": Q.Q8_0,
    "ffn_down": (Q.Q4_K, Q.Q6_K),
}
KQUANT_SCALES = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}  # byte offsets of each block's f16 scale(s)


@dataclasses.dataclass
class Tiny:
    path: Path
    weights: dict[str, np.ndarray]  # HF name -> float32, what the import must give
    template: str
    tokens: list[str]


def tokenizer_metadata(family: str) -> tuple[dict, str, list[str]]:
    """tokenizer.ggml.* of the family's tiny tokenizer, as llama.cpp writes them (for
    "gemma3", SentencePiece-style: scores as Llama 2's, 0 for control and byte tokens and
    minus the rank for the others; Gemma's own are read by position)."""
    tok, *_, template = build(TOKENIZERS[family])
    model = json.loads(tok.to_str())["model"]
    n = tok.get_vocab_size(with_added_tokens=True)
    tokens, types = [""] * n, [1] * n
    for text, i in model["vocab"].items():
        tokens[i] = text
        if family == "gemma3" and text.startswith("<0x") and len(text) == 6:
            types[i] = 6  # BYTE
    for i, added in tok.get_added_tokens_decoder().items():
        tokens[i], types[i] = added.content, 3 if added.special else 4
    ids = {t: i for i, t in enumerate(tokens)}
    meta = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.chat_template": template}
    if family == "gemma3":
        meta.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default"})
        scores = [0.0 if k in (3, 6) else -float(i) for i, k in enumerate(types)]
        meta.update({"tokenizer.ggml.scores": scores, "tokenizer.ggml.add_space_prefix": False})
        named = {"bos": "<bos>", "eos": "<eos>", "eot": "<end_of_turn>", "padding": "<pad>", "unknown": "<unk>"}
        meta["tokenizer.ggml.add_bos_token"] = True
    else:
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        meta.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": merges})
        if family == "llama":
            meta["tokenizer.ggml.pre"] = "llama-bpe"
            named = {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "eom": "<|eom_id|>"}
            meta["tokenizer.ggml.add_bos_token"] = True
        else:
            meta["tokenizer.ggml.pre"] = "qwen2"
            named = {"bos": "<|endoftext|>", "eos": "<|im_end|>", "padding": "<|endoftext|>"}
            meta["tokenizer.ggml.add_bos_token"] = False
    meta.update({f"tokenizer.ggml.{k}_token_id": ids[t] for k, t in named.items()})
    return meta, template, tokens


def _gguf_names(family: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF name -> (HF name, HF shape) of the family's tensors."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    out = {}
    for i in range(LAYERS):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        layer = {
            "attn_norm": ("input_layernorm", (D,)),
            "attn_q": ("self_attn.q_proj", (q, D)),
            "attn_k": ("self_attn.k_proj", (kv, D)),
            "attn_v": ("self_attn.v_proj", (kv, D)),
            "attn_output": ("self_attn.o_proj", (D, q)),
            "ffn_gate": ("mlp.gate_proj", (FF, D)),
            "ffn_up": ("mlp.up_proj", (FF, D)),
            "ffn_down": ("mlp.down_proj", (D, FF)),
        }
        if family == "gemma3":
            layer["ffn_norm"] = ("pre_feedforward_layernorm", (D,))
            layer["post_attention_norm"] = ("post_attention_layernorm", (D,))
            layer["post_ffw_norm"] = ("post_feedforward_layernorm", (D,))
        else:
            layer["ffn_norm"] = ("post_attention_layernorm", (D,))
        if family in ("qwen3", "gemma3"):
            layer["attn_q_norm"] = ("self_attn.q_norm", (HEAD_DIM,))
            layer["attn_k_norm"] = ("self_attn.k_norm", (HEAD_DIM,))
        out.update({f"{b}{g}.weight": (f"{h}{n}.weight", s) for g, (n, s) in layer.items()})
        if family == "qwen2":
            for g, n, r in (("attn_q", "q_proj", q), ("attn_k", "k_proj", kv), ("attn_v", "v_proj", kv)):
                out[f"{b}{g}.bias"] = (f"{h}self_attn.{n}.bias", (r,))
    return out


def _raw(kind, x: np.ndarray, rng) -> np.ndarray:
    """x stored as `kind`, in HF row order: float arrays for F32/F16, else the block bytes."""
    if kind == Q.F32:
        return x
    if kind == Q.F16:
        return x.astype(np.float16)
    if kind in KQUANT_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[kind]
        raw = rng.integers(0, 256, (x.shape[0], x.shape[1] // block, size), dtype=np.uint8)
        for at in KQUANT_SCALES[kind]:  # random bytes are valid blocks once the scales are sane
            scale = rng.uniform(0.002, 0.02, raw.shape[:2]).astype(np.float16)
            raw[..., at : at + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
        return raw.reshape(x.shape[0], -1)
    return quantize(x, kind)


def write(
    path: Path,
    family: str = "llama",
    *,
    seed: int = 0,
    arch: str | None = None,
    meta: dict | None = None,
    drop_meta: tuple[str, ...] = (),
    drop_tensors: tuple[str, ...] = (),
    extra_tensors: dict | None = None,
    types: dict | None = None,
    tied: bool | None = None,
    tokenizer: str | None = None,
) -> Tiny:
    rng = np.random.default_rng(seed)
    arch = arch or family
    tok_meta, template, tokens = tokenizer_metadata(tokenizer or family)
    vocab = len(tokens)
    tied = family in ("qwen2", "gemma3") if tied is None else tied
    names = {"token_embd.weight": ("model.embed_tokens.weight", (vocab, D))}
    names.update(_gguf_names(family))
    names["output_norm.weight"] = ("model.norm.weight", (D,))
    if not tied:
        names["output.weight"] = ("lm_head.weight", (vocab, D))
    plan = {**PLAN, **(types or {})}

    w = gguf.GGUFWriter(str(path), arch)
    kv = {
        "general.name": f"tiny {family}",
        f"{arch}.context_length": 512,
        f"{arch}.embedding_length": D,
        f"{arch}.block_count": LAYERS,
        f"{arch}.feed_forward_length": FF,
        f"{arch}.attention.head_count": HEADS,
        f"{arch}.attention.head_count_kv": KV_HEADS,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": 10000.0 if family == "gemma3" else 500000.0,
        f"{arch}.vocab_size": vocab,
        **tok_meta,
    }
    if family == "llama":
        kv[f"{arch}.rope.dimension_count"] = HEAD_DIM
    if family in ("qwen3", "gemma3"):
        kv.update({f"{arch}.attention.key_length": HEAD_DIM, f"{arch}.attention.value_length": HEAD_DIM})
    if family == "gemma3":
        kv[f"{arch}.attention.sliding_window"] = 128
    kv.update(meta or {})
    for key, value in kv.items():
        if key in drop_meta:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)

    expected = {}
    for name, (hf, shape) in names.items():
        if name in drop_tensors:
            continue
        norm = len(shape) == 1 and not name.endswith(".bias")
        x = (1 + 0.1 * rng.standard_normal(shape) if norm else 0.2 * rng.standard_normal(shape)).astype(np.float32)
        kind = Q.F32 if len(shape) == 1 else plan[name.split(".")[-2]]
        if isinstance(kind, tuple):
            kind = kind[int(name.split(".")[1])]
        if family == "gemma3" and norm:
            x = x - np.float32(1)  # Gemma's HF norm weight is around 0 ...
            stored = x + np.float32(1)  # ... and llama.cpp stores it plus 1
            expected[hf] = stored - np.float32(1)
            w.add_tensor(name, stored)
            continue
        raw = _raw(kind, x, rng)
        expected[hf] = np.asarray(dequantize(raw, kind), np.float32).reshape(shape)
        if family == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            raw = permute_rows(raw, HEADS if "attn_q" in name else KV_HEADS)
        w.add_tensor(name, raw, raw_dtype=None if kind in (Q.F32, Q.F16) else kind)
    for name, array in (extra_tensors or {}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Tiny(Path(path), expected, template, tokens)
