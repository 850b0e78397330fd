"""Checks of a config's knobs, whatever builds it (core/config.py declares them).

`knob(..., choices=, ge=, gt=, le=, lt=, matches=)` records what a value may be; the field's type
annotation says what it must be. `@configclass` (a frozen dataclass) checks both before
the class's own `__post_init__`, which is left with the rules that relate fields.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing

_HELP, _SECTION, _CHOICES, _BOUNDS, _MATCHES, _FLAG = "help", "section", "choices", "bounds", "matches", "flag"
_SHARED = "shared"
_COMPARE = {
    "ge": (lambda v, b: v >= b, ">="),
    "gt": (lambda v, b: v > b, ">"),
    "le": (lambda v, b: v <= b, "<="),
    "lt": (lambda v, b: v < b, "<"),
}


def configclass(cls=None, /, **dataclass_kw):
    """`@dataclasses.dataclass(frozen=True)` whose construction hands its shared sections to
    the sections it holds before they are stored (`shared_into`), then checks every knob's
    type, choices and bounds (`check_fields`), then runs the class's own `__post_init__`
    (cross-field rules only). Any construction path: flags, `build`, a direct call,
    `dataclasses.replace`."""

    def wrap(cls):
        own = cls.__dict__.get("__post_init__")

        def __post_init__(self):
            check_fields(self)
            if own is not None:
                own(self)

        cls.__post_init__ = __post_init__
        cls = dataclasses.dataclass(frozen=True, **dataclass_kw)(cls)
        if any(f.metadata.get(_SHARED) for f in dataclasses.fields(cls)):
            cls.__init__ = _sharing_init(cls, cls.__init__)
        return cls

    return wrap if cls is None else wrap(cls)


def _sharing_init(cls, init):
    """The dataclass's __init__, given every value with the shared sections already in the
    held ones: nothing is rewritten after construction."""
    signature = inspect.signature(init)
    fields = [f for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        values = dict(signature.bind(self, *args, **kwargs).arguments)
        del values["self"]
        for f in fields:
            if f.name not in values and f.default_factory is not dataclasses.MISSING:
                values[f.name] = f.default_factory()
            elif f.name not in values and f.default is not dataclasses.MISSING:
                values[f.name] = f.default
        init(self, **shared_into(cls, values))

    return __init__


class KnobError(ValueError):
    """A knob's value refused by its declaration; the message starts with the knob's flag
    name (its section's prefix added by config.from_namespace, which knows it)."""

    def __init__(self, flag: str, text: str, qualified: bool = False):
        super().__init__(f"{flag} {text}")
        self.flag, self.text, self.qualified = flag, text, qualified


def check_fields(obj) -> None:
    """ValueError naming the first knob of `obj` whose value has the wrong type, is not one
    of its choices or is out of its bounds. Sections are checked when they are built."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.metadata.get(_SECTION) or _HELP not in f.metadata:
            continue
        value, (kind, optional) = getattr(obj, f.name), _declared(hints[f.name])
        if value is None:
            if not optional and f.default is not None:
                raise KnobError(_flag(f), "must be set, got None")
            continue
        if typing.get_origin(kind) is tuple or kind is tuple:
            if not isinstance(value, tuple):
                raise KnobError(_flag(f), f"must be a tuple, got {value!r}")
            item_kind = (typing.get_args(kind) or (object,))[0]
            for item in value:
                _check_value(f, typing.get_origin(item_kind) or item_kind, item, value)
        else:
            _check_value(f, typing.get_origin(kind) or kind, value, value)


def _declared(tp):
    """(the type a value must have, None allowed); (object, ...) when the annotation names
    several types (only choices and bounds are checked then)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(inner) < len(typing.get_args(tp))
        return (inner[0] if len(inner) == 1 else object), optional
    return tp, False


def _flag(f) -> str:
    flag = f.metadata.get(_FLAG, True)
    return flag if isinstance(flag, str) else f.name


def _check_value(f, kind, item, whole) -> None:
    choices = f.metadata.get(_CHOICES)
    if kind is int and type(item) is not int:
        raise KnobError(_flag(f), f"must be an int, got {whole!r}")
    if kind is float and (isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item)):
        raise KnobError(_flag(f), f"must be a finite number, got {whole!r}")
    if kind in (str, bool, dict, list) and not isinstance(item, kind):
        raise KnobError(_flag(f), f"must be a {kind.__name__}, got {whole!r}")
    if choices is not None and item not in choices:
        raise KnobError(_flag(f), f"must be one of {list(choices)}, got {item!r}")
    if _MATCHES in f.metadata and not f.metadata[_MATCHES][0].fullmatch(item):
        raise KnobError(_flag(f), f"must be {f.metadata[_MATCHES][1]}, got {item!r}")
    for op, bound in f.metadata.get(_BOUNDS, {}).items():
        holds, sign = _COMPARE[op]
        if not holds(item, bound):
            raise KnobError(_flag(f), f"must be {sign} {bound}, got {whole!r}")


def shared_into(cls, values: dict) -> dict:
    """A section declared `shared` is the one value of its type in the whole tree: every
    section of that type inside the other sections (at any depth) is replaced by it, so a
    holder (the demo) sets the model, the environment or the layout once for every process
    it holds. Replacing rebuilds each held tree on the way, so its own checks see the shared
    value."""
    fields = dataclasses.fields(cls)
    shared = {type(values[f.name]): values[f.name] for f in fields if f.metadata.get(_SHARED) and f.name in values}
    out = dict(values)
    for f in fields:
        if f.metadata.get(_SECTION) and not f.metadata.get(_SHARED) and f.name in out:
            out[f.name] = _given(out[f.name], shared)
    return out


def _given(tree, shared: dict):
    changes = {}
    for f in dataclasses.fields(tree):
        if not f.metadata.get(_SECTION):
            continue
        value = getattr(tree, f.name)
        new = shared.get(type(value), None)
        new = _given(value, shared) if new is None else new
        if new is not value and new != value:
            changes[f.name] = new
    return dataclasses.replace(tree, **changes) if changes else tree
