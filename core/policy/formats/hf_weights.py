"""Hugging Face safetensors -> NNX params of the one model family.

`load_checkpoint(dir)` reads config.json (hf_config.py), builds the model's skeleton with no
arrays (abstract_model), and fills every parameter from model.safetensors, or from the
shards listed in model.safetensors.index.json, through the family's key map (hf_keys.py).
Every tensor is used or refused by name, before any is read: a missing, extra or
mis-shaped tensor is a ValueError naming the file and the key. Params come out float32 or
bfloat16 on the default device, as init would place them; the learner's sharding code
places them on a mesh by their logical axes.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open

from core import heap
from core.policy.formats.hf_config import hf_family, read_hf_config
from core.policy.formats.hf_keys import Slot, slots
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import Transformer, abstract_model

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
_FLOATS = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _dtype(dtype) -> jnp.dtype:
    name = jnp.dtype(dtype).name
    if name not in DTYPES:
        raise ValueError(f"params load as float32 or bfloat16, not {name}")
    return DTYPES[name]


def tensor_files(checkpoint: Path) -> tuple[dict[str, Path], Path]:
    """(HF key -> the file that holds it, the file that lists the keys), for a single file
    or an index of shards; refuses an index that disagrees with its shards (a key missing
    from its shard, or a shard key the index does not list)."""
    index, single = checkpoint / INDEX, checkpoint / SINGLE
    if not index.is_file():
        if not single.is_file():
            raise ValueError(f"{checkpoint}: neither {SINGLE} nor {INDEX} is there")
        return dict.fromkeys(_keys(single), single), single
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index}: weight_map: unreadable ({e!r})") from None
    where = {key: checkpoint / name for key, name in weight_map.items()}
    for shard in sorted(set(where.values())):
        if not shard.is_file():
            key = next(k for k, f in where.items() if f == shard)
            raise ValueError(f"{index}: {key}: its shard {shard.name} does not exist")
        held = set(_keys(shard))
        for key in sorted(held - {k for k, f in where.items() if f == shard}):
            raise ValueError(f"{shard}: {key}: extra tensor, not listed for this shard in {INDEX}")
        for key in sorted(k for k, f in where.items() if f == shard and k not in held):
            raise ValueError(f"{shard}: {key}: missing (listed in {INDEX})")
    return where, index


def _keys(path: Path) -> list[str]:
    with safe_open(path, framework="numpy") as f:
        return list(f.keys())


class _Reader:
    """Reads tensors from one safetensors file. bfloat16, which NumPy's safetensors reader
    cannot hold, is read raw from the header's byte offsets as ml_dtypes.bfloat16."""

    def __init__(self, path: Path, stack: contextlib.ExitStack):
        self.path = path
        self._file = stack.enter_context(safe_open(path, framework="numpy"))
        self._header = None

    def spec(self, key: str) -> tuple[str, tuple[int, ...]]:
        s = self._file.get_slice(key)
        return s.get_dtype(), tuple(s.get_shape())

    def read(self, key: str) -> np.ndarray:
        kind, shape = self.spec(key)
        if kind != "BF16":
            return self._file.get_tensor(key)
        if self._header is None:
            with open(self.path, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                self._header = (8 + n, json.loads(fh.read(n)))
        start, header = self._header
        begin, end = header[key]["data_offsets"]
        with open(self.path, "rb") as fh:
            fh.seek(start + begin)
            return np.frombuffer(fh.read(end - begin), ml_dtypes.bfloat16).reshape(shape)


def load_checkpoint(checkpoint: str | Path, dtype=jnp.float32) -> tuple[ModelConfig, Transformer]:
    """(ModelConfig, Transformer) of an HF checkpoint directory, params in `dtype`."""
    checkpoint = Path(checkpoint)
    dtype = _dtype(dtype)
    cfg = read_hf_config(checkpoint)
    model = abstract_model(cfg)
    graphdef, state = nnx.split(model)
    params = {path: var.get_value() for path, var in nnx.to_flat_state(state)}
    files, listing = tensor_files(checkpoint)
    table = slots(cfg, params)
    with contextlib.ExitStack() as stack:
        readers = {f: _Reader(f, stack) for f in sorted(set(files.values()))}
        _check(table, params, files, listing, readers, cfg)
        if cfg.tie_embeddings and "lm_head.weight" in files:
            _check_tied(files, readers)
        values = _assemble(table, params, files, readers, dtype)
    nnx.replace_by_pure_dict(state, nest(values))
    del values
    heap.release()  # the NumPy copies of every tensor are gone: give their memory back
    return cfg, nnx.merge(graphdef, state)


def _check(table: list[Slot], params: dict, files: dict, listing: Path, readers: dict, cfg: ModelConfig) -> None:
    """Refuses, before reading any data, every tensor that is missing, extra, mis-shaped
    or not a float."""
    expected = {s.hf_key for s in table}
    tied_head = {"lm_head.weight"} if cfg.tie_embeddings else set()  # some tied checkpoints keep a copy
    for key in sorted(set(files) - expected - tied_head):
        raise ValueError(f"{files[key]}: {key}: extra tensor, not part of this {hf_family(cfg)} model")
    for s in table:
        if s.hf_key not in files:
            raise ValueError(f"{listing}: {s.hf_key}: missing tensor")
        kind, shape = readers[files[s.hf_key]].spec(s.hf_key)
        want = s.hf_shape(params[s.path].shape)
        if shape != want:
            raise ValueError(f"{files[s.hf_key]}: {s.hf_key}: shape {list(shape)}, config.json implies {list(want)}")
        if kind not in _FLOATS:
            raise ValueError(f"{files[s.hf_key]}: {s.hf_key}: dtype {kind} is not supported (floats only)")


def _assemble(table: list[Slot], params: dict, files: dict, readers: dict, dtype) -> dict:
    """Our param arrays: each HF tensor transposed where a kernel, fused parts joined."""
    parts: dict[tuple, list] = {}
    for s in table:
        x = readers[files[s.hf_key]].read(s.hf_key).astype(np.float32)
        parts.setdefault(s.path, [None] * s.parts)[s.part] = x.T if s.transpose else x
    out = {}
    for path, pieces in parts.items():
        x = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=-1)
        assert x.shape == params[path].shape, (path, x.shape)  # _check guarantees it
        out[path] = jnp.asarray(x, dtype)
    return out


def _check_tied(files: dict, readers: dict) -> None:
    head = readers[files["lm_head.weight"]].read("lm_head.weight")
    embed = readers[files["model.embed_tokens.weight"]].read("model.embed_tokens.weight")
    if head.shape != embed.shape or not np.array_equal(head, embed):
        raise ValueError(
            f"{files['lm_head.weight']}: lm_head.weight: differs from model.embed_tokens.weight "
            "while config.json says tie_word_embeddings"
        )


def nest(flat: dict) -> dict:
    """{(k1, k2, ...): v} -> {k1: {k2: ... v}}."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out
