"""A Hugging Face checkpoint's tokenizer: `tokenizer.json` run by HF `tokenizers`, with
the special tokens, eos ids and chat template the checkpoint's other files declare.

What is read, and from where (the same files `transformers` 5 reads, without importing it):
  - `tokenizer.json`: the tokenizer itself, as is (`tokenizers.Tokenizer.from_file`).
  - `tokenizer_config.json`: bos/eos/pad/unk/... tokens (a string or {"content": ...}),
    `added_tokens_decoder`, `split_special_tokens`, and `chat_template` (a string, or a
    list of {"name", "template"}). Not `add_bos_token`/`add_eos_token`: transformers 5
    drops them when there is a tokenizer.json, whose post-processor decides alone what
    `add_special_tokens=True` adds.
  - `chat_template.jinja` (+ `additional_chat_templates/*.jinja`): where transformers 5
    writes the template; when present they replace the config's, as in transformers.
  - `generation_config.json`: `eos_token_id` (an int or a list): a model may stop on
    several ids (Llama 3: <|end_of_text|>, <|eom_id|>, <|eot_id|>); they are merged after
    the tokenizer's own eos token.
Everything the checkpoint names must exist: a special token missing from the vocabulary
is refused (transformers would silently add it, growing the vocabulary past the model's
embedding), naming the file and the key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer

from core.policy.text.tokenizer import TEMPLATE_TOKEN_NAMES, Tokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
GENERATION_FILE = "generation_config.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATES_DIR = "additional_chat_templates"
_TOKEN_FLAGS = ("special", "lstrip", "rstrip", "single_word", "normalized")


class HFTokenizer(Tokenizer):
    """The tokenizer of the checkpoint directory `path`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"tokenizer at {self.path}"
        self._tok = _load_tokenizer_json(self.path / TOKENIZER_FILE)
        config = _read_json(self.path / CONFIG_FILE, required=False)
        generation = _read_json(self.path / GENERATION_FILE, required=False)
        self._apply_added_tokens(config)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1

        # Named special tokens (what templates see as `bos_token`, `eos_token`, ...).
        self.template_tokens = {}
        ids = {}
        for key in TEMPLATE_TOKEN_NAMES:
            text = _token_text(config.get(key), self.path / CONFIG_FILE, key)
            if text is None:
                continue
            ids[key] = self._require_id(text, CONFIG_FILE, key)
            self.template_tokens[key] = text
        self.bos_id = ids.get("bos_token")
        self.eos_ids = self._eos_ids(ids.get("eos_token"), generation)
        pad = generation.get("pad_token_id")
        self.pad_id = ids.get("pad_token", pad if _is_id(pad) else None)
        self.special_tokens = self._special_tokens(config, ids)
        self.chat_templates = _chat_templates(self.path, config)

        if config.get("split_special_tokens"):
            self._tok.encode_special_tokens = True  # special tokens' text is encoded as text
        # Ids must not depend on truncation/padding a tokenizer.json may carry.
        self._tok.no_truncation()
        self._tok.no_padding()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # No `clean_up_tokenization_spaces`: transformers 5 ignores it for BPE tokenizers,
        # and every supported family is BPE.
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def files(self) -> tuple[Path, ...]:
        names = (TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE, "special_tokens_map.json")
        found = [self.path / n for n in names if (self.path / n).is_file()]
        return tuple(found + sorted((self.path / TEMPLATES_DIR).glob("*.jinja")))

    # -- loading -----------------------------------------------------------------------

    def _require_id(self, text: str, file: str, key: str) -> int:
        token_id = self._tok.token_to_id(text)
        if token_id is None:
            raise ValueError(f"{self.path / file}: {key} {text!r} is not in {TOKENIZER_FILE}'s vocabulary")
        return token_id

    def _apply_added_tokens(self, config: dict) -> None:
        """`added_tokens_decoder` may restate tokenizer.json's added tokens with other flags
        (transformers re-adds them); its ids must be the ones tokenizer.json gives."""
        decoder = config.get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):
            raise ValueError(f"{self.path / CONFIG_FILE}: added_tokens_decoder must be an object of id -> token")
        existing = self._tok.get_added_tokens_decoder()
        changed = []
        for raw_id, spec in decoder.items():
            key = f"added_tokens_decoder[{raw_id}]"
            content = _token_text(spec, self.path / CONFIG_FILE, key)
            if content is None or not str(raw_id).isdigit():
                raise ValueError(f"{self.path / CONFIG_FILE}: {key} must have an integer id and a 'content'")
            token_id = self._require_id(content, CONFIG_FILE, key)
            if token_id != int(raw_id):
                raise ValueError(
                    f"{self.path / CONFIG_FILE}: {key} {content!r} has id {token_id} in {TOKENIZER_FILE}, not {raw_id}"
                )
            old = existing.get(token_id)
            flags = {f: bool(spec[f]) for f in _TOKEN_FLAGS if f in spec}
            if old is not None and all(getattr(old, f) == v for f, v in flags.items()):
                continue
            base = {f: getattr(old, f) for f in _TOKEN_FLAGS} if old is not None else {}
            changed.append(AddedToken(content, **{**base, **flags}))
        if changed:
            self._tok.add_tokens(changed)
            # Re-adding updates the flags but not the set decode() skips; a reload rebuilds both.
            self._tok = RustTokenizer.from_str(self._tok.to_str())

    def _eos_ids(self, eos_id: int | None, generation: dict) -> tuple[int, ...]:
        raw = generation.get("eos_token_id")
        listed = [raw] if raw is None or _is_id(raw) else raw
        if not isinstance(listed, list) or not all(i is None or _is_id(i) for i in listed):
            raise ValueError(
                f"{self.path / GENERATION_FILE}: eos_token_id must be an int or a list of ints, got {raw!r}"
            )
        merged: list[int] = [eos_id] if eos_id is not None else []
        for i in listed:
            if i is None:
                continue
            if not 0 <= i < self.vocab_size:
                where = self.path / GENERATION_FILE
                raise ValueError(f"{where}: eos_token_id {i} is outside the vocabulary (size {self.vocab_size})")
            if i not in merged:
                merged.append(i)
        if not merged:
            raise ValueError(
                f"{self.path}: no eos token: {CONFIG_FILE} has no eos_token and {GENERATION_FILE} no eos_token_id"
            )
        return tuple(merged)

    def _special_tokens(self, config: dict, named_ids: dict[str, int]) -> dict[str, int]:
        special = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        for key, token_id in named_ids.items():
            special[self.template_tokens[key]] = token_id
        for key in ("additional_special_tokens", "extra_special_tokens"):
            extra = config.get(key) or []
            values = list(extra.values()) if isinstance(extra, dict) else extra
            if not isinstance(values, list):
                raise ValueError(f"{self.path / CONFIG_FILE}: {key} must be a list of tokens")
            for n, value in enumerate(values):
                text = _token_text(value, self.path / CONFIG_FILE, f"{key}[{n}]")
                special[text] = self._require_id(text, CONFIG_FILE, f"{key}[{n}]")
        return special


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_json(path: Path, required: bool) -> dict:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path}: missing")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _load_tokenizer_json(path: Path) -> RustTokenizer:
    _read_json(path, required=True)  # a clear error for a missing or broken file first
    try:
        return RustTokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises plain Exception
        raise ValueError(f"{path}: not a tokenizer HF tokenizers can load: {err}") from None


def _token_text(value: Any, file: Path, key: str) -> str | None:
    """A token given as "text" or as {"content": "text", ...} (an AddedToken)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{file}: {key} must be a string or {{'content': ...}}, got {value!r}")


def _chat_templates(path: Path, config: dict) -> dict[str, str]:
    """Named templates. Files (transformers 5's layout) replace the config's, as in
    transformers; a list in the config keeps every name ("default", "tool_use", ...)."""
    files = {}
    if (path / TEMPLATE_FILE).is_file():
        files["default"] = (path / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (path / TEMPLATES_DIR).is_dir():
        for file in sorted((path / TEMPLATES_DIR).glob("*.jinja")):
            files[file.stem] = file.read_text(encoding="utf-8")
    if files:
        return files
    raw = config.get("chat_template")
    if raw is None:
        return {}
    if isinstance(raw, str):
        return {"default": raw}
    where = f"{path / CONFIG_FILE}: chat_template"
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a string or a list of {{'name', 'template'}}, got {type(raw).__name__}")
    named = {}
    for n, item in enumerate(raw):
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)):
            raise ValueError(f"{where}[{n}] must be {{'name': str, 'template': str}}")
        named[item["name"]] = item["template"]
    return named
