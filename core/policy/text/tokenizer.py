"""The tokenizer protocol, and the byte-level tokenizer as one implementation of it.

A policy's tokenizer is either the built-in byte tokenizer (every UTF-8 byte is a token,
plus a few specials: no vocabulary file to keep in sync between rollout workers and the
learner) or a Hugging Face checkpoint's (`core.policy.text.hf_tokenizer`). Code that holds a
`Tokenizer` never needs to know which: `load_tokenizer` picks one.

The module-level `encode`, `decode`, `BOS`, `EOS`, `VOCAB_SIZE` are the byte tokenizer's,
kept for the code written before the protocol.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BOS = 256
EOS = 257
PAD = 258
VOCAB_SIZE = 264  # 256 bytes + specials, rounded up to a multiple of 8

# The named special tokens HF passes to every chat template (its `special_tokens_map`).
TEMPLATE_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer(abc.ABC):
    """What every tokenizer offers: text <-> ids, its special ids, and its chat template.

    Attributes a subclass sets:
      name: what error messages call it (the checkpoint directory, or "byte tokenizer").
      vocab_size: one past the largest id it can produce.
      bos_id: the id a sequence starts with, or None when the model has none (Qwen).
      eos_ids: every id that ends a generation (a model may stop on several), first the
        tokenizer's own eos token.
      pad_id: the padding id, or None.
      special_tokens: every special token's text -> id.
      template_tokens: the named special tokens a chat template sees (`bos_token`, ...).
      chat_templates: named chat templates; "default" is the one used unless tools are
        given and a "tool_use" template exists (HF's choice).
    """

    name: str
    vocab_size: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    pad_id: int | None
    special_tokens: Mapping[str, int]
    template_tokens: Mapping[str, str]
    chat_templates: Mapping[str, str]

    @abc.abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of `text`; `add_special_tokens` adds what the tokenizer adds around a
        sequence (e.g. a BOS). Chat-rendered text is encoded without them: the template
        writes its own."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; `skip_special_tokens` drops the tokens marked special. Never
        raises on ids a model emitted (invalid UTF-8 -> U+FFFD)."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of one token's text, or None when it is not in the vocabulary."""

    def files(self) -> tuple[Path, ...]:
        """The checkpoint files that define this tokenizer, for an export to copy to the
        same places in its directory; none for the byte tokenizer. generation_config.json
        is not among them: it is the model's, and an export writes its own."""
        return ()

    @property
    def chat_template(self) -> str | None:
        """The default chat template, or None when the tokenizer has none."""
        return self.chat_templates.get("default")

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **template_vars: Any,
    ) -> str:
        """The conversation as text, rendered as `transformers`' `apply_chat_template(...,
        tokenize=False)` renders it. `tools` is HF's format: [{"type": "function",
        "function": {"name", "description", "parameters"}}]; `template_vars` reach the
        template as variables (e.g. `enable_thinking=False`) and override special tokens."""
        from core.policy.text import chat_template  # jinja2 only when a chat is rendered

        template = self._select_template(tools)
        variables = {**self.template_tokens, **template_vars}
        return chat_template.render(
            template, messages, tools=tools, add_generation_prompt=add_generation_prompt, variables=variables
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **template_vars: Any,
    ) -> list[int]:
        """The ids of `render_chat(...)`: `apply_chat_template(..., tokenize=True)`."""
        text = self.render_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt, **template_vars)
        return self.encode(text, add_special_tokens=False)

    def _select_template(self, tools) -> str:
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if "default" in self.chat_templates:
            return self.chat_templates["default"]
        if self.chat_templates:
            raise ValueError(f"{self.name}: has chat templates {sorted(self.chat_templates)} but none named 'default'")
        raise ValueError(f"{self.name} has no chat template: it cannot render chat messages")


class ByteTokenizer(Tokenizer):
    """Every UTF-8 byte is its own id (0-255); BOS, EOS and PAD above them. Unlike a
    checkpoint's tokenizer it never reads special tokens out of text: "<eos>" is 5 bytes."""

    name = "byte tokenizer"
    vocab_size = VOCAB_SIZE
    bos_id = BOS
    eos_ids = (EOS,)
    pad_id = PAD
    special_tokens = {"<bos>": BOS, "<eos>": EOS, "<pad>": PAD}
    template_tokens = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    chat_templates: Mapping[str, str] = {}  # none: a chat needs a checkpoint's template

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:  # the bytes around a dropped special join up, as they always have
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        names = {v: k for k, v in self.special_tokens.items()}
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
            elif i in names:
                out += [run.decode("utf-8", errors="replace"), names[i]]
                run.clear()
        return "".join(out) + run.decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        if token in self.special_tokens:
            return self.special_tokens[token]
        raw = token.encode("utf-8")
        return raw[0] if len(raw) == 1 else None


BYTE_TOKENIZER = ByteTokenizer()


def encode(text: str) -> list[int]:
    return BYTE_TOKENIZER.encode(text)


def decode(ids) -> str:
    """Drops special ids; invalid UTF-8 (a model can emit any byte) becomes U+FFFD."""
    return BYTE_TOKENIZER.decode(ids)


def load_tokenizer(source: str | Path | None) -> Tokenizer:
    """None or "byte": the byte tokenizer; a directory: its Hugging Face tokenizer."""
    if source is None or str(source) == "byte":
        return BYTE_TOKENIZER
    path = Path(source)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer {str(source)!r}: not 'byte' and not a checkpoint directory")
    from core.policy.text.hf_tokenizer import HFTokenizer  # `tokenizers` only for a checkpoint

    return HFTokenizer(path)
