"""A GGUF file's tokenizer.ggml.* metadata -> tokenizer.json and tokenizer_config.json.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary, merges, token types and
a pre-tokenizer name, and its own tokenizer code gives them meaning. This rebuilds that
meaning as an HF `tokenizers` pipeline (what core/policy/text/hf_tokenizer.py then loads):
  - "gpt2" (byte-level BPE: Llama 3, SmolLM, Qwen): BPE over the byte alphabet, split the way
    llama.cpp splits for the `tokenizer.ggml.pre` name (PRE_TOKENIZERS; any other refused).
  - "llama" (SentencePiece BPE: Gemma, Llama 2): spaces as "▁", byte fallback, merges
    rebuilt from the vocabulary (a GGUF keeps scores, not merges) best-first: by score, or
    for Gemma by position in the file, whose scores do not follow its merge order.
Token type 3 (control) becomes a special added token, 4 (user-defined) a plain added one:
llama.cpp matches both whole in the text. bos/eos/pad/unk come from their ids; the eos ids
of generation are eos, eot and eom, in that order.
"""

from __future__ import annotations

import dataclasses
import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
# Both end like GPT-4's: letters with one leading non-letter, punctuation runs with their
# newlines, whitespace; they differ in digits (Llama 3: up to three, Qwen2: one at a time).
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_HEAD = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
_LLAMA3 = _HEAD + r"|\p{N}{1,3}" + _TAIL
_QWEN2 = _HEAD + r"|\p{N}" + _TAIL
# tokenizer.ggml.pre -> how llama.cpp splits text before BPE: GPT-2's regex (ByteLevel's own),
# GPT-2's after isolating every digit (StarCoder's vocabulary, which SmolLM reuses), or a
# split regex. "default" is what llama.cpp names a vocabulary it did not recognise; it is
# read as GPT-2's regex, as transformers reads it.
PRE_TOKENIZERS = {
    "gpt-2": "gpt2",
    "default": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "dbrx": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
}
# llama.cpp keeps a pre-token that is itself in the vocabulary whole, skipping merges, for
# these (as Llama 3's own tokenizer.json does with ignore_merges).
_IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3"}
_GEMMA = {"gemma", "gemma2", "gemma3"}  # architectures whose SentencePiece merges follow file order


@dataclasses.dataclass(frozen=True)
class GGUFTokenizer:
    tokenizer: Tokenizer
    config: dict  # tokenizer_config.json
    bos_id: int | None
    eos_ids: tuple[int, ...]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves,
    the others take the code points from 256 up, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in out:
            out[b], extra = chr(256 + extra), extra + 1
    return out


def build_tokenizer(meta: dict, source: str, max_length: int | None = None) -> GGUFTokenizer:
    """The tokenizer the metadata describes; ValueError naming the key for what it cannot be."""

    def need(key):
        if meta.get(key) is None:
            raise ValueError(f"{source}: metadata key {key}: missing")
        return meta[key]

    kind, tokens = need("tokenizer.ggml.model"), list(need("tokenizer.ggml.tokens"))
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(types) != len(tokens):
        raise ValueError(f"{source}: metadata key tokenizer.ggml.token_type: {len(types)} types, {len(tokens)} tokens")
    arch = meta.get("general.architecture")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if kind == "gpt2":
        if pre not in PRE_TOKENIZERS:
            known = ", ".join(PRE_TOKENIZERS)
            raise ValueError(f"{source}: metadata key tokenizer.ggml.pre: {pre!r} is not supported; supported: {known}")
        tok = _byte_level(tokens, types, list(need("tokenizer.ggml.merges")), pre, source)
        add_bos_default = pre in _IGNORE_MERGES  # llama.cpp adds a bos for Llama 3 unless told not to
    elif kind == "llama":
        scores = None if arch in _GEMMA else list(need("tokenizer.ggml.scores"))
        # llama.cpp prepends a space to SentencePiece text unless told not to; Gemma's files
        # always say not to, and Gemma's tokenizer never does.
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", arch not in _GEMMA))
        tok = _sentencepiece(tokens, types, scores, prefix, _token(meta, tokens, "unknown", source), source)
        add_bos_default = True
    else:
        raise ValueError(
            f"{source}: metadata key tokenizer.ggml.model: {kind!r} is not supported; supported: gpt2, llama"
        )
    _add_tokens(tok, tokens, types)

    names = {"bos_token": "bos", "eos_token": "eos", "pad_token": "padding", "unk_token": "unknown"}
    named = {name: _token(meta, tokens, key, source) for name, key in names.items()}
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    tok.post_processor = _post_processor(kind, add_bos and named["bos_token"], add_eos and named["eos_token"], tok)
    for name, text in named.items():  # a named token is one piece whatever its type says
        if text is not None and tok.token_to_id(text) is None:
            raise ValueError(f"{source}: metadata key tokenizer.ggml.{names[name]}_token_id: {text!r} is not a token")
    eos_ids = []
    for key in ("eos", "eot", "eom"):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and _token(meta, tokens, key, source) is not None and i not in eos_ids:
            eos_ids.append(int(i))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as is (a family's class may rebuild it)
        **named,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip}
            | {"single_word": t.single_word, "special": t.special}
            for i, t in sorted(tok.get_added_tokens_decoder().items())
        },
    }
    if max_length:
        config["model_max_length"] = int(max_length)
    templates = _chat_templates(meta)
    if templates is not None:
        config["chat_template"] = templates
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return GGUFTokenizer(tok, config, None if bos is None else int(bos), tuple(eos_ids))


def _token(meta: dict, tokens: list, key: str, source: str) -> str | None:
    i = meta.get(f"tokenizer.ggml.{key}_token_id")
    if i is None:
        return None
    if not 0 <= int(i) < len(tokens):
        raise ValueError(f"{source}: metadata key tokenizer.ggml.{key}_token_id: {i} is outside the vocabulary")
    return tokens[int(i)]


def _byte_level(tokens: list, types: list, merges: list, pre: str, source: str) -> Tokenizer:
    spell = bytes_to_unicode()
    alphabet = set(spell.values())
    vocab = {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        # Vocabulary tokens are spelled in the byte alphabet; one that is not (a llama.cpp
        # quirk) is respelled, as transformers does. Added tokens keep their text: they are
        # matched in the raw text, and tokenizers needs their text at their id.
        if kind not in (CONTROL, USER_DEFINED) and not set(text) <= alphabet:
            text = "".join(spell[b] for b in text.encode("utf-8"))
        vocab[text] = i
    pairs = []
    for n, merge in enumerate(merges):
        cut = merge.find(" ", 1)  # llama.cpp's split: the first space after the first character
        if cut < 0:
            raise ValueError(f"{source}: metadata key tokenizer.ggml.merges[{n}]: {merge!r} is not 'left right'")
        pairs.append((merge[:cut], merge[cut + 1 :]))
    try:
        model = models.BPE(vocab, pairs, fuse_unk=False, ignore_merges=pre in _IGNORE_MERGES)
    except Exception as e:  # the Rust side raises plain Exception
        raise ValueError(f"{source}: metadata key tokenizer.ggml.merges: {e}") from None
    tok = Tokenizer(model)
    split = PRE_TOKENIZERS[pre]
    if split == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(tokens: list, types: list, scores: list | None, prefix: bool, unk, source: str) -> Tokenizer:
    if scores is None:
        # Gemma stores a run of spaces as spaces; its pieces spell them "▁". Its merges
        # follow the file's order, so a token's position is its score.
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    elif len(scores) != len(tokens):
        raise ValueError(f"{source}: metadata key tokenizer.ggml.scores: {len(scores)} scores, {len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = spm_merges(vocab, dict(zip(tokens, scores)))
    model = models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    tok = Tokenizer(model)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        steps.append(decoders.Strip(content=" ", left=1))
    else:  # Gemma: no prefix space; every space becomes "▁" before the merges
        tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(steps)
    return tok


def spm_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges of a SentencePiece vocabulary: every split of a token into two tokens, the
    token with the higher score first; a token's splits with the longer left piece first."""
    found = []
    for token, score in scores.items():
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        found += [(left, right, score) for left, right in local]
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _add_tokens(tok: Tokenizer, tokens: list, types: list) -> None:
    vocab = tok.get_vocab(with_added_tokens=False)
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    tok.add_special_tokens([t for t in control if t.content in vocab])
    tok.add_tokens([t for t in user if t.content in vocab])


def _post_processor(kind: str, bos: str | None, eos: str | None, tok: Tokenizer):
    """What add_special_tokens=True adds: the bos/eos the metadata asks for."""
    single = " ".join(x for x in (bos and f"{bos}:0", "$A:0", eos and f"{eos}:0") if x)
    pair = single + " " + " ".join(x for x in (bos and f"{bos}:1", "$B:1", eos and f"{eos}:1") if x)
    special = [(t, tok.token_to_id(t)) for t in dict.fromkeys(x for x in (bos, eos) if x)]
    template = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
    if kind == "gpt2":  # offsets as a byte-level tokenizer.json reports them
        return processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    return template


def _chat_templates(meta: dict):
    """tokenizer.chat_template, and named ones (tokenizer.chat_template.NAME) as HF's list."""
    prefix = "tokenizer.chat_template."
    named = {k.removeprefix(prefix): v for k, v in meta.items() if k.startswith(prefix) and isinstance(v, str)}
    default = meta.get("tokenizer.chat_template")
    if not named:
        return default
    listed = [{"name": "default", "template": default}] if default is not None else []
    return listed + [{"name": k, "template": v} for k, v in sorted(named.items())]


def tokenizer_json(tok: Tokenizer) -> str:
    """tokenizer.json text, pretty-printed as `save_pretrained` writes it."""
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n"
