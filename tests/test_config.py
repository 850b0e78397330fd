"""core.config: a typed tree's flags, parsing, round trips through to_argv, presets."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import config, config_table
from core.config import derived, knob, section


@dataclasses.dataclass(frozen=True)
class Inner:
    eps: float = knob(0.2, "clip range")
    name: str = knob("ppo", "algorithm", choices=("ppo", "grpo"))
    computed: int = derived(0)

    def __post_init__(self):
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")


@dataclasses.dataclass(frozen=True)
class Outer:
    topic: str = knob(help="where to publish")  # required
    steps: int = knob(20, "steps")
    sync: bool = knob(False, "synchronous")
    trace: bool = knob(True, "trace")
    cap: float | None = knob(None, "cap (unset: off)")
    buckets: tuple[int, ...] = knob((), "row lengths")
    env_config: dict = knob({}, "JSON")
    inner: Inner = section(Inner)
    warm: Inner = section(lambda: Inner(eps=0.5), prefix="warm_", hide=("name",))


def test_flags_are_flat_prefixed_and_hide_what_the_holder_sets():
    flags = [leaf.flag for leaf in config.leaves(Outer)]
    assert flags == ["topic", "steps", "sync", "trace", "cap", "buckets", "env_config", "eps", "name", "warm_eps"]


def test_parser_defaults_equal_field_defaults_and_a_preset_section_gives_its_own():
    parser = config.make_parser(Outer)
    ns = parser.parse_args(["--topic=t"])
    for leaf in config.leaves(Outer):
        if leaf.default is not dataclasses.MISSING:
            assert getattr(ns, leaf.dest) == leaf.default, leaf.flag
    cfg = config.from_namespace(Outer, ns)
    assert cfg.warm.eps == 0.5 and cfg.warm.name == "ppo" and cfg.inner.eps == 0.2


def test_a_required_flag_and_a_refused_value_exit_with_the_flag_named(capsys):
    with pytest.raises(SystemExit):
        config.parse(Outer, [])
    assert "--topic" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config.parse(Outer, ["--topic=t", "--eps=-1"])
    assert "eps must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config.parse(Outer, ["--topic=t", "--buckets=a,b"])
    assert "--buckets" in capsys.readouterr().err


def test_two_fields_with_one_flag_are_refused():
    @dataclasses.dataclass(frozen=True)
    class Twice:
        a: Inner = section(Inner)
        b: Inner = section(Inner)

    with pytest.raises(TypeError, match="--eps is declared twice"):
        config.make_parser(Twice)


@given(
    steps=st.integers(-5, 10**6),
    sync=st.booleans(),
    trace=st.booleans(),
    cap=st.none() | st.floats(0.01, 100, allow_nan=False),
    buckets=st.lists(st.integers(1, 4096), max_size=4).map(tuple),
    env=st.dictionaries(st.text("abc", min_size=1, max_size=3), st.integers(), max_size=3),
    eps=st.floats(0.001, 10, allow_nan=False),
    name=st.sampled_from(["ppo", "grpo"]),
)
def test_to_argv_round_trips_any_tree(steps, sync, trace, cap, buckets, env, eps, name):
    cfg = Outer("t", steps, sync, trace, cap, buckets, env, Inner(eps, name), Inner(eps=eps * 2))
    argv = config.to_argv(cfg)
    assert config.parse(Outer, argv) == cfg
    # Only what differs from a default is said (the required topic always is).
    assert config.to_argv(Outer("t")) == ["--topic=t"]


def test_build_and_replace_by_flag_name():
    cfg = config.build(Outer, topic="x", eps=0.3, warm_eps=0.7)
    assert (cfg.inner.eps, cfg.warm.eps, cfg.steps) == (0.3, 0.7, 20)
    assert config.replace(cfg, steps=3).steps == 3
    with pytest.raises(KeyError, match="--nope"):
        config.build(Outer, topic="x", nope=1)


def test_parse_onto_a_base_keeps_its_values():
    base = config.build(Outer, topic="x", steps=7)
    cfg = config.parse(Outer, ["--eps=0.4"], base=base)
    assert (cfg.topic, cfg.steps, cfg.inner.eps) == ("x", 7, 0.4)


def test_markdown_table_lists_every_flag_with_its_doc():
    table = config_table.markdown_table(Outer, "Outer", "agentic-rl outer")
    for leaf in config.leaves(Outer):
        assert f"`--{leaf.flag}`" in table and leaf.help in table
    assert "| `--topic` | str | required |" in table


def test_to_argv_against_a_base_says_only_what_changed_on_the_preset():
    preset = config.build(Outer, topic="x", steps=7)
    changed = config.replace(preset, steps=9, eps=0.3)
    assert config.to_argv(changed, base=preset) == ["--steps=9", "--eps=0.3"]
    assert config.parse(Outer, config.to_argv(changed, base=preset), base=preset) == changed
