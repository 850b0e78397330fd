"""environments/fields.py: a field's annotation and `bounded(...)` declare what it may be;
`check_fields` refuses anything else, naming Class.field, the rule and the value."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from environments.fields import bounded, check_fields


@dataclasses.dataclass(frozen=True)
class Demo:
    count: int = bounded(1, ge=1)
    share: float = bounded(0.0, ge=0, lt=1)
    wait: float = bounded(1.0, gt=0, finite=True)
    kind: str = bounded("a", choices=("a", "b"))
    flag: bool = False
    seed: int = 0  # no bounds: the annotation alone is checked
    note: str = "x"
    extra: object = None  # neither a simple type nor declared: never checked

    def __post_init__(self):
        check_fields(self)


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"count": 0}, "Demo.count must be an int >= 1, got 0"),
        ({"count": True}, "Demo.count must be an int >= 1, got True"),  # bool is no int here
        ({"count": 2.0}, "Demo.count must be an int >= 1, got 2.0"),
        ({"count": "3"}, "Demo.count must be an int >= 1, got '3'"),
        ({"share": 1}, "Demo.share must be a number in [0, 1), got 1"),
        ({"share": -0.1}, "Demo.share must be a number in [0, 1), got -0.1"),
        ({"share": math.nan}, "Demo.share must be a number in [0, 1), got nan"),
        ({"share": False}, "Demo.share must be a number in [0, 1), got False"),
        ({"wait": 0}, "Demo.wait must be a finite number > 0, got 0"),
        ({"wait": math.inf}, "Demo.wait must be a finite number > 0, got inf"),
        ({"wait": "1"}, "Demo.wait must be a finite number > 0, got '1'"),
        ({"kind": "c"}, "Demo.kind must be one of ['a', 'b'], got 'c'"),
        ({"kind": 1}, "Demo.kind must be one of ['a', 'b'], got 1"),
        ({"flag": "yes"}, "Demo.flag must be true or false, got 'yes'"),
        ({"flag": 1}, "Demo.flag must be true or false, got 1"),
        ({"seed": 1.5}, "Demo.seed must be an int, got 1.5"),
        ({"note": 5}, "Demo.note must be a str, got 5"),
    ],
)
def test_refused_with_the_field_the_rule_and_the_value(kw, says):
    with pytest.raises(ValueError) as e:
        Demo(**kw)
    assert str(e.value) == says


def test_valid_values_pass():
    assert Demo(count=7, share=0, wait=2, kind="b", flag=True, seed=-3, note="", extra=[1]).share == 0


@given(
    count=st.integers(-5, 5) | st.floats(allow_nan=True) | st.booleans(),
    share=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2, 2) | st.booleans(),
    wait=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2, 2),
    kind=st.sampled_from(["a", "b", "c", ""]) | st.integers(),
)
def test_refused_exactly_when_a_rule_is_broken(count, share, wait, kind):
    ok = (
        type(count) is int
        and count >= 1
        and not isinstance(share, bool)
        and 0 <= share < 1
        and math.isfinite(wait)
        and wait > 0
        and kind in ("a", "b")
    )
    if ok:
        Demo(count=count, share=share, wait=wait, kind=kind)
    else:
        with pytest.raises(ValueError, match=r"^Demo\.(count|share|wait|kind) must be "):
            Demo(count=count, share=share, wait=wait, kind=kind)


def test_a_rule_with_a_reason_says_it():
    @dataclasses.dataclass
    class Limits:
        memory: int = bounded(64, ge=64, why="the interpreter needs it")

        def __post_init__(self):
            check_fields(self)

    with pytest.raises(ValueError, match=r"^Limits\.memory must be an int >= 64 \(the interpreter needs it\), got 8$"):
        Limits(8)
    assert Limits(64).memory == 64
