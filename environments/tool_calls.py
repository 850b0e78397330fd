"""The one tool-call format, its parser, and the formatting of tool output.

Kept terse because the policy is a tiny byte-level model with a ~256-token context.

Model -> environment (one action per model turn):

    <call NAME>ARGS</call>      call tool NAME with ARGS (raw text, passed verbatim)
    <answer>TEXT</answer>       final answer; ends the episode

    NAME is 1-32 characters of [A-Za-z0-9_], not starting with a digit; spaces around
    it inside the tag are allowed (`<call  calc >`). Text before the first tag is ignored
    (room for reasoning). The FIRST opening tag decides the action and must be closed by
    its own closing tag with no other opening tag in between; anything after that closing
    tag is ignored. `<caller>` or `<calc>` are not tags. Everything else is `Malformed`,
    with a short plain-words reason (it is shown to the model, so no tags in it).

Environment -> model:

    <result>TEXT</result>       tool output
    <error>TEXT</error>         tool or format error

    TEXT is escaped (`<` -> `&lt;`, `>` -> `&gt;`) so tool output can never look like a
    tag, and capped in length so one observation cannot flood the context.

The sampler ends a model turn when the generated text ends with one of
`TURN_STOP_STRINGS`. `parse_action` never raises, whatever the input.
"""

from __future__ import annotations

import dataclasses
import re

TURN_STOP_STRINGS = ("</call>", "</answer>")
# Only this prefix of an action is scanned: bounds the cost on pathological input. Far
# longer than any turn the model can produce, so a tag cut by it is a real defect.
MAX_SCAN_CHARS = 16_384
MAX_OBSERVATION_CHARS = 128
MAX_NAME_CHARS = 32

_OPEN_RE = re.compile(r"<call(?=[\s>])|<answer>")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    args: str


@dataclasses.dataclass(frozen=True)
class FinalAnswer:
    text: str


@dataclasses.dataclass(frozen=True)
class Malformed:
    reason: str


Action = ToolCall | FinalAnswer | Malformed


def parse_action(text: str) -> Action:
    """Parse one model turn into an Action. Never raises."""
    try:
        return _parse(text)
    except Exception as e:  # Defence in depth: a parser bug must not kill an episode.
        return Malformed(f"unparseable action ({type(e).__name__})")


def _parse(text: str) -> Action:
    if not isinstance(text, str):
        return Malformed(f"action must be text, got {type(text).__name__}")
    text = text[:MAX_SCAN_CHARS]
    m = _OPEN_RE.search(text)
    if m is None:
        return Malformed("no call or answer tag")
    if m.group() == "<answer>":
        body = _body(text, m.end(), "</answer>", "answer")
        return body if isinstance(body, Malformed) else FinalAnswer(body)
    # `<call` then the name up to the first '>' (bounded: names are short).
    gt = text.find(">", m.end(), m.end() + MAX_NAME_CHARS + 64)
    if gt < 0:
        return Malformed("unclosed call tag")
    name = text[m.end() : gt].strip()
    if not name:
        return Malformed("empty tool name")
    if len(name) > MAX_NAME_CHARS or not _NAME_RE.match(name):
        return Malformed("bad tool name")
    body = _body(text, gt + 1, "</call>", "call")
    return body if isinstance(body, Malformed) else ToolCall(name, body)


def _body(text: str, start: int, close: str, kind: str) -> str | Malformed:
    end = text.find(close, start)
    if end < 0:
        return Malformed(f"{kind} not closed")
    body = text[start:end]
    if _OPEN_RE.search(body):
        return Malformed(f"tag inside {kind}")
    return body


def _escape(text: object, max_chars: int) -> str:
    s = text if isinstance(text, str) else str(text)
    # Cap before escaping (cheap on huge input), then again after (escapes lengthen it).
    s = s[: max_chars * 2].replace("<", "&lt;").replace(">", "&gt;")
    if len(s) > max_chars:  # Mark the cut so the model can tell output was truncated.
        s = s[: max_chars - 3] + "..." if max_chars > 3 else s[: max(0, max_chars)]
    return s


def format_result(text: object, max_chars: int = MAX_OBSERVATION_CHARS) -> str:
    """Wrap tool output for the model: `<result>TEXT</result>`, escaped and capped."""
    return f"<result>{_escape(text, max_chars)}</result>"


def format_error(text: object, max_chars: int = MAX_OBSERVATION_CHARS) -> str:
    """Wrap an error for the model: `<error>TEXT</error>`, escaped and capped."""
    return f"<error>{_escape(text, max_chars)}</error>"
