"""Declarative checks of an environment config's fields (core.config's knobs, for a package
that imports nothing of ours). A field's annotation (int, float, bool, str) says its type;
`bounded(...)` adds choices and bounds. `check_fields(obj)`, first in `__post_init__`, refuses
a value that breaks either, naming `Class.field`, the rule and the value; `__post_init__`
keeps the rules that relate fields.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import typing

_KEY = "environments.fields"
_KINDS = {int: "an int", float: "a number", bool: "true or false", str: "a str"}
_OPS = (("ge", operator.ge, ">="), ("gt", operator.gt, ">"), ("le", operator.le, "<="), ("lt", operator.lt, "<"))


def bounded(default, *, ge=None, gt=None, le=None, lt=None, choices=None, finite=False, why=""):
    """A field with its default and what its value may be; `why` is said when it is refused."""
    rule = {"ge": ge, "gt": gt, "le": le, "lt": lt, "finite": finite, "why": why}
    return dataclasses.field(default=default, metadata={_KEY: rule | {"choices": choices and tuple(choices)}})


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _holds(kind, v, rule: dict) -> bool:
    if kind in (int, float) and (isinstance(v, bool) or not isinstance(v, int if kind is int else (int, float))):
        return False  # bool is an int to Python, never to a config
    if kind in (bool, str) and not isinstance(v, kind):
        return False
    if (rule.get("finite") and not math.isfinite(v)) or (rule.get("choices") and v not in rule["choices"]):
        return False
    return all(rule.get(k) is None or op(v, rule[k]) for k, op, _ in _OPS)  # NaN fails every bound


def _rule(kind, rule: dict) -> str:
    text = "a finite number" if kind is float and rule.get("finite") else _KINDS.get(kind, "a value")
    text = f"one of {list(rule['choices'])}" if rule.get("choices") else text
    lo, hi = (rule.get("ge"), rule.get("gt")), (rule.get("le"), rule.get("lt"))
    if any(b is not None for b in lo) and any(b is not None for b in hi):  # both ends: an interval
        left = f"[{lo[0]}" if lo[0] is not None else f"({lo[1]}"
        text += f" in {left}, " + (f"{hi[0]}]" if hi[0] is not None else f"{hi[1]})")
    else:
        text += "".join(f" {sign} {rule[k]}" for k, _, sign in _OPS if rule.get(k) is not None)
    return text + (f" ({rule['why']})" if rule.get("why") else "")


def check_fields(obj) -> None:
    """ValueError naming the first field of dataclass `obj` whose value breaks its declaration."""
    for f in dataclasses.fields(obj):
        kind, rule = _hints(type(obj)).get(f.name), f.metadata.get(_KEY, {})
        if (kind in _KINDS or rule) and not _holds(kind, v := getattr(obj, f.name), rule):
            raise ValueError(f"{type(obj).__name__}.{f.name} must be {_rule(kind, rule)}, got {v!r}")
