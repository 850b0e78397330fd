"""The engine half of benchmarks/accelerator.py: the project's own Sampler and
InferenceEngine on random weights of a real config's shape.

Three views of one decode, every slot busy (prompts of `prompt_len` random ids, exactly
`new_tokens` sampled each at temperature 1, no stop):
- device-bound: `Sampler.decode_loop`, K steps fed back on the device per call;
- one token a call: `Sampler.step`, as an engine with decode_steps 1 calls it (a host
  round trip every token);
- end to end: rollout.engine.InferenceEngine over `slots` concurrent sequences, prefill
  and every host step included.
Each against the HBM-bandwidth bound of a decode step computed from the shapes: every
weight once plus the KV cache, (a) all of it (slots x cache length, as a static cache is
laid out) and (b) only the filled part (mean over the decode of the positions written).
"""

from __future__ import annotations

import dataclasses
import gc
import time

import jax
import jax.numpy as jnp
import numpy as np
from _accelerator_learner import model_config
from _real_model_engine import generate_all

from core.policy.model.transformer import init_model, split_params
from core.policy.sampling.sampler import Sampler
from rollout.engine import InferenceEngine


@dataclasses.dataclass(frozen=True)
class EngineCase:
    model: str
    slots: int
    prompt_len: int = 64
    new_tokens: int = 128
    dtype: str = "bfloat16"
    decode_steps: int = 16  # K of the engine run (end to end); 1: a host round trip every token
    prefill: int = 64
    prefill_slots: int = 64

    @property
    def label(self) -> str:
        return f"{self.model} {self.dtype}, {self.slots} slots, K {self.decode_steps}"


def bounds(cfg, case: EngineCase, weight_bytes: int, bandwidth: float) -> dict:
    """Seconds a decode step needs at `bandwidth` bytes/s, and the tok/s that allows."""
    itemsize = jnp.dtype(case.dtype).itemsize
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * itemsize  # K and V, every layer
    length = case.prompt_len + case.new_tokens
    full = (weight_bytes + case.slots * length * per_token) / bandwidth
    filled_positions = np.arange(case.prompt_len + 1, length + 1).mean()
    filled = (weight_bytes + case.slots * filled_positions * per_token) / bandwidth
    return {
        "kv_bytes": case.slots * length * per_token,
        "bound_full_step_s": full,
        "bound_full_tokens_per_s": case.slots / full,
        "bound_filled_step_s": filled,
        "bound_filled_tokens_per_s": case.slots / filled,
    }


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run(case: EngineCase, vendor_bandwidth: float, measured_bandwidth: float | None, loop_steps: int = 32) -> dict:
    cfg = model_config(case.model)
    dtype = jnp.dtype(case.dtype)
    _, params = split_params(init_model(cfg, 0))
    params = jax.device_put(jax.tree.map(lambda x: x.astype(dtype), params))
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    length = case.prompt_len + case.new_tokens
    out = {"case": dataclasses.asdict(case), "label": case.label, "weight_bytes": weight_bytes}
    out.update(bounds(cfg, case, weight_bytes, vendor_bandwidth))
    if measured_bandwidth:
        out["bound_measured_tokens_per_s"] = bounds(cfg, case, weight_bytes, measured_bandwidth)[
            "bound_full_tokens_per_s"
        ]
    s = case.slots
    sampler = Sampler(
        cfg, slots=s, length=length, prefill=case.prefill, prefill_slots=case.prefill_slots, dtype=dtype,
        decode_steps=case.decode_steps,
    )  # fmt: skip
    t0 = time.perf_counter()
    sampler.warmup(params)
    out["warmup_s"] = time.perf_counter() - t0
    placed = sampler.place(params)
    tokens, start = np.zeros(s, np.int32), np.full(s, case.prompt_len, np.int32)

    # Device-bound: K steps a call from the prompt's end (the cache holds junk there: the
    # work per step is the same).
    def loop():
        sampler.decode_loop(placed, tokens, start, np.full(s, loop_steps, np.int32), steps=loop_steps)

    t0 = time.perf_counter()
    loop()  # its compile (a K the warm-up may not have used)
    out["loop_compile_s"] = time.perf_counter() - t0
    out["loop_step_s"] = _median_s(loop, 5) / loop_steps
    out["loop_tokens_per_s"] = s / out["loop_step_s"]

    # One token a call, as decode_steps 1 runs it: a host round trip and a sync every token.
    ones = np.ones(s, np.int32)
    sampler.step(placed, tokens[:, None], start, ones)
    out["call_step_s"] = _median_s(lambda: sampler.step(placed, tokens[:, None], start, ones), 20)
    out["call_tokens_per_s"] = s / out["call_step_s"]

    # End to end: the engine over `slots` sequences, prefill included.
    rng = np.random.default_rng(0)
    prompts = rng.integers(100, cfg.vocab_size, (s, case.prompt_len))
    engine = InferenceEngine(sampler, lambda: (placed, 0))
    wall = generate_all(engine, prompts, case.new_tokens)
    out.update(
        engine_wall_s=wall,
        engine_tokens_per_s=s * case.new_tokens / wall,
        engine_stats=dict(engine.stats),
        compiled_variants=sampler.compiled_variants(),
    )
    for view in ("loop", "call", "engine"):
        out[f"{view}_of_full_bound"] = out[f"{view}_tokens_per_s"] / out["bound_full_tokens_per_s"]
        out[f"{view}_of_filled_bound"] = out[f"{view}_tokens_per_s"] / out["bound_filled_tokens_per_s"]
    return out


def run_and_free(case: EngineCase, vendor_bandwidth: float, measured_bandwidth: float | None) -> dict:
    """`run`, then its sampler, cache and params are released before the next case."""
    out = run(case, vendor_bandwidth, measured_bandwidth)
    gc.collect()
    jax.clear_caches()
    return out
