"""`knob`'s declared checks (core/config_checks.py): the type, the choices, the bounds and a
pattern, enforced however the config is built (a direct call, `dataclasses.replace`,
`config.build`, flags), each refusal naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from core import config, config_table
from core.config import configclass, knob


@configclass
class Sample:
    n: int = knob(3, "a count", ge=1)
    share: float = knob(0.5, "a share", gt=0, le=1)
    mode: str = knob("a", "a mode", choices=("a", "b"))
    sizes: tuple[int, ...] = knob((1, 2), "sizes", ge=1)
    limit: int | None = knob(None, "unset: none", ge=0)
    name: str = knob("x-1", "a name", matches=(r"[a-z]+-[0-9]", "like x-1"))

    def __post_init__(self):  # a cross-field rule: it runs after the declared checks
        if self.n > 10 * len(self.sizes):
            raise ValueError("n must be at most 10 per size")


BAD = [
    ({"n": 0}, "n must be >= 1, got 0"),
    ({"n": True}, "n must be an int, got True"),
    ({"n": 2.0}, "n must be an int, got 2.0"),
    ({"share": 0.0}, "share must be > 0, got 0.0"),
    ({"share": float("nan")}, "share must be a finite number, got nan"),
    ({"share": 1.5}, "share must be <= 1, got 1.5"),
    ({"mode": "c"}, "mode must be one of ['a', 'b'], got 'c'"),
    ({"sizes": (1, 0)}, "sizes must be >= 1, got (1, 0)"),
    ({"sizes": [1]}, "sizes must be a tuple, got [1]"),
    ({"limit": -1}, "limit must be >= 0, got -1"),
    ({"name": "X1"}, "name must be like x-1, got 'X1'"),
    ({"mode": None}, "mode must be set, got None"),
    ({"n": 30}, "n must be at most 10 per size"),
]


@pytest.mark.parametrize("change, message", BAD, ids=[m for _, m in BAD])
def test_every_construction_path_refuses_naming_the_field(change, message):
    paths = [
        lambda: Sample(**change),
        lambda: dataclasses.replace(Sample(), **change),
        lambda: config.build(Sample, **change),
    ]
    for build in paths:
        with pytest.raises(ValueError) as refused:
            build()
        assert str(refused.value) == message


def test_good_values_pass_and_flags_parse_to_the_same_tree():
    cfg = Sample(n=4, share=1, mode="b", sizes=(3,), limit=0, name="ab-7")
    assert config.parse(Sample, config.to_argv(cfg)) == cfg
    with pytest.raises(SystemExit):  # argparse's refusal, from the same check
        config.parse(Sample, ["--n=0"])


def test_the_docs_say_the_bounds():
    table = config_table.markdown_table(Sample, "Sample", "sample")
    assert "| `--n` | int, >= 1 |" in table and "| `--share` | float, > 0, <= 1 |" in table


def test_every_config_class_checks_its_knobs():
    """A class that declares knobs without @configclass would skip their checks on every
    path but argparse's choices: found by reading the source, so none can be forgotten."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    unchecked = []
    for package in ("core", "trainer", "rollout", "pipelines", "localstack", "agentic_rl", "benchmarks"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                knobs = [
                    s
                    for s in node.body
                    if isinstance(s, ast.AnnAssign)
                    and isinstance(s.value, ast.Call)
                    and getattr(s.value.func, "id", None) in ("knob", "derived")
                ]
                decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
                if knobs and not decorators & {"configclass", "config.configclass"}:
                    unchecked.append(f"{path.relative_to(root)}:{node.name}")
    assert unchecked == []
