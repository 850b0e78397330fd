"""NNX params + ModelConfig + tokenizer -> one llama.cpp GGUF file (llama.cpp, Ollama, LM Studio).

`export_gguf(out, cfg, params, tokenizer, gguf_type)` is the inverse of core/policy/formats/gguf_reader.py,
and uses its tables, so what is written is what the import reads back:
  - architecture: the HF family of cfg (hf_config.hf_family) as llama.cpp names it: llama
    (the built-in policy, SmolLM2, Llama 3.x), qwen2, qwen3. gemma3 is refused (its
    SentencePiece tokenizer's scores and norm layout are not written here).
  - metadata: llama.cpp's keys for the sizes, eps, RoPE base and scaling (linear as
    rope.scaling.*; Llama 3's as the rope_freqs.weight tensor of divisors, as llama.cpp's
    converter writes it), general.file_type.
  - tensors: llama.cpp's names (gguf_reader's table inverted), [out, in] as HF. llama's Q
    and K rows are permuted per head to ggml's interleaved RoPE layout (gguf_reader's
    permute_rows, what llama.cpp's converter does); qwen2/qwen3 are stored as in HF.
    1-D tensors (norms, biases, rope_freqs) stay F32, as llama.cpp keeps them; the 2-D
    weights are F32, F16 or Q8_0 (gguf.quants' bit-exact port of ggml's quantiser). A row
    that is not whole Q8_0 blocks (32) falls back to F16, as llama.cpp's converter does.
    Q4_K and the other K-quants are refused: gguf.quants (0.19) dequantises them only.
  - tokenizer: a byte-level BPE tokenizer.json as tokenizer.ggml.* (model "gpt2", tokens in
    id order, merges, token types: special added tokens CONTROL, other added tokens
    USER_DEFINED, ids the tokenizer lacks "[PAD<id>]" UNUSED, as llama.cpp pads), the
    tokenizer.ggml.pre name of its pre-tokenizer (gguf_tokenizer.PRE_TOKENIZERS), bos/eos/
    pad/unk ids, add_bos/add_eos (what its post-processor adds), the extra eos ids of
    generation as eot/eom, the chat template(s). The built-in byte tokenizer is written as
    a byte-level BPE over its 256 bytes (ids 0-255) whose one merge (0xC0 0xC0, never in
    UTF-8) fills a spare id: llama.cpp needs merges, and this one never fires.
Before a byte of weights is written, the tokenizer metadata is rebuilt as the import
rebuilds it (gguf_tokenizer.build_tokenizer) and must encode a probe corpus as the policy's
tokenizer does; after, the file is read back (gguf_reader.read_gguf) and its config must
be the policy's. The file is written to a hidden sibling and renamed into place: a kill
midway leaves no `out`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
from pathlib import Path

import gguf
import numpy as np

from core.policy.formats import gguf_reader
from core.policy.formats.gguf_export_tokenizer import add_tokenizer, check_tokenizer, tokenizer_metadata
from core.policy.formats.hf_config import hf_family
from core.policy.formats.hf_export import checked_params
from core.policy.formats.hf_keys import slots
from core.policy.model.config import ModelConfig
from core.policy.text.tokenizer import Tokenizer

Q = gguf.GGMLQuantizationType
# --gguf_type -> (ggml type of the 2-D weights, general.file_type)
TYPES = {
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}
# Types llama.cpp has that are refused, and why.
_NOT_WRITTEN = {
    "q4_k": "the gguf package's gguf.quants can dequantise K-quants but not write them",
    "q4_k_m": "the gguf package's gguf.quants can dequantise K-quants but not write them",
    "q5_k": "the gguf package's gguf.quants can dequantise K-quants but not write them",
    "q6_k": "the gguf package's gguf.quants can dequantise K-quants but not write them",
}
ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # HF model_type -> general.architecture
F16_MAX = float(np.finfo(np.float16).max)


@dataclasses.dataclass(frozen=True)
class GGUFExport:
    path: Path
    arch: str
    gguf_type: str
    tensor_types: dict[str, str]  # GGUF tensor name -> ggml type name, as written
    f16_fallback: tuple[str, ...]  # tensors asked as Q8_0 whose rows are not whole blocks
    dropped_eos_ids: tuple[int, ...]  # eos ids beyond GGUF's eos/eot/eom slots


def check_type(gguf_type: str) -> tuple:
    """(ggml type, file type) of `gguf_type`; ValueError naming what is supported."""
    key = gguf_type.lower()
    if key in TYPES:
        return TYPES[key]
    supported = ", ".join(TYPES)
    why = _NOT_WRITTEN.get(key)
    if why is not None:
        raise ValueError(
            f"gguf_type {gguf_type!r} is not supported: {why}; supported: {supported} "
            "(llama.cpp's llama-quantize turns an f16 export into Q4_K_M)"
        )
    raise ValueError(f"gguf_type {gguf_type!r} is not supported; supported: {supported}")


def check_arch(cfg: ModelConfig) -> str:
    """general.architecture of cfg's family; ValueError for a family or feature no GGUF
    file of the supported architectures states."""
    family = hf_family(cfg)  # refuses configs no HF family represents
    if family not in ARCHS:
        raise ValueError(
            f"architecture {family}: GGUF export is not supported; supported: {', '.join(ARCHS)} "
            "(export --format hf, then llama.cpp's convert_hf_to_gguf.py)"
        )
    if cfg.layer_types:
        raise ValueError(f"{family} with sliding-window layers: llama.cpp's {ARCHS[family]} has no sliding window")
    rope = cfg.rope
    if rope.kind == "llama3":
        if family != "llama":
            raise ValueError(f"{family}: llama3 RoPE scaling is written as rope_freqs.weight, which only llama reads")
        meta = (rope.low_freq_factor, rope.high_freq_factor, rope.original_max_position)
        if meta != (1.0, 4.0, 8192):
            raise ValueError(
                f"llama3 RoPE scaling with low/high frequency factors {meta[0]}/{meta[1]} and "
                f"{meta[2]} original positions: a GGUF file stores only the divisors, which read back as "
                "Meta's constants (1, 4, 8192) only"
            )
    return ARCHS[family]


def export_gguf(
    out: str | Path,
    cfg: ModelConfig,
    params,
    tokenizer: Tokenizer,
    gguf_type: str = "f16",
    name: str = "agentic-rl policy",
    overwrite: bool = False,
) -> GGUFExport:
    """Writes the GGUF file `out` (an existing one only with `overwrite`) and returns what
    was written. Refusals (ValueError) come before a byte is written, but for a weight
    beyond float16's range and the read-back check, which remove the partial file."""
    out = Path(out)
    qtype, file_type = check_type(gguf_type)
    arch = check_arch(cfg)
    if out.exists() and (out.is_dir() or not overwrite):
        what = "is a directory" if out.is_dir() else "exists; remove it (--overwrite replaces it)"
        raise ValueError(f"{out}: {what}")
    flat = _checked_params(cfg, params)
    tok_meta, dropped = tokenizer_metadata(tokenizer, cfg.vocab_size)
    tok_meta["general.architecture"] = arch
    check_tokenizer(tok_meta, tokenizer)
    plan = _plan(cfg, arch, flat, qtype)

    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.exporting-*"):  # left by a writer that was killed
        stale.unlink(missing_ok=True)
    tmp = out.parent / f".{out.name}.exporting-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _write(tmp, cfg, arch, file_type, name, tok_meta, plan)
        back = gguf_reader.read_gguf(tmp)  # the import's own reading of the file
        if back.cfg != cfg:
            raise ValueError(f"the written file reads back as config {back.cfg}, not the policy's {cfg}")
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    types = {t.name: t.qtype.name for t in plan}
    fallback = tuple(t.name for t in plan if qtype == Q.Q8_0 and t.ndim == 2 and t.qtype != Q.Q8_0)
    return GGUFExport(out, arch, gguf_type.lower(), types, fallback, dropped)


# -- weights -------------------------------------------------------------------------------


def _checked_params(cfg: ModelConfig, params) -> dict[tuple, np.ndarray]:
    """path -> array, every path and shape the model of cfg has (hf_export's check), each a float."""
    flat, want = checked_params(cfg, params)
    for path in want:
        if not np.issubdtype(flat[path].dtype, np.floating) and flat[path].dtype.name != "bfloat16":
            raise ValueError(f"parameter {_dotted(path)} has dtype {flat[path].dtype}, not a float")
    return {path: flat[path] for path in want}


def _dotted(path: tuple) -> str:
    return ".".join(map(str, path))


@dataclasses.dataclass
class _Tensor:
    name: str  # GGUF name
    shape: tuple[int, ...]  # HF layout ([out, in])
    qtype: object  # ggml type written
    make: object  # () -> float32 array, HF layout, llama.cpp's row order

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape)) // block * size

    def data(self) -> np.ndarray:
        x = self.make()
        if self.qtype == Q.F32:
            return np.ascontiguousarray(x, np.float32)
        if self.qtype == Q.F16:
            peak = float(np.max(np.abs(x))) if x.size else 0.0
            if not np.isfinite(peak) or peak > F16_MAX:
                raise ValueError(f"tensor {self.name}: values up to {peak} do not fit float16; export f32")
            return np.ascontiguousarray(x.astype(np.float16))
        return gguf.quants.quantize(np.ascontiguousarray(x, np.float32), self.qtype)


def _plan(cfg: ModelConfig, arch: str, flat: dict, qtype) -> list[_Tensor]:
    """Every tensor of the file in llama.cpp's order, with its type; made one at a time."""
    hf_to_gguf = {h: g for g, h in gguf_reader._names(gguf_reader._BLOCK, cfg.n_layers).items()}
    by_hf = {}
    for s in slots(cfg, flat):
        by_hf[s.hf_key] = (s, s.hf_shape(flat[s.path].shape))
    order = list(gguf_reader._expected(cfg))  # HF order: embeddings, layers, norm, head
    if set(order) != set(by_hf):
        raise AssertionError(f"hf_keys and gguf_reader disagree: {sorted(set(order) ^ set(by_hf))}")

    def maker(slot, heads):
        def make():
            x = np.split(np.asarray(flat[slot.path], np.float32), slot.parts, axis=-1)[slot.part]
            x = x.T if slot.transpose else x
            return gguf_reader.permute_rows(x, heads) if heads else x

        return make

    plan = []
    if cfg.rope.kind == "llama3":
        r = cfg.rope
        divisors = gguf_reader.llama3_factors(
            r.base, cfg.head_dim, r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position
        )
        plan.append(_Tensor(gguf_reader._ROPE_FREQS, divisors.shape, Q.F32, lambda: divisors.astype(np.float32)))
    for hf in order:
        slot, shape = by_hf[hf]
        heads = None
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.n_heads if hf.endswith("q_proj.weight") else cfg.n_kv_heads
        kind = Q.F32 if len(shape) == 1 else qtype
        if kind == Q.Q8_0 and shape[-1] % gguf.GGML_QUANT_SIZES[Q.Q8_0][0]:
            kind = Q.F16  # llama.cpp's converter: a row that is not whole blocks stays F16
        plan.append(_Tensor(hf_to_gguf[hf], shape, kind, maker(slot, heads)))
    first = [t for t in plan if t.name == "token_embd.weight"]
    return first + [t for t in plan if t.name != "token_embd.weight"]


def _write(path: Path, cfg: ModelConfig, arch: str, file_type, name: str, tok_meta: dict, plan) -> None:
    """Header, metadata and tensor directory first, then one tensor at a time."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_file_type(int(file_type))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.mlp_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope.base)
    if arch == "llama":
        w.add_rope_dimension_count(cfg.head_dim)
    if arch == "qwen3" or cfg.head_dim * cfg.n_heads != cfg.d_model:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if cfg.rope.kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope.factor)
    add_tokenizer(w, tok_meta)
    for t in plan:
        dtype = {Q.F32: np.float32, Q.F16: np.float16}.get(t.qtype, np.float32)
        raw = None if t.qtype in (Q.F32, Q.F16) else t.qtype
        w.add_tensor_info(t.name, t.shape, np.dtype(dtype), t.nbytes(), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in plan:
        w.write_tensor_data(t.data())
    w.close()
