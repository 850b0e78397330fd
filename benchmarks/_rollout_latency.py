"""Section 1 of benchmarks/rollout.py: latency hiding with C episodes in flight on one
InferenceEngine, and the cProfile of the largest configuration."""

from __future__ import annotations

import asyncio
import cProfile
import io
import os
import pstats
import random
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rollout/, not rollout.py

from _envs import ScriptedConfig, ScriptedToolEnv
from _report import fmt, print_table
from _rollout_decode import Samplers, never

import environments
from core.policy.sampling.sampler import Sampler
from core.policy.text import tokenizer
from rollout.engine import InferenceEngine, Sequence


# ----------------------------------------------------------------------------- 1. latency
async def scripted_episode(engine: InferenceEngine, cfg: ScriptedConfig, task, max_new: int) -> dict:
    env = ScriptedToolEnv(cfg)
    t0 = time.perf_counter()
    seq = Sequence.start([tokenizer.BOS] + tokenizer.encode(await env.reset(task)))
    gen_s, generated = 0.0, 0
    try:
        while True:
            start = len(seq.tokens)
            g = time.perf_counter()
            generated += await engine.generate(seq, max_new, never)
            gen_s += time.perf_counter() - g
            result = await env.step(tokenizer.decode(seq.tokens[start:]))
            if result.done:
                break
            seq.extend_env(tokenizer.encode(result.observation))
    finally:
        engine.release(seq)
    return {"start": t0, "end": time.perf_counter(), "gen_s": gen_s, "wait_s": env.waited_s, "generated": generated}


def _snapshot(engine: InferenceEngine) -> dict:
    t = engine.sampler.timer
    return {
        **engine.stats,
        "jit_s": t["s"],
        "jit_calls": t["calls"],
        "dec_s": t["decode_s"],
        "dec_calls": t["decode_calls"],
        "t": time.perf_counter(),
    }


def run_continuous(
    sampler: Sampler,
    params,
    C: int,
    cfg: ScriptedConfig,
    max_new: int,
    warm_s: float,
    window_s: float,
    stagger_s: float,
    seed: int = 0,
) -> dict:
    """Keeps C episodes in flight; counts episodes that end inside [warm_s, warm_s + window_s]."""
    engine = InferenceEngine(sampler, lambda: (params, 0))
    tasks = environments.generate_tasks(seed, 64, "train")
    done: list[dict] = []
    snaps: list[dict] = []

    async def worker(i):
        rng = random.Random(seed * 1000 + i)
        await asyncio.sleep(rng.uniform(0, stagger_s))
        k = 0
        while True:
            ep = await scripted_episode(engine, cfg, tasks[(i + k) % len(tasks)], max_new)
            done.append({**ep, "worker": i})
            k += 1

    async def main():
        t0 = time.perf_counter()
        workers = [asyncio.create_task(worker(i)) for i in range(C)]
        await asyncio.sleep(warm_s)
        snaps.append(_snapshot(engine))
        await asyncio.sleep(t0 + warm_s + window_s - time.perf_counter())
        snaps.append(_snapshot(engine))
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    asyncio.run(main())
    a, b = snaps
    window = b["t"] - a["t"]
    eps = [e for e in done if a["t"] <= e["end"] <= b["t"]]
    # Throughput per worker from its back-to-back completions inside the window:
    # (k - 1) / (last end - first end); summed over workers. Unbiased even when
    # completions come in waves, and exact for C = 1 (a window count is off by up to 1).
    ends: dict[int, list[float]] = {}
    for e in eps:
        ends.setdefault(e["worker"], []).append(e["end"])
    rate = sum((len(v) - 1) / (max(v) - min(v)) for v in ends.values() if len(v) >= 2)
    short = C - sum(len(v) >= 2 for v in ends.values())  # workers with < 2 completions: not counted
    d = {
        k: b[k] - a[k]
        for k in (
            "steps",
            "prefill_steps",
            "generated_tokens",
            "fed_tokens",
            "refeeds",
            "busy_s",
            "jit_s",
            "jit_calls",
            "dec_s",
            "dec_calls",
        )
    }
    return {
        "C": C,
        "slots": sampler.slots,
        "episodes": len(eps),
        "window_s": window,
        "eps_per_s": rate,
        "eps_counted": len(eps) / window,
        "short_workers": short,
        "latency_s": statistics.fmean(e["end"] - e["start"] for e in eps) if eps else None,
        "gen_s": statistics.fmean(e["gen_s"] for e in eps) if eps else None,
        "wait_s": statistics.fmean(e["wait_s"] for e in eps) if eps else None,
        "generated_per_ep": statistics.fmean(e["generated"] for e in eps) if eps else None,
        "step_ms": d["busy_s"] / d["steps"] * 1000 if d["steps"] else None,
        "jit_ms": d["jit_s"] / d["jit_calls"] * 1000 if d["jit_calls"] else None,
        "dec_ms": d["dec_s"] / d["dec_calls"] * 1000 if d["dec_calls"] else None,
        "pre_ms": (d["jit_s"] - d["dec_s"]) / (d["jit_calls"] - d["dec_calls"]) * 1000
        if d["jit_calls"] > d["dec_calls"]
        else None,
        "prefill_share": (d["jit_s"] - d["dec_s"]) / d["jit_s"] if d["jit_s"] else None,
        "gap_ms": window / d["steps"] * 1000 if d["steps"] else None,
        "decode_steps": d["steps"] - d["prefill_steps"],
        "prefill_steps": d["prefill_steps"],
        "refeeds": d["refeeds"],
        "busy": d["busy_s"] / window,
        "jit_busy": d["jit_s"] / window,
        "tokens_per_s": d["generated_tokens"] / window,
        "tokens_per_step": d["generated_tokens"] / max(1, d["steps"]),
    }


def bench_latency(samplers: Samplers, args, caps: dict[int, float]) -> dict:
    cfg = ScriptedConfig(tool_latency_s=args.tool_latency_s, steps=args.env_steps)
    gen_per_ep = args.env_steps * args.tokens_per_turn
    params = samplers.params
    results = []
    L1 = None
    for C, slots in args.latency_pairs:
        r = run_continuous(
            samplers.get(slots),
            params,
            C,
            cfg,
            args.tokens_per_turn,
            warm_s=args.warm_s,
            window_s=args.window_s,
            stagger_s=args.tool_latency_s,
        )
        if C == 1 and slots == 1:
            L1 = r["latency_s"]
        results.append(r)
    rows = []
    for r in results:
        by_latency = r["C"] / L1 if L1 else None
        cap = caps.get(r["slots"], float("inf")) / gen_per_ep
        ideal = min(by_latency, cap) if by_latency else cap
        r.update(ideal=ideal, ratio=r["eps_per_s"] / ideal, cap=cap)
        rows.append(
            [
                r["C"],
                r["slots"],
                r["episodes"],
                r["eps_counted"],
                r["eps_per_s"],
                ideal,
                cap,
                f"{r['ratio']:.0%}",
                r["latency_s"],
                r["gen_s"],
                r["step_ms"],
                r["jit_ms"],
                r["dec_ms"],
                r["pre_ms"],
                f"{r['prefill_share']:.0%}",
                r["gap_ms"],
                r["decode_steps"],
                r["prefill_steps"],
                r["refeeds"],
                f"{r['busy']:.0%}",
                r["tokens_per_step"],
            ]
        )
    print_table(
        f"1. Latency hiding: scripted env, {args.env_steps} steps x {args.tool_latency_s:g} s tool wait, "
        f"{args.tokens_per_turn} tokens per turn ({gen_per_ep} per episode), {args.window_s:g} s window "
        f"after {args.warm_s:g} s warm-up",
        [
            "C",
            "slots",
            "episodes",
            "count/window",
            "eps/s",
            "ideal eps/s",
            "decode cap",
            "measured/ideal",
            "ep latency s",
            "gen s/ep",
            "step ms",
            "jit ms",
            "jit decode ms",
            "jit prefill ms",
            "prefill share",
            "wall ms/step",
            "decode steps",
            "prefill steps",
            "refeeds",
            "engine busy",
            "tokens/step",
        ],
        rows,
        f"L1 (C=1 latency) = {fmt(L1)} s; ideal = min(C / L1, decode cap); decode cap = section-2 tok/s at "
        f"S=slots / {gen_per_ep}. step ms = InferenceEngine._step; jit ms = Sampler.step inside it (all steps, then "
        f"width-1 decode and width-16 prefill steps apart; prefill share = prefill jit time / all jit time); "
        f"wall ms/step "
        f"= window / steps; engine busy = time inside _step / window. eps/s = sum over the C episode loops of "
        f"(completions - 1) / (last - first completion time) in the window; count/window = completions / window.",
    )
    short = sum(r["short_workers"] for r in results)
    if short:
        print(
            f"warning: {short} episode loops had < 2 completions in their window and were not counted: "
            f"use a longer --window_s"
        )
    return {"results": results, "L1": L1}


def profile_c64(samplers: Samplers, args, C: int, slots: int) -> str:
    cfg = ScriptedConfig(tool_latency_s=args.tool_latency_s, steps=args.env_steps)
    prof = cProfile.Profile()
    prof.enable()
    r = run_continuous(
        samplers.get(slots),
        samplers.params,
        C,
        cfg,
        args.tokens_per_turn,
        warm_s=args.warm_s,
        window_s=args.profile_s,
        stagger_s=args.tool_latency_s,
    )
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(args.profile_top)
    st.sort_stats("cumulative").print_stats(args.profile_top)
    text = out.getvalue()
    header = (
        f"cProfile of C={C}, slots={slots} ({args.warm_s:g} s warm-up + {args.profile_s:g} s window, "
        f"{r['eps_per_s']:.3g} eps/s under the profiler)"
    )
    print(header)
    print(_trim_pstats(text))
    return text


def _trim_pstats(text: str) -> str:
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("Ordered by", "List reduced")):
            continue
        keep.append(
            line.replace(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/", "").replace(
                sys.prefix, "<venv>"
            )
        )
    return "\n".join(keep)
