"""Native tool-call syntaxes: how a model family writes a call, gets a tool's result back,
and how one turn of its text becomes an environment `Action`.

Three styles (core/policy/text/chat_format.py picks one from the chat template's text):
  - "qwen" (Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
    in the assistant turn, results in the template's `tool` role; Qwen3's
    `<think>...</think>` is dropped before parsing.
  - "llama3" (Llama 3.1+): the whole assistant turn is `{"name": ..., "parameters": {...}}`,
    results in the `tool` role (the template writes it as `ipython`).
  - "hermes", for templates with no tool support (Gemma 3): the tools are described in the
    system text (Hermes' `<tools>` block), calls are parsed as Qwen's, results go back as
    user turns `<tool_response>\\nOBS\\n</tool_response>`.

Parsing never raises. A call's arguments must hold exactly the tool's one declared
argument: a string, or a JSON number/bool (kept as its `str()`). Anything else is
`Malformed` with a short plain-words reason (it is shown to the model, so no tags in it).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from environments.tool_calls import MAX_SCAN_CHARS, Action, FinalAnswer, Malformed, ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may open a call with it (a special token, normally skipped)
_JSON_OBJECT_START = re.compile(r"\{\s*\"")  # what makes a Llama turn a call rather than an answer

HERMES_SYSTEM = (
    "You may call one function per turn to help with the user's request.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, reply with only a JSON object with the function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
    "</tool_call>\n\nThe result comes back within <tool_response></tool_response> XML tags. "
    "When you know the final answer, reply with the answer alone."
)


def tool_argument(tools: Sequence[Mapping[str, Any]], name: str) -> str | None:
    """The one argument of tool `name` as `tools` declares it; None for an unknown tool or
    one declaring other than exactly one argument (its call's arguments pass as JSON)."""
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties") or {}
            return next(iter(properties)) if len(properties) == 1 else None
    return None


def call_arguments(tools: Sequence[Mapping[str, Any]], name: str, args: str) -> dict[str, str]:
    """The arguments object of a call to `name` with the env-level argument text `args`."""
    argument = tool_argument(tools, name)
    if argument is None:
        raise ValueError(f"tool {name!r} is not among the tools given, or does not take exactly one argument")
    return {argument: args}


def _tool_calls_message(name: str, arguments: dict) -> dict:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "tool_calls": [call]}


def hermes_call_text(name: str, arguments: dict) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def _hermes_system(tools: Sequence[Mapping[str, Any]], system: str | None) -> str | None:
    if not tools:
        return system
    described = HERMES_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    return f"{system}\n\n{described}" if system else described


@dataclasses.dataclass(frozen=True)
class ToolCallStyle:
    """How one family's messages look (in HF's message format) and how its turns parse."""

    name: str
    # tools as the template's `tools` variable (None: the template is not given them)
    template_tools: Callable[[Sequence[Mapping[str, Any]]], list | None]
    # the system text of an episode: the caller's system prompt, plus the tools for hermes
    system_text: Callable[[Sequence[Mapping[str, Any]], str | None], str | None]
    call_message: Callable[[str, dict], dict]
    observation_message: Callable[[str], dict]
    parse: Callable[[str, Sequence[Mapping[str, Any]]], Action]


def _given_tools(tools):
    return [dict(t) for t in tools] or None


QWEN = ToolCallStyle(
    name="qwen",
    template_tools=_given_tools,
    system_text=lambda tools, system: system,
    call_message=_tool_calls_message,
    observation_message=lambda obs: {"role": "tool", "content": obs},
    parse=lambda text, tools: parse_tagged_call(text, tools),
)
LLAMA3 = ToolCallStyle(
    name="llama3",
    template_tools=_given_tools,
    system_text=lambda tools, system: system,
    call_message=_tool_calls_message,
    observation_message=lambda obs: {"role": "tool", "content": obs},
    parse=lambda text, tools: parse_json_call(text, tools),
)
HERMES = ToolCallStyle(
    name="hermes",
    template_tools=lambda tools: None,
    system_text=_hermes_system,
    call_message=lambda name, arguments: {"role": "assistant", "content": hermes_call_text(name, arguments)},
    observation_message=lambda obs: {"role": "user", "content": f"<tool_response>\n{obs}\n</tool_response>"},
    parse=lambda text, tools: parse_tagged_call(text, tools),
)
STYLES = {s.name: s for s in (QWEN, LLAMA3, HERMES)}


def _without_reasoning(text: str) -> str | Malformed:
    """The text after the last `</think>` (Qwen3 reasons first); an unclosed one is an error."""
    if THINK_CLOSE in text:
        return text.rsplit(THINK_CLOSE, 1)[1]
    if text.lstrip().startswith(THINK_OPEN):
        return Malformed("reasoning not closed")
    return text


def parse_tagged_call(text: str, tools: Sequence[Mapping[str, Any]]) -> Action:
    """Qwen / Hermes: one `<tool_call>{json}</tool_call>` (text before it is ignored), or
    no call at all: the stripped text is the final answer."""
    text = _without_reasoning(text[:MAX_SCAN_CHARS])
    if isinstance(text, Malformed):
        return text
    start = text.find(CALL_OPEN)
    if start < 0:
        if CALL_CLOSE in text:
            return Malformed("tool call closed but never opened")
        return FinalAnswer(text.strip())
    body_start = start + len(CALL_OPEN)
    end = text.find(CALL_CLOSE, body_start)
    if end < 0:
        return Malformed("tool call not closed")
    if CALL_OPEN in text[body_start:end] or CALL_OPEN in text[end:]:
        return Malformed("only one tool call per turn")
    return call_from_json(text[body_start:end], tools, "arguments")


def parse_json_call(text: str, tools: Sequence[Mapping[str, Any]]) -> Action:
    """Llama 3: a turn that is a JSON object (`{"name": ..., "parameters": {...}}`) is a
    call; any other text is the final answer."""
    text = _without_reasoning(text[:MAX_SCAN_CHARS])
    if isinstance(text, Malformed):
        return text
    text = text.strip()
    if text.startswith(PYTHON_TAG):  # when decoded with special tokens kept
        text = text[len(PYTHON_TAG) :].lstrip()
    if not _JSON_OBJECT_START.match(text):
        return FinalAnswer(text)
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return Malformed("tool call is not valid JSON")
    rest = text[end:].lstrip(" \n;,")
    if rest:
        return Malformed("only one tool call per turn" if rest.startswith("{") else "text after the tool call")
    return call_from_json(text[:end], tools, "parameters")


def call_from_json(body: str, tools: Sequence[Mapping[str, Any]], arguments_key: str) -> Action:
    """A call object `{"name": str, arguments_key: {...}}` -> ToolCall, or why not."""
    try:
        call = json.loads(body)
    except ValueError:
        return Malformed("tool call is not valid JSON")
    if not isinstance(call, dict):
        return Malformed("tool call must be a JSON object")
    if set(call) != {"name", arguments_key}:
        return Malformed(f"tool call needs exactly the keys name and {arguments_key}")
    name, arguments = call["name"], call[arguments_key]
    if not isinstance(name, str) or not name:
        return Malformed("tool name must be a non-empty string")
    if not isinstance(arguments, dict):
        return Malformed(f"{arguments_key} must be a JSON object")
    argument = tool_argument(tools, name)
    if argument is None:  # unknown tool (the environment counts it) or not a one-argument tool
        return ToolCall(name, json.dumps(arguments, ensure_ascii=False))
    if set(arguments) != {argument}:
        return Malformed(f"the tool takes exactly one argument, {_plain(argument)}")
    value = arguments[argument]
    if isinstance(value, str):
        return ToolCall(name, value)
    if isinstance(value, (int, float, bool)):
        return ToolCall(name, str(value))
    return Malformed(f"argument {_plain(argument)} must be a string or a number")


def _plain(text: str) -> str:
    # a schema's argument name is ours, but keep reasons tag-free whatever it holds
    return text.replace("<", "").replace(">", "")[:32]
