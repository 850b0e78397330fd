"""The tokenizer half of a GGUF export (core/policy/formats/gguf_export.py): a byte-level BPE
tokenizer.json, or the built-in byte tokenizer, as llama.cpp's tokenizer.ggml.* metadata,
and the check that the import rebuilds it into a tokenizer that encodes as the policy's."""

from __future__ import annotations

import json

import gguf

from core.policy.text.gguf_tokenizer import CONTROL, PRE_TOKENIZERS, USER_DEFINED, build_tokenizer, bytes_to_unicode
from core.policy.text.tokenizer import ByteTokenizer, Tokenizer

UNUSED = int(gguf.TokenType.UNUSED)
NORMAL = int(gguf.TokenType.NORMAL)
# What the tokenizer check encodes: words, digits in runs, code, whitespace runs, contractions,
# non-Latin scripts, emoji (all NFC: llama.cpp does not normalise).
PROBES = (
    "Hello, world! What is 37 * 41? The answer is 1517.",
    "  12345 hello\n\nworld\t\ttabs   and  spaces  ",
    "def f(x):\n    return x**2  # square\n\n\nprint(f(12))",
    '{"name": "calc", "arguments": {"expression": "12*7"}}',
    "don't I'LL we've THEY'RE it's",
    "Größe naïve café 数学很有趣。 Привет, мир! ½ ² ٣",
    "emoji 🤖🎉 ok; price: $1,234.56 (≈ €1.1k)",
    "a1b2c3 1 22 333 4444 55555 666666",
    " leading",
    "trailing  ",
    "\n\n\n",
)


def tokenizer_metadata(tok: Tokenizer, vocab_size: int) -> tuple[dict, tuple[int, ...]]:
    """(tokenizer.ggml.* as a dict, eos ids no GGUF slot holds) for `tok` under an
    embedding of `vocab_size` rows."""
    if isinstance(tok, ByteTokenizer):
        meta = _byte_tokenizer(tok, vocab_size)
        return meta, ()
    # hf_tokenizer.HFTokenizer's tokenizers.Tokenizer, with tokenizer_config.json's flags applied
    inner = getattr(tok, "_tok", None)
    if inner is None:
        raise ValueError(f"{tok.name}: only a checkpoint's tokenizer.json or the byte tokenizer can be exported")
    where = f"{tok.name}: tokenizer.json"
    spec = json.loads(inner.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"{where}: model {model.get('type')!r}: only BPE tokenizers have a GGUF form here")
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ValueError(f"{where}: SentencePiece-style BPE (byte_fallback, affixes) is not supported, byte-level only")
    pre = _pre_name(spec, where)
    vocab = inner.get_vocab(with_added_tokens=True)
    if max(vocab.values()) >= vocab_size:
        raise ValueError(f"{where}: id {max(vocab.values())} is outside the embedding's {vocab_size} rows")
    added = inner.get_added_tokens_decoder()
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [UNUSED] * vocab_size
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = NORMAL
    for i, t in added.items():
        tokens[i], types[i] = t.content, CONTROL if t.special else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    if not merges:
        raise ValueError(f"{where}: no merges (llama.cpp needs at least one)")
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    dropped = _special_ids(meta, tok, inner)
    _templates(meta, tok)
    return meta, dropped


def _pre_name(spec: dict, where: str) -> str:
    """The tokenizer.ggml.pre name whose split (gguf_tokenizer.PRE_TOKENIZERS) is the
    tokenizer.json's pre-tokenizer, or ValueError naming it."""
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":  # NFC: Qwen's; llama.cpp skips it
        raise ValueError(f"{where}: normalizer {normalizer.get('type')!r} has no llama.cpp form")
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]

    def byte_level(s, regex):
        use_regex = bool(s.get("use_regex", True))
        return s.get("type") == "ByteLevel" and not s.get("add_prefix_space") and use_regex == regex

    if len(steps) == 1 and byte_level(steps[0], True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and byte_level(steps[1], True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and byte_level(steps[1], False):
        split = steps[0]
        pattern = (split.get("pattern") or {}).get("Regex")
        if split.get("behavior") == "Isolated" and not split.get("invert"):
            names = {v: k for k, v in PRE_TOKENIZERS.items() if k in ("llama-bpe", "qwen2")}
            if pattern in names:
                return names[pattern]
    raise ValueError(
        f"{where}: pre_tokenizer {json.dumps(pre)[:200]} is none llama.cpp names here "
        "(GPT-2's, SmolLM's digits + GPT-2, Llama 3's or Qwen2's regex)"
    )


def _special_ids(meta: dict, tok: Tokenizer, inner) -> tuple[int, ...]:
    """bos/eos/pad/unk ids, add_bos/add_eos, and the other eos ids of generation as eot and
    eom (the import's eos ids are eos, eot, eom); returns the ids no slot holds."""
    if tok.bos_id is not None:
        meta["tokenizer.ggml.bos_token_id"] = int(tok.bos_id)
    eos = list(tok.eos_ids)
    if eos:
        meta["tokenizer.ggml.eos_token_id"] = int(eos[0])
    slots_free = {"eot": None, "eom": None}
    dropped = []
    for i in eos[1:]:
        text = tok.id_to_token(i) if hasattr(tok, "id_to_token") else None
        order = ("eom", "eot") if text and "eom" in text else ("eot", "eom")
        slot = next((s for s in order if slots_free[s] is None), None)
        if slot is None:
            dropped.append(int(i))
        else:
            slots_free[slot] = int(i)
    for slot, i in slots_free.items():
        if i is not None:
            meta[f"tokenizer.ggml.{slot}_token_id"] = i
    if tok.pad_id is not None:
        meta["tokenizer.ggml.padding_token_id"] = int(tok.pad_id)
    unk = tok.template_tokens.get("unk_token")
    if unk is not None:
        meta["tokenizer.ggml.unknown_token_id"] = int(tok.token_to_id(unk))
    plain = inner.encode("a", add_special_tokens=False).ids
    full = inner.encode("a", add_special_tokens=True).ids
    cut = next((n for n in range(len(full) - len(plain) + 1) if full[n : n + len(plain)] == plain), None)
    prefix, suffix = (full[:cut], full[cut + len(plain) :]) if cut is not None else (full, [])
    if cut is None or prefix not in ([], [tok.bos_id]) or suffix not in ([], eos[:1]):
        raise ValueError(
            f"{tok.name}: its post-processor adds {full} around {plain}: GGUF states only a bos before and an eos after"
        )
    meta["tokenizer.ggml.add_bos_token"] = bool(prefix)
    meta["tokenizer.ggml.add_eos_token"] = bool(suffix)
    return tuple(dropped)


def _templates(meta: dict, tok: Tokenizer) -> None:
    for name, template in tok.chat_templates.items():
        meta["tokenizer.chat_template" if name == "default" else f"tokenizer.chat_template.{name}"] = template


def _byte_tokenizer(tok: ByteTokenizer, vocab_size: int) -> dict:
    """Byte-level BPE over the 256 bytes at their own ids, the specials as CONTROL, and one
    merge that never fires (0xC0 never occurs in UTF-8) on a spare id: llama.cpp needs merges."""
    spell = bytes_to_unicode()
    tokens = [spell[b] for b in range(256)] + [f"[PAD{i}]" for i in range(256, vocab_size)]
    types = [NORMAL] * 256 + [UNUSED] * (vocab_size - 256)
    for text, i in tok.special_tokens.items():
        tokens[i], types[i] = text, CONTROL
    taken = set(tok.special_tokens.values())
    spare = next((i for i in range(vocab_size - 1, 255, -1) if i not in taken), None)
    if spare is None:
        raise ValueError(f"the byte tokenizer in an embedding of {vocab_size} rows leaves no spare id for its merge")
    never = spell[0xC0] * 2
    tokens[spare] = never  # UNUSED: decodes to nothing, as the byte tokenizer decodes the id
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [f"{spell[0xC0]} {spell[0xC0]}"],
        "tokenizer.ggml.bos_token_id": tok.bos_id,
        "tokenizer.ggml.eos_token_id": tok.eos_ids[0],
        "tokenizer.ggml.padding_token_id": tok.pad_id,
        "tokenizer.ggml.add_bos_token": True,  # what encode(add_special_tokens=True) adds
        "tokenizer.ggml.add_eos_token": False,
    }


def check_tokenizer(meta: dict, tok: Tokenizer) -> None:
    """The metadata, rebuilt as the import rebuilds it, must encode PROBES (and, for a
    checkpoint's tokenizer, its special tokens amid text) as `tok` does."""
    back = build_tokenizer(meta, "the exported tokenizer metadata").tokenizer
    texts = list(PROBES)
    if not isinstance(tok, ByteTokenizer):  # the byte tokenizer reads no special token out of text
        texts += [f"{s}hi {s}\nthere{s}" for s in tok.special_tokens]
    for text, special in [(t, False) for t in texts] + [(PROBES[0], True)]:
        got, want = back.encode(text, add_special_tokens=special).ids, tok.encode(text, add_special_tokens=special)
        if got != want:
            raise ValueError(
                f"{tok.name}: as GGUF metadata (tokenizer.ggml.pre {meta['tokenizer.ggml.pre']!r}) it encodes "
                f"{text!r} as {got}, the policy's tokenizer as {want}"
            )


def add_tokenizer(w: gguf.GGUFWriter, meta: dict) -> None:
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
