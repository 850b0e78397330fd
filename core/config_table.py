"""A config tree as a Markdown table of its flags (docs/CONFIG.md, agentic_rl/config_doc.py)."""

from __future__ import annotations

import dataclasses

from core.config import leaves
from core.config_checks import _COMPARE
from core.config_text import format_value, type_name


def markdown_table(cls, title: str, command: str) -> str:
    """One section of docs/CONFIG.md: every flag of `cls`, its type, default and doc."""
    lines = [f"## {title}", "", f"`{command}`", "", "| flag | type | default | what it sets |", "|---|---|---|---|"]
    for leaf in leaves(cls):
        tname = type_name(leaf.type)
        if leaf.choices:
            tname = " \\| ".join(map(str, leaf.choices))
        tname += "".join(f", {_COMPARE[op][1]} {bound}" for op, bound in leaf.bounds)
        default = "required" if leaf.default is dataclasses.MISSING else f"`{format_value(leaf.default)}`"
        if leaf.default is None or leaf.default in ((), {}, ""):
            default = "unset" if leaf.default is None else "empty"
        lines.append(f"| `--{leaf.flag}` | {tname} | {default} | {leaf.help.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
