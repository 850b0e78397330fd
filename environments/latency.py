"""Injected environment latency: a declared distribution, sampled deterministically.

Real tools (code execution, web pages) make the agent wait; the point of the decoupled
design is to keep the accelerator busy meanwhile. `LatencyModel` simulates that wait so
the effect can be measured locally. Specs are short strings for command-line flags:

    none                        no wait
    fixed:SECONDS               always SECONDS
    uniform:LOW:HIGH            uniform in [LOW, HIGH]
    lognormal:MEDIAN:SIGMA      MEDIAN * exp(SIGMA * N(0, 1)) (heavy right tail)
    file:PATH                   the spec written in the file PATH, read again at most once a
                                second: a world that changes while the run goes on (the lag
                                controller's benchmark changes its tools' latency mid-run)

A file whose text is not a spec keeps the last good one (counted in `bad_reads`); a file
missing at the start is refused, as any bad spec is.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path

from environments.fields import bounded, check_fields

KINDS = ("none", "fixed", "uniform", "lognormal", "file")
_SPEC_PARAMS = {"none": (), "fixed": ("seconds",), "uniform": ("low", "high"), "lognormal": ("median", "sigma")}
REREAD_S = 1.0


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    kind: str = bounded("none", choices=KINDS)
    seconds: float = bounded(0.0, ge=0, finite=True)
    low: float = bounded(0.0, ge=0, finite=True)
    high: float = bounded(0.0, ge=0, finite=True)
    median: float = bounded(0.0, ge=0, finite=True)
    sigma: float = bounded(0.0, ge=0, finite=True)
    path: str = ""  # kind "file": where the current spec is written
    seed: int = 0

    def __post_init__(self) -> None:
        check_fields(self)
        if self.kind == "file":
            _read_spec(self.path, self.seed)  # refused now if missing or not a spec
        if self.kind == "uniform" and self.low > self.high:
            raise ValueError(f"uniform latency needs low <= high, got {self.low} > {self.high}")
        if self.kind == "lognormal" and self.median <= 0:
            raise ValueError(f"lognormal latency needs median > 0, got {self.median}")

    @classmethod
    def from_spec(cls, spec: str, seed: int = 0) -> LatencyModel:
        if not isinstance(spec, str):
            raise ValueError(f"latency spec must be a string, got {type(spec).__name__}")
        kind, *parts = spec.strip().split(":")
        kind = kind.strip().lower()
        if kind == "file":
            path = spec.strip().partition(":")[2]
            if not path:
                raise ValueError(f"bad latency spec {spec!r}: expected 'file:PATH'")
            return cls(kind="file", path=path, seed=seed)
        if kind not in _SPEC_PARAMS:
            raise ValueError(f"bad latency spec {spec!r}: kind must be one of {KINDS}")
        names = _SPEC_PARAMS[kind]
        if len(parts) != len(names):
            want = ":".join([kind, *(n.upper() for n in names)])
            raise ValueError(f"bad latency spec {spec!r}: expected {want!r}")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"bad latency spec {spec!r}: parameters must be numbers") from None
        return cls(kind=kind, seed=seed, **dict(zip(names, values)))

    def to_spec(self) -> str:
        if self.kind == "file":
            return f"file:{self.path}"
        return ":".join([self.kind, *(repr(float(getattr(self, n))) for n in _SPEC_PARAMS[self.kind])])

    def sampler(self, stream: int | str = 0) -> LatencySampler:
        """A fresh sampler; the same (seed, stream) always yields the same sequence.

        `stream` lets each episode (e.g. keyed by task id) draw its own sequence, so
        concurrent episodes do not all wait in lockstep.
        """
        rng = random.Random(f"latency:{self.seed}:{stream}")
        return FileLatencySampler(self, rng) if self.kind == "file" else LatencySampler(self, rng)


def _read_spec(path: str, seed: int) -> LatencyModel:
    try:
        text = Path(path).read_text().strip()
    except OSError as e:
        raise ValueError(f"latency file {path!r} cannot be read: {e}") from None
    if text.lower().startswith("file"):
        raise ValueError(f"latency file {path!r} names another file ({text!r}): write a spec there")
    return LatencyModel.from_spec(text, seed)


class LatencySampler:
    def __init__(self, model: LatencyModel, rng: random.Random) -> None:
        self._m = model
        self._rng = rng

    def sample(self) -> float:
        m = self._m
        if m.kind == "none":
            return 0.0
        if m.kind == "fixed":
            return float(m.seconds)
        if m.kind == "uniform":
            return self._rng.uniform(m.low, m.high)
        return self._rng.lognormvariate(math.log(m.median), m.sigma)


class FileLatencySampler:
    """Samples the spec the file holds now; reads it again at most once a second."""

    bad_reads = 0  # across samplers: reads whose text was not a spec (the last good one kept)

    def __init__(self, model: LatencyModel, rng: random.Random, clock=time.monotonic) -> None:
        self._m, self._rng, self._clock = model, rng, clock
        self._current = _read_spec(model.path, model.seed)
        self._read_at = clock()

    def sample(self) -> float:
        now = self._clock()
        if now - self._read_at >= REREAD_S:
            self._read_at = now
            try:
                self._current = _read_spec(self._m.path, self._m.seed)
            except ValueError:
                FileLatencySampler.bad_reads += 1
        return LatencySampler(self._current, self._rng).sample()


def as_latency_model(value) -> LatencyModel:
    """A config's tool_latency: a LatencyModel, or a spec string so flags and JSON
    env_config can pass "fixed:0.2"."""
    if isinstance(value, str):
        return LatencyModel.from_spec(value)
    if not isinstance(value, LatencyModel):
        raise ValueError(f"tool_latency must be a LatencyModel or spec string, got {type(value).__name__}")
    return value
