"""Where a policy comes from: a Hugging Face checkpoint directory, or a version in a policy
store (`store:PATH[@VERSION]`). Either way the result is the same three things: the model
config, the model with its weights, and the tokenizer.

A store version names its model config and tokenizer in its metadata (`policy_metadata`):
`model_config` (ModelConfig.to_dict) and `tokenizer` ("byte", or the checkpoint directory
whose tokenizer files it was trained with).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig, check_vocab
from core.policy.model.transformer import Transformer, abstract_model, split_params
from core.policy.text.tokenizer import Tokenizer, load_tokenizer

STORE_PREFIX = "store:"
BYTE = "byte"


@dataclasses.dataclass
class Policy:
    cfg: ModelConfig
    model: Transformer
    tokenizer: Tokenizer
    source: str
    version: int | None = None  # the store version; None for a checkpoint directory
    tokenizer_source: str = BYTE  # "byte" or the directory holding the tokenizer files


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """What a process needs before any weights: the model config, the tokenizer, and where
    both came from (the checkpoint directory, or None for the built-in policy)."""

    cfg: ModelConfig
    tokenizer: Tokenizer
    checkpoint: str | None = None

    @property
    def tokenizer_source(self) -> str:
        return self.checkpoint or BYTE


def policy_spec(model: str | os.PathLike | None, model_config: str = "tiny") -> PolicySpec:
    """`--model DIR` (its config.json and tokenizer, checked against each other) or the
    built-in `--model_config` size with the byte tokenizer. Reads no weights."""
    if not model:
        from core.policy.model.config import model_config as named_config

        return PolicySpec(named_config(model_config), load_tokenizer(BYTE))
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {os.fspath(model)!r}: not a checkpoint directory")
    cfg, tok = _checked_pair(path)
    if not tok.chat_templates:
        raise ValueError(f"--model {path}: its tokenizer has no chat template, so episodes cannot be rendered")
    return PolicySpec(cfg, tok, os.fspath(path))


def _checked_pair(path: Path) -> tuple[ModelConfig, Tokenizer]:
    """A checkpoint's config.json and tokenizer, refused by file when their vocabularies disagree."""
    from core.policy.formats.hf_config import read_hf_config

    tok, cfg = load_tokenizer(path), read_hf_config(path)
    try:
        check_vocab(cfg, tok.vocab_size)
    except ValueError as e:
        raise ValueError(f"{path / 'tokenizer.json'} against {path / 'config.json'} (vocab_size): {e}") from None
    return cfg, tok


def policy_metadata(cfg: ModelConfig, tokenizer_source: str | os.PathLike = BYTE, **extra) -> dict:
    """What a published version carries so that any reader can rebuild its model and tokenizer."""
    return {"model_config": cfg.to_dict(), "tokenizer": os.fspath(tokenizer_source), **extra}


def parse_store_spec(spec: str) -> tuple[str, int | None]:
    """`store:PATH[@VERSION]` -> (PATH, VERSION or None for LATEST)."""
    body = spec[len(STORE_PREFIX) :]
    path, at, version = body.rpartition("@")
    if not at:
        return body, None
    if not version.isdigit():
        raise ValueError(f"{spec!r}: the version after '@' must be a non-negative integer")
    return path, int(version)


def load_policy(spec: str | os.PathLike, dtype=jnp.float32) -> Policy:
    """A checkpoint directory or `store:PATH[@VERSION]`; refuses, naming the file, what it cannot load."""
    spec = os.fspath(spec)
    if spec.startswith(STORE_PREFIX):
        return _from_store(*parse_store_spec(spec))
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {spec!r}: not a checkpoint directory (nor store:PATH[@VERSION])")
    from core.policy.formats.hf_weights import load_checkpoint  # safetensors only for a checkpoint

    _, tok = _checked_pair(path)  # before any weight is read
    cfg, model = load_checkpoint(path, dtype=dtype)
    return Policy(cfg, model, tok, spec, None, os.fspath(path))


def _from_store(root: str, version: int | None) -> Policy:
    store = PolicyStore(root)
    if version is None:
        version = store.latest_version()
        if version is None:
            raise FileNotFoundError(f"policy store {root!r} has no published version")
    meta = store.read_metadata(version).get("metadata", {})
    if "model_config" not in meta:
        raise ValueError(f"policy store {root!r} version {version}: its metadata names no model_config")
    cfg = ModelConfig.from_dict(meta["model_config"])
    tokenizer_source = meta.get("tokenizer", BYTE)
    tok = load_tokenizer(tokenizer_source)
    check_vocab(cfg, tok.vocab_size)
    from core.policy.versions import VersionLoader, base_params

    graphdef, template = split_params(abstract_model(cfg))  # shapes only: the store has the weights
    # A LoRA version holds the adapter only: it is merged into its base, the checkpoint
    # its tokenizer came from.
    base = base_params(tokenizer_source if tokenizer_source != BYTE else None)
    state, _ = VersionLoader(store, cfg, template, base).load(version)
    return Policy(cfg, nnx.merge(graphdef, state), tok, f"{STORE_PREFIX}{root}@{version}", version, tokenizer_source)
