"""LatencyModel: spec parsing, validation, determinism, distribution shape."""

import random
import statistics

import pytest

from environments import latency
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


def test_a_file_spec_follows_the_file_and_keeps_the_last_good_one(tmp_path, monkeypatch):
    path = tmp_path / "latency"
    path.write_text("fixed:0.5\n")
    model = LatencyModel.from_spec(f"file:{path}")
    assert model.kind == "file" and model.to_spec() == f"file:{path}"
    now = [0.0]
    sampler = latency.FileLatencySampler(model, random.Random(0), clock=lambda: now[0])
    assert sampler.sample() == 0.5
    path.write_text("fixed:2")
    assert sampler.sample() == 0.5  # read again only once a second has passed
    now[0] = 1.0
    assert sampler.sample() == 2.0
    path.write_text("fixed:-1")  # not a spec: the last good one stays, counted
    bad = latency.FileLatencySampler.bad_reads
    now[0] = 2.0
    assert sampler.sample() == 2.0 and latency.FileLatencySampler.bad_reads == bad + 1
    path.write_text("uniform:1:3")
    now[0] = 3.0
    assert 1.0 <= sampler.sample() <= 3.0
    assert isinstance(model.sampler(stream=7), latency.FileLatencySampler)


def test_a_file_spec_is_refused_at_start_when_the_file_is_missing_or_not_a_spec(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        LatencyModel.from_spec(f"file:{tmp_path / 'none'}")
    (tmp_path / "loop").write_text(f"file:{tmp_path / 'loop'}")
    with pytest.raises(ValueError, match="names another file"):
        LatencyModel.from_spec(f"file:{tmp_path / 'loop'}")
    (tmp_path / "junk").write_text("soon")
    with pytest.raises(ValueError, match="bad latency spec"):
        LatencyModel.from_spec(f"file:{tmp_path / 'junk'}")
    with pytest.raises(ValueError, match="file:PATH"):
        LatencyModel.from_spec("file:")
