"""Subcommands whose work is the next issue's (Hugging Face checkpoints in and out)."""

from __future__ import annotations

import sys

WHAT = {
    "generate": "sampling from a Hugging Face checkpoint",
    "export": "exporting a policy version as a Hugging Face checkpoint",
}


def main(name: str, argv: list[str]) -> int:
    print(
        f"agentic-rl {name}: {WHAT[name]} is not built yet; it comes with Hugging Face model families "
        "(issue 20). Nothing was run.",
        file=sys.stderr,
    )
    return 2
