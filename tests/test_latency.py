"""LatencyModel: spec parsing, validation, determinism, distribution shape."""

import statistics

import pytest

from environments.latency import LatencyModel


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("none", LatencyModel()),
        (" NONE ", LatencyModel()),
        ("fixed:0.5", LatencyModel(kind="fixed", seconds=0.5)),
        ("fixed:0", LatencyModel(kind="fixed", seconds=0.0)),
        ("uniform:0.1:0.3", LatencyModel(kind="uniform", low=0.1, high=0.3)),
        ("lognormal:0.2:0.5", LatencyModel(kind="lognormal", median=0.2, sigma=0.5)),
    ],
)
def test_from_spec(spec, expected):
    model = LatencyModel.from_spec(spec)
    assert model == expected
    assert LatencyModel.from_spec(model.to_spec()) == model


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "slow",
        "fixed",
        "fixed:",
        "fixed:abc",
        "fixed:-1",
        "fixed:nan",
        "fixed:inf",
        "fixed:1:2",
        "none:1",
        "uniform:0.3",
        "uniform:0.3:0.1",
        "lognormal:0:0.5",
        "lognormal:0.2:-1",
        "lognormal:0.2",
    ],
)
def test_bad_specs_raise_value_error(spec):
    with pytest.raises(ValueError, match=r"latency|LatencyModel"):
        LatencyModel.from_spec(spec)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "gamma"},
        {"kind": "fixed", "seconds": -0.1},
        {"kind": "fixed", "seconds": "1"},
        {"kind": "uniform", "low": 2.0, "high": 1.0},
        {"kind": "lognormal", "median": 0.0},
        {"seed": 1.5},
        {"seed": True},
        {"kind": "fixed", "seconds": float("nan")},
    ],
)
def test_constructor_validates(kwargs):
    with pytest.raises(ValueError):
        LatencyModel(**kwargs)


def _draw(model, n=200, stream=0):
    s = model.sampler(stream)
    return [s.sample() for _ in range(n)]


def test_deterministic_by_seed_and_stream():
    m = LatencyModel.from_spec("lognormal:0.2:0.5", seed=3)
    assert _draw(m) == _draw(m)
    assert _draw(m) != _draw(LatencyModel.from_spec("lognormal:0.2:0.5", seed=4))
    assert _draw(m, stream="task-a") == _draw(m, stream="task-a")
    assert _draw(m, stream="task-a") != _draw(m, stream="task-b")


def test_none_fixed_uniform_values():
    assert set(_draw(LatencyModel())) == {0.0}
    assert set(_draw(LatencyModel.from_spec("fixed:0.25"))) == {0.25}
    xs = _draw(LatencyModel.from_spec("uniform:0.1:0.3"), n=2000)
    assert min(xs) >= 0.1 and max(xs) <= 0.3
    assert statistics.mean(xs) == pytest.approx(0.2, abs=0.01)


def test_lognormal_median_and_tail():
    xs = _draw(LatencyModel.from_spec("lognormal:0.2:0.5", seed=0), n=5001)
    assert statistics.median(xs) == pytest.approx(0.2, rel=0.05)
    assert min(xs) > 0
    assert statistics.mean(xs) > statistics.median(xs)  # right-skewed: mean = m*exp(s^2/2)
