"""Every setting a user can pass that a process refuses at start-up, in one table.

The rows live by role in tests/test_config_refusals_{learner,rollout,launch}.py, checked
there by tests/_refusals.py. This file holds what concerns the table as a whole: its rows
are distinct, and it is docs/CONFIG_REFUSALS.md: `python -m tests.test_config_refusals --write`
rewrites the doc, and `test_doc_matches_table` fails while the two differ.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

from tests._refusals import LEARNER, PROCESSES, ROLLOUT, Row, names

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFIG_REFUSALS.md"
ROLES = ("learner", "rollout", "launch")


def _table() -> list[Row]:
    """Every role's rows, in the doc's order of processes (a role's own order within one)."""
    rows = [r for role in ROLES for r in importlib.import_module(f"tests.test_config_refusals_{role}").TABLE]
    return sorted(rows, key=lambda r: PROCESSES.index(r.process))


TABLE = _table()


def test_rows_are_distinct():
    keys = [(r.process, r.argv, r.unset) for r in TABLE]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]


def test_names_matches_whole_words():
    assert names("slots must be a positive int", "slots")
    assert not names("engine_slots must be a positive int", "slots")
    assert names("the following arguments are required: --out", "--out")
    assert not names("bucket sequence lengths must be positive ints", "buckets")


# ---------------------------------------------------------------------------- the doc

HEADER = """\
# Settings refused at start-up

Generated from the tables in `tests/test_config_refusals_*.py`, which pass each setting the
way a user would and check the refusal (one file a role): edit a table, then run
`python -m tests.test_config_refusals --write` (a test fails while this file and the tables
differ). Argument types (`--rows=abc`) are argparse's own checks and are not listed.
The `environments.make` rows are keys of `--env_config` (learner, evaluator): they are
checked where an environment is made, in every rollout worker and in the evaluator.

Marks: **†** the message does not name the flag or field yet; **‡** refused with another
exception than ValueError / SystemExit; **§** refused only after something has started
(the note says what).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    lines = [
        HEADER,
        "| process | flag / field | refused when | why (the deadlock or nonsense it prevents) | message starts with |",
        "|---|---|---|---|---|",
    ]
    for r in TABLE:
        marks = "".join(m for m, on in (("†", r.not_named), ("‡", r.wrong_type), ("§", r.late)) if on)
        when = r.when + (f" (§ refused only {r.late})" if r.late else "")
        message = f"`{r.starts}`" + (f" {marks}" if marks else "")
        cells = [f"`{r.process}`", f"`{r.flag}`", when, r.why, message]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def test_doc_matches_table():
    assert DOC.read_text() == render(), "docs/CONFIG_REFUSALS.md is stale: python -m tests.test_config_refusals --write"


def test_the_readme_table_lists_only_refusals_this_table_checks():
    """The short table of docs/OPERATING.md ("Settings refused at start") must not promise a
    refusal that is not a row here (rollout flags are marked "rollout", the rest are the learner's)."""
    operating = (Path(__file__).resolve().parents[1] / "docs" / "OPERATING.md").read_text()
    section = operating.split("## Settings refused at start", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `") or line.startswith("| rollout")]
    assert len(rows) >= 10
    for line in rows:
        cell = line.split("|")[1]
        process = ROLLOUT if cell.strip().startswith("rollout") else LEARNER
        for flag in re.findall(r"`(--[a-z_]+)\*?`", cell):
            have = {r.flag for r in TABLE if r.process == process}
            assert any(f == flag or f.startswith(flag) for f in have), (process, flag)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_config_refusals --write")
    DOC.write_text(render())
    print(f"wrote {DOC} ({len(TABLE)} rows)")
