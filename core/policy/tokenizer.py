"""Byte-level tokenizer: every UTF-8 byte is a token, plus a few specials.

No vocabulary file to download or keep in sync between rollout workers and learner.
"""

from __future__ import annotations

BOS = 256
EOS = 257
VOCAB_SIZE = 264  # 256 bytes + specials, rounded up to a multiple of 8


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Drops special ids; invalid UTF-8 (a model can emit any byte) becomes U+FFFD."""
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")
