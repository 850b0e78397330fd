"""Flag text <-> config values: how a field's type reads from and writes to a command line."""

from __future__ import annotations

import argparse
import json
import types
import typing


def base_type(tp):
    """`int | None` -> (int, True); `int` -> (int, False)."""
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return (inner[0] if len(inner) == 1 else str), True
    return tp, False


def parse_value(text: str, tp):
    base, _ = base_type(tp)
    origin = typing.get_origin(base)
    if base is bool:
        return text.lower() in ("1", "true", "yes")
    if base in (int, float, str):
        return base(text)
    if origin is tuple or base is tuple:
        item = (typing.get_args(base) or (str,))[0]
        if text == "":
            return ()
        if "" in (parts := [x.strip() for x in text.split(",")]):
            raise ValueError(f"an empty item in {text!r}")  # a typo ("128,,256"), not a shorter list
        return tuple(item(x) for x in parts)
    if origin is dict or base is dict:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
        return value
    return text


def parser_for(tp):
    def parse_text(text: str):
        try:
            return parse_value(text, tp)
        except (ValueError, json.JSONDecodeError) as e:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {type_name(tp)} ({e})") from None

    return parse_text


def type_name(tp) -> str:
    base, optional = base_type(tp)
    origin = typing.get_origin(base)
    if origin is tuple:
        name = "comma-separated list of " + getattr(typing.get_args(base)[0], "__name__", "values")
    elif origin is dict or base is dict:
        name = "JSON object"
    else:
        name = getattr(base, "__name__", str(base))
    return name + (" or unset" if optional else "")


def format_value(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)
