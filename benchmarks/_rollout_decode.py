"""Section 2 of benchmarks/rollout.py (decode throughput) and the timed Samplers that
sections 1 and 2 share."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rollout/, not rollout.py

import numpy as np
from _report import print_table

from core.policy.model.config import ModelConfig
from core.policy.sampling.sampler import Sampler
from core.policy.text import tokenizer
from rollout.engine import InferenceEngine, Sequence

LENGTH = 256  # sampler KV length = the model's max_seq_len


def never(_generated) -> bool:
    return False


# ----------------------------------------------------------------------------- samplers
class Samplers:
    """One compiled Sampler per slot count, shared by the sections; sampler.step is
    wrapped to time the jitted call (dispatch + compute + device->host)."""

    def __init__(self, cfg: ModelConfig, params):
        self.cfg, self.params, self._by_slots = cfg, params, {}

    def get(self, slots: int) -> Sampler:
        if slots not in self._by_slots:
            s = Sampler(self.cfg, slots=slots, length=LENGTH)
            s.warmup(self.params)
            s.timer = {"calls": 0, "s": 0.0, "decode_calls": 0, "decode_s": 0.0}
            orig = s.step

            def timed(params, tokens, *a, _orig=orig, _t=s.timer, **k):
                t0 = time.perf_counter()
                try:
                    return _orig(params, tokens, *a, **k)
                finally:
                    dt = time.perf_counter() - t0
                    _t["calls"] += 1
                    _t["s"] += dt
                    if np.ndim(tokens) == 1 or np.shape(tokens)[1] == 1:
                        _t["decode_calls"] += 1
                        _t["decode_s"] += dt

            s.step = timed
            self._by_slots[slots] = s
        return self._by_slots[slots]


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [tokenizer.BOS] + [rng.randrange(32, 127) for _ in range(n)]


# ----------------------------------------------------------------------------- 2. decode
def engine_throughput(sampler: Sampler, params, new_tokens: int) -> dict:
    """All slots busy: S sequences of 8 prompt tokens, each generating new_tokens."""
    engine = InferenceEngine(sampler, lambda: (params, 0))

    async def one(i):
        seq = Sequence.start(_prompt(8, i))
        await engine.generate(seq, new_tokens, never)
        engine.release(seq)

    async def all_slots():
        await asyncio.gather(*(one(i) for i in range(sampler.slots)))

    t0 = time.perf_counter()
    asyncio.run(all_slots())
    wall = time.perf_counter() - t0
    return {
        "tokens": engine.stats["generated_tokens"],
        "wall": wall,
        "steps": engine.stats["steps"],
        "step_ms": engine.stats["busy_s"] / engine.stats["steps"] * 1000,
    }


def naive_throughput(sampler1: Sampler, params, episodes: int, new_tokens: int) -> dict:
    """One episode at a time on a 1-slot Sampler, one token per call (prompt included)."""
    t0 = time.perf_counter()
    generated = 0
    for e in range(episodes):
        tokens, logps = _prompt(8, e), []
        for i, tok in enumerate(tokens):  # feed the prompt token by token
            nxt, lp = sampler1.step(params, np.array([[tok]], np.int32), np.array([i]), np.array([1]))
        for k in range(new_tokens):
            tokens.append(int(nxt[0]))
            logps.append(float(lp[0]))
            generated += 1
            if k + 1 < new_tokens:
                nxt, lp = sampler1.step(
                    params, np.array([[tokens[-1]]], np.int32), np.array([len(tokens) - 1]), np.array([1])
                )
    return {"tokens": generated, "wall": time.perf_counter() - t0}


def bench_decode(samplers: Samplers, slot_counts, new_tokens: int) -> dict[int, float]:
    params = samplers.params
    s1 = samplers.get(1)
    engine_throughput(s1, params, 8)  # first asyncio/engine use: not timed
    rows, tok_s = [], {}
    for S in slot_counts:
        sampler = samplers.get(S)
        eng = engine_throughput(sampler, params, new_tokens)
        naive = naive_throughput(s1, params, S, new_tokens)
        assert eng["tokens"] == naive["tokens"] == S * new_tokens, (eng, naive)
        e_tps, n_tps = eng["tokens"] / eng["wall"], naive["tokens"] / naive["wall"]
        tok_s[S] = e_tps
        rows.append([S, eng["tokens"], e_tps, eng["step_ms"], eng["wall"], n_tps, naive["wall"], e_tps / n_tps])
    print_table(
        f"2. Decode throughput: all S slots busy, {new_tokens} new tokens per slot, no tool waits",
        ["S", "tokens", "engine tok/s", "engine step ms", "engine wall s", "naive tok/s", "naive wall s", "speed-up"],
        rows,
        "naive = 1-slot Sampler, one episode at a time, one token per call (prompt fed token by token).",
    )
    return tok_s


def decode_caps(samplers: Samplers, slot_counts, new_tokens: int) -> dict[int, float]:
    """tokens/s at full batch without the naive baseline (when section 2 is skipped)."""
    out = {}
    for S in slot_counts:
        r = engine_throughput(samplers.get(S), samplers.params, new_tokens)
        out[S] = r["tokens"] / r["wall"]
    return out
