"""Typed config trees -> command lines, and back.

A process's configuration is one tree of frozen dataclasses. Each leaf field is declared
once, with `knob(default, help)`: its type, its one default and its documentation. From
the tree this module makes:
- argparse flags (`add_arguments`, also Beam's `PipelineOptions._add_argparse_args`),
- the tree again from parsed flags (`from_namespace`, `parse`),
- the flags that rebuild a given tree in another process (`to_argv`),
- a Markdown table of every flag (core/config_table.py, docs/CONFIG.md).

Flags are flat (`--eps_low`, not `--learner.loss.eps_low`): a section's fields join the
tree's flags under its `prefix` ("" by default); a name used twice in one tree is refused.
A `shared` section is set once for every section of its type the tree holds. Not tyro: Beam
builds its options parser itself and only asks each options class to add arguments to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import typing
from collections.abc import Iterator
from typing import Any

from core.config_checks import (
    _BOUNDS,
    _CHOICES,
    _HELP,
    _MATCHES,
    _SECTION,
    _SHARED,
    KnobError,
    check_fields,
    configclass,
)
from core.config_text import base_type, format_value, parse_value, parser_for

_FLAG, _PREFIX, _HIDE, _REPEAT, _WIRING, _LAUNCHED = "flag", "prefix", "hide", "repeat", "wiring", "launched"
_TO, _LIKE = "to", "like"
__all__ = [
    "KnobError",
    "build",
    "check_fields",
    "configclass",
    "derived",
    "knob",
    "knob_like",
    "launched",
    "parse",
    "section",
    "to_argv",
]


def knob(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices=None,
    flag: bool | str = True,
    repeat: bool = False,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    matches: tuple[str, str] | None = None,
    wiring: bool = False,
    to: tuple[str, ...] = (),
    **kw,
):
    """A config field that is a flag: its one default and its help text. `flag=False` for a
    field the builder fills in (derived from another field), `flag="name"` to rename.
    `repeat=True` (a tuple field): the flag is given once per item (`--env A=1 --env B=2`),
    for items that may hold commas. `choices`, the bounds (`ge`, `gt`, `le`, `lt`) and
    `matches=(regex, "what it is")` (for a tuple: of each item), with the field's type, are
    checked by `check_fields` whenever the config is built, whatever builds it (a
    `@configclass` calls it first). `wiring=True`: where the process connects (a topic, a
    store, a path): whoever launches it sets that, so a `launched` section offers no flag.
    `to=("learner",)`: a run-wide value of the holder, set in each named section's flag of
    the same name (`launched` builds that process's tree), which then offers no flag."""
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    metadata = {_HELP: help, _FLAG: flag, _CHOICES: tuple(choices) if choices is not None else None}
    if bounds:
        metadata[_BOUNDS] = bounds
    if matches is not None:
        metadata[_MATCHES] = (re.compile(matches[0]), matches[1])
    if repeat:
        metadata[_REPEAT] = True
    if wiring:
        metadata[_WIRING] = True
    if to:
        metadata[_TO] = tuple(to)
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=metadata, **kw)
    return dataclasses.field(default=default, metadata=metadata, **kw)


def knob_like(cls, name: str, default: Any = dataclasses.MISSING, *, to: tuple[str, ...] = ()):
    """Field `name` of `cls` as another tree holds it: one declaration (help, bounds, choices,
    flag name), with the holder's preset as its default (else the field's own). For a
    run-wide value the holder sets `to` its processes, and a planner's copy of a job's knob;
    the holder's field takes the same name."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    metadata = {**field.metadata, _LIKE: (cls, name)}
    if to:
        metadata[_TO] = tuple(to)
    if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=field.default_factory, metadata=metadata)
    return dataclasses.field(default=field.default if default is dataclasses.MISSING else default, metadata=metadata)


def derived(default: Any = dataclasses.MISSING, help: str = "", **checks):
    """A field set by the code that builds the config (from other fields), never a flag."""
    return knob(default, help, flag=False, **checks)


def section(factory, prefix="", help="", hide: tuple[str, ...] = (), *, shared=False, launched=False):
    """A nested config: its flags join the tree's, each under `prefix`. The factory's
    instance gives the section's defaults (a preset: the demo's learner is not the bare
    learner). `hide` names flags of the section that the holder sets itself (no flag).
    `shared=True`: the tree's one value of this type; every section of the type inside the
    tree's other sections takes it and has no flags (the demo's `--model` reaches each process).
    `launched=True`: a process the holder starts and wires; its `wiring` knobs have no flags."""
    meta = {_SECTION: True, _PREFIX: prefix, _HELP: help, _HIDE: tuple(hide), _SHARED: shared, _LAUNCHED: launched}
    return dataclasses.field(default_factory=factory, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One flag of a tree: where it lives (`path` of field names) and how it parses."""

    path: tuple[str, ...]
    flag: str
    type: Any
    default: Any
    help: str
    choices: tuple | None
    section: str
    repeat: bool = False
    bounds: tuple[tuple[str, Any], ...] = ()  # ("ge", 1), ...: what the docs say besides the type

    @property
    def dest(self) -> str:
        return self.flag.replace(".", "__")


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def leaves(cls, prefix: str = "", path: tuple[str, ...] = (), section_name: str = "", base=None) -> Iterator[Leaf]:
    """Every flag of the tree rooted at dataclass `cls`, depth first, in field order. Defaults
    are the fields' own, or those of `base` (an instance: a section's preset) when given."""
    yield from _leaves(cls, prefix, path, section_name, base, (), frozenset(), False)


def _leaves(cls, prefix, path, section_name, base, hides, shared, launched) -> Iterator[Leaf]:
    """`hides`: (prefix, names) per enclosing section that hides some of its flags, as seen
    from it; `shared`: the section types an enclosing tree sets for all it holds;
    `launched`: inside a process the tree launches (its wiring is not a flag)."""
    hints = _hints(cls)
    own_shared = {hints[f.name] for f in dataclasses.fields(cls) if f.metadata.get(_SHARED)}
    forwarded = _forwarded(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get(_SECTION) and hints[f.name] in shared:
            continue  # the holder's shared section sets it
        if f.metadata.get(_SECTION):
            sub_base = getattr(base, f.name) if base is not None else f.default_factory()
            sub_prefix = prefix + f.metadata.get(_PREFIX, "")
            yield from _leaves(
                hints[f.name],
                sub_prefix,
                path + (f.name,),
                section_name or f.name,
                sub_base,
                (*hides, (sub_prefix, frozenset(f.metadata.get(_HIDE, ())) | forwarded.get(f.name, frozenset()))),
                shared if f.metadata.get(_SHARED) else shared | own_shared,
                launched or f.metadata.get(_LAUNCHED, False),
            )
            continue
        flag = f.metadata.get(_FLAG, True)
        if flag is False or not f.init or (launched and f.metadata.get(_WIRING)):
            continue
        name = flag if isinstance(flag, str) else f.name
        full = prefix + name
        if any(full.startswith(p) and full[len(p) :] in names for p, names in hides):
            continue
        if base is not None:
            default = getattr(base, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        yield Leaf(
            path + (f.name,),
            prefix + name,
            hints[f.name],
            default,
            f.metadata.get(_HELP, ""),
            f.metadata.get(_CHOICES),
            section_name or cls.__name__,
            f.metadata.get(_REPEAT, False),
            tuple(f.metadata.get(_BOUNDS, {}).items()),
        )


def _forwarded(cls) -> dict[str, frozenset[str]]:
    """Section name -> the holder's fields declared `to` it (their flags are the holder's)."""
    out: dict[str, set[str]] = {}
    for f in dataclasses.fields(cls):
        for name in f.metadata.get(_TO, ()):
            out.setdefault(name, set()).add(f.name)
    return {name: frozenset(fields) for name, fields in out.items()}


def forwarded(holder, name: str) -> dict[str, Any]:
    """The holder's run-wide values (`knob(to=...)`) for the process `name`, by field."""
    return {field: getattr(holder, field) for field in sorted(_forwarded(type(holder)).get(name, frozenset()))}


def launched(holder, name: str):
    """Section `name` of `holder` with the holder's run-wide values (`knob(to=...)`) set in
    it: the tree of the process the holder launches, before the holder wires it."""
    return replace(getattr(holder, name), **forwarded(holder, name))


def add_arguments(parser, cls, prefix: str = "", base=None) -> list[Leaf]:
    """Adds one flag per leaf of `cls` to an argparse parser (or Beam's); refuses a tree
    that would give two fields the same flag. `base`: an instance whose values are the
    defaults (else the fields' own)."""
    seen: dict[str, Leaf] = {}
    out = []
    for leaf in leaves(cls, prefix, base=base):
        if leaf.flag in seen:
            raise TypeError(
                f"--{leaf.flag} is declared twice in {cls.__name__}: {seen[leaf.flag].path} and {leaf.path}"
            )
        seen[leaf.flag] = leaf
        base, optional = base_type(leaf.type)
        doc = leaf.help + ("" if leaf.default is dataclasses.MISSING else f" (default: {format_value(leaf.default)})")
        kw: dict[str, Any] = {"dest": leaf.dest, "help": doc.replace("%", "%%")}
        if leaf.default is dataclasses.MISSING:
            kw["required"] = True
        else:
            kw["default"] = leaf.default
        if base is bool and not optional:
            kw["action"] = argparse.BooleanOptionalAction
        elif leaf.repeat:
            kw["action"], kw["metavar"] = _Repeat, "VALUE"
            kw["type"] = parser_for((typing.get_args(base) or (str,))[0])
        else:
            kw["type"] = parser_for(leaf.type)
            kw["metavar"] = getattr(base, "__name__", "VALUE").upper()
            if leaf.choices is not None and typing.get_origin(base) is not tuple:  # items: check_fields
                kw["choices"] = leaf.choices
        parser.add_argument(f"--{leaf.flag}", **kw)
        out.append(leaf)
    return out


class _Repeat(argparse.Action):
    """Each occurrence adds one item to a tuple (the default is never mutated)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (*(getattr(namespace, self.dest, None) or ()), values))


def from_namespace(cls, ns, prefix: str = "", base=None):
    """The tree of `cls` from parsed flags (a Namespace, a Beam options view or a dict by
    dest); absent flags keep their default (or `base`'s). Sections are built bottom up, so
    every check runs; text values parse as on the command line (Beam keeps some as text).
    A section holds only what is set on it."""
    values = vars(ns) if not isinstance(ns, dict) else ns
    return _build(cls, values, prefix, (), base)


def _build(cls, values: dict, prefix: str, path: tuple[str, ...], base):
    hints = _hints(cls)
    by_path = {leaf.path: leaf for leaf in leaves(cls, prefix, path, base=base)}
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.metadata.get(_SECTION):
            sub_base = getattr(base, f.name) if base is not None else f.default_factory()
            sub_prefix = prefix + f.metadata.get(_PREFIX, "")
            kwargs[f.name] = _build(hints[f.name], values, sub_prefix, path + (f.name,), sub_base)
            continue
        leaf = by_path.get(path + (f.name,))
        if leaf is not None and leaf.dest in values:
            value = values[leaf.dest]
            if isinstance(value, os.PathLike) and base_type(leaf.type)[0] is str:
                value = os.fspath(value)  # a Path (or epath) where a path is asked for
            elif isinstance(value, str) and base_type(leaf.type)[0] is not str:
                value = parse_value(value, leaf.type)
            kwargs[f.name] = value
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except KnobError as e:  # name the flag as the user types it: the section's prefix too
        if e.qualified or not prefix:
            raise
        raise KnobError(prefix + e.flag, e.text, qualified=True) from None


def build(cls, base=None, **by_flag):
    """A tree of `cls` from values named by flag (`build(PlanConfig, group_size=8)`); refuses a non-flag."""
    dests = {leaf.flag: leaf.dest for leaf in leaves(cls, base=base)}
    unknown = sorted(set(by_flag) - set(dests))
    if unknown:
        raise KeyError(f"{cls.__name__} has no flag {', '.join('--' + u for u in unknown)}")
    return from_namespace(cls, {dests[k]: v for k, v in by_flag.items()}, base=base)


def parse(cls, argv: list[str] | None, description: str = "", prog: str | None = None, base=None):
    """`argv` as a tree of `cls` (defaults: the fields' or `base`'s); a refusal exits, naming it."""
    parser = make_parser(cls, description, prog, base)
    ns = parser.parse_args(argv)
    try:
        return from_namespace(cls, ns, base=base)
    except (ValueError, TypeError) as e:
        parser.error(str(e))


def make_parser(cls, description: str = "", prog: str | None = None, base=None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, cls, base=base)
    return parser


def get(tree, path: tuple[str, ...]):
    return functools.reduce(getattr, path, tree)


def to_argv(tree, prefix: str = "", *, only_changed: bool = True, base=None) -> list[str]:
    """The flags that rebuild `tree` in a process that parses `type(tree)`: every field that
    differs from its default (all with `only_changed=False`), plus required ones. With
    `base`: the flags that turn `base` into `tree` (what a user changed on a preset)."""
    out = []
    for leaf in leaves(type(tree), prefix, base=base):
        value = get(tree, leaf.path)
        if only_changed and leaf.default is not dataclasses.MISSING and value == leaf.default:
            continue
        kind, optional = base_type(leaf.type)
        if value is None:
            if leaf.default not in (None, dataclasses.MISSING):
                raise ValueError(f"--{leaf.flag}: unset cannot be said on a command line whose default is set")
            continue
        if kind is bool and not optional:
            out.append(f"--{leaf.flag}" if value else f"--no-{leaf.flag}")
        elif leaf.repeat:
            out.extend(f"--{leaf.flag}={format_value(item)}" for item in value)
        else:
            out.append(f"--{leaf.flag}={format_value(value)}")
    return out


def replace(tree, **changes):
    """`dataclasses.replace` by flag name anywhere in the tree: replace(cfg, eps_low=0.1)."""
    by_flag = {leaf.flag: leaf.path for leaf in leaves(type(tree))}
    for flag, value in changes.items():
        if flag not in by_flag:
            raise KeyError(f"{type(tree).__name__} has no flag --{flag}")
        tree = _replace_path(tree, by_flag[flag], value)
    return tree


def _replace_path(tree, path: tuple[str, ...], value):
    if len(path) == 1:
        return dataclasses.replace(tree, **{path[0]: value})
    return dataclasses.replace(tree, **{path[0]: _replace_path(getattr(tree, path[0]), path[1:], value)})
