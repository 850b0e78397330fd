"""A GGUF file -> a Hugging Face checkpoint directory the project's loaders take (`--model DIR`).

Writes config.json (gguf_reader: the metadata as hf_config.py writes a config), the weights
dequantised to float32 or bfloat16 (model.safetensors; shards of about SHARD_BYTES with
model.safetensors.index.json when larger), tokenizer.json and tokenizer_config.json
(gguf_tokenizer), and generation_config.json with the eos ids. Everything is refused or
built before the first byte is written, and the files go to a temporary directory next to
DIR that is renamed to DIR at the end: an import killed midway leaves no DIR, only a
`.DIR.importing-*` directory beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from core.policy.formats.gguf_reader import GGUFModel, read_gguf
from core.policy.text.gguf_tokenizer import build_tokenizer, tokenizer_json
from core.staged_dir import refuse_non_empty, staged_dir

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
SHARD_BYTES = 4 << 30
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def import_gguf(gguf_file: str | Path, out: str | Path, dtype: str = "float32", overwrite: bool = False) -> Path:
    """Writes the checkpoint directory `out` from `gguf_file` and returns it. An existing
    `out` is refused unless `overwrite`, then replaced whole once the new one is written."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out)
    refuse_non_empty(out, overwrite, "import-gguf --overwrite")
    model = read_gguf(gguf_file)
    tok = build_tokenizer(model.metadata, str(model.path), max_length=model.cfg.max_seq_len)
    if tok.tokenizer.get_vocab_size(with_added_tokens=True) > model.cfg.vocab_size:
        raise ValueError(
            f"{model.path}: tokenizer.ggml.tokens: {tok.tokenizer.get_vocab_size(with_added_tokens=True)} tokens, "
            f"more than the embedding's {model.cfg.vocab_size} rows"
        )
    eos = list(tok.eos_ids)
    eos_id = None if not eos else eos[0] if len(eos) == 1 else eos
    config = {**model.config, "bos_token_id": tok.bos_id, "eos_token_id": eos_id, "torch_dtype": dtype, "dtype": dtype}
    generation = {k: v for k, v in (("bos_token_id", tok.bos_id), ("eos_token_id", eos_id)) if v is not None}

    with staged_dir(out, "importing") as tmp:
        _write_weights(tmp, model, DTYPES[dtype])
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", generation)
        (tmp / "tokenizer.json").write_text(tokenizer_json(tok.tokenizer), encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", tok.config)
    return out


def is_complete(out: str | Path) -> bool:
    """Whether `out` holds a whole import (the rename makes a partial one impossible, but a
    directory of the same name may come from elsewhere)."""
    out = Path(out)
    weights = (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file()
    return weights and all((out / f).is_file() for f in FILES)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_weights(tmp: Path, model: GGUFModel, dtype) -> None:
    """One tensor dequantised at a time, one shard held at a time."""
    itemsize = np.dtype(dtype).itemsize
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in model.shapes().items():
        n = int(np.prod(shape)) * itemsize
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    files = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for file, names in zip(files, shards):
        tensors = {name: model.array(name).astype(dtype) for name in names}
        save_file(tensors, tmp / file, metadata={"format": "pt"})
        del tensors
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp / file, 0o666 & ~mask)  # safetensors writes 0600; the other files are the umask's
    if len(files) > 1:
        total = sum(int(np.prod(s)) * itemsize for s in model.shapes().values())
        weight_map = {name: file for file, names in zip(files, shards) for name in names}
        _write_json(tmp / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
