"""Render a Hugging Face chat template with jinja2, exactly as `transformers` does.

What must match `apply_chat_template(..., tokenize=False)` (transformers 5,
`utils/chat_template_utils.py`), since rollout tokens must equal what the model was
trained on and what HF would produce:
  - the environment: `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`
    with the loop-controls extension and a `{% generation %}` block tag (HF uses it to
    mark assistant tokens; here it only renders its body);
  - `tojson` with HF's semantics (no HTML escaping, `ensure_ascii=False`, `indent`,
    `separators`, `sort_keys=False`), `raise_exception`, `strftime_now`, a `dict` and a
    `namespace` that refuse dunder tricks;
  - the inputs: keys whose value is None dropped from each message, `reasoning_content`
    filled from older names for it, everything rebuilt from plain JSON types, and the
    variables `messages`, `tools`, `documents`, `add_generation_prompt` plus the special
    tokens and the caller's variables.
Templates come from checkpoints, i.e. from strangers: hence the sandbox, and jinja2 >= 3.1.6
(older versions have known sandbox escapes).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The names a message's reasoning comes under; templates read the first (HF's order).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """One conversation rendered with `template`; `variables` (special tokens, template
    switches such as `enable_thinking`) are visible to the template by name."""
    if not messages:
        raise ValueError("cannot render an empty conversation: give at least one message")
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise TypeError(f"a tool must be a JSON-schema dict in HF's tools format, got {tool!r}")
    if documents is not None:
        for document in documents:
            if not isinstance(document, Mapping):
                raise TypeError("documents must be dicts with 'title' and 'text' keys")
    chat = _alias_reasoning(_plain([_without_none(m) for m in messages]))
    extra = _plain(dict(variables or {}))
    reserved = {"messages", "tools", "documents", "add_generation_prompt"} & set(extra)
    if reserved:
        raise ValueError(f"template variables {sorted(reserved)} are set by render() itself")
    return compile_template(template).render(
        messages=chat,
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **extra,
    )


def _without_none(message) -> dict:
    # Some APIs send `content=None` or `tool_calls=None`; templates handle a missing key
    # but would print "None" for the value, so HF drops such keys.
    if not isinstance(message, Mapping):
        raise TypeError(f"a chat message must be a dict, got {message!r}")
    return {k: v for k, v in message.items() if v is not None}


def _alias_reasoning(chat: list[dict]) -> list[dict]:
    out = []
    for message in chat:
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _plain(value: Any) -> Any:
    """The value rebuilt from JSON types, so the sandboxed template only sees inert data;
    anything else becomes a "<TypeName>" placeholder (as HF does)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums, ...) carry methods: strip to the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and callable(value.item) and type(value).__module__ == "numpy":
        return _plain(value.item())  # numpy scalars
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: HF marks assistant text with it; the text
    renders unchanged, which is all rendering needs."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters (<, >, &, '), which would change the
    # tokens of every tool schema; HF overrides it with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    # `dict(...)` and `dict.fromkeys(...)` for templates, without the type itself
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace, refusing underscore names (a way to reach CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attribute {name!r}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


@lru_cache(maxsize=32)
def compile_template(template: str) -> jinja2.Template:
    """The compiled template (cached: a worker renders the same one for every episode)."""
    if _version(jinja2.__version__) < (3, 1, 6):
        raise ImportError(f"chat templates need jinja2>=3.1.6 (sandbox fixes), found {jinja2.__version__}")
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env.from_string(template)
