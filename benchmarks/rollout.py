"""Rollout-side benchmarks: latency hiding, decode throughput, packing fill, flush latency.

    python benchmarks/rollout.py            # everything (~6-8 min on 2 cores)
    python benchmarks/rollout.py --quick    # a short run of everything (~2-3 min)
    python benchmarks/rollout.py --sections decode,latency

Sections (tiny model: trainer.policy.config.ModelConfig() defaults, random init, JAX on CPU):

1. latency: a scripted environment (benchmarks/_envs.py) whose every step waits
   --tool_latency_s and that is done after --env_steps steps; every model turn generates
   exactly --tokens_per_turn tokens (a stop that never fires). C episodes are kept in
   flight on one InferenceEngine (when one ends another starts) and episodes/s is counted
   over a steady-state window. ideal = min(C / L1, decode cap), where L1 is the mean
   episode latency at C=1 and decode cap = engine tokens/s with all slots busy (section
   2, same slot count) / generated tokens per episode.
2. decode: engine generated tokens/s with all S slots busy (no tool waits) against a naive
   loop decoding one episode at a time on a 1-slot Sampler, one token per call, same tokens.
3. packing: fill (non-pad tokens / all tokens of emitted records) of the streaming packer
   logic (pipelines.packing.take_full_records per arrival, pack on a max-wait or final
   flush, as PackRecordsFn does) on lengths of real oracle transcripts (calculator, code,
   guess tasks through the real environments).
4. flush: trajectory finished -> record published latency of the real PackTrajectoryGroups
   on the streaming BundleBasedDirectRunner, reading groups from the Pub/Sub emulator
   (benchmarks/_packer_pipeline.py), percentiles per trajectory.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
from _envs import ScriptedConfig, ScriptedToolEnv
from _report import fmt, loadavg, machine_info, print_table
from _rollout_packing import bench_flush, bench_packing, length_pools, sample_stream

import environments
from pipelines.engine import InferenceEngine, Sequence
from trainer.policy import tokenizer
from trainer.policy.config import ModelConfig
from trainer.policy.model import init_model, split_params
from trainer.policy.sampling import Sampler

SECTIONS = ("decode", "latency", "packing", "flush")
LENGTH = 256  # sampler KV length = the model's max_seq_len


def never(_generated) -> bool:
    return False


# ----------------------------------------------------------------------------- output
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
    for C, slots in args.latency_configs:
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


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short windows and fewer tokens (~2-3 min)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--tool_latency_s", type=float, default=1.0)
    p.add_argument("--env_steps", type=int, default=3, help="env steps per episode (2 tool turns + a final answer)")
    p.add_argument("--tokens_per_turn", type=int, default=16)
    p.add_argument("--latency_configs", default="1:1,8:8,32:32,64:64,64:32", help="C:slots pairs; C=1:slots=1 gives L1")
    p.add_argument("--window_s", type=float, default=None, help="steady-state window per config (default 30, quick 8)")
    p.add_argument("--warm_s", type=float, default=None, help="warm-up before the window (default 4.5, quick 3.5)")
    p.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cProfile one more C=64 run (latency section)",
    )
    p.add_argument("--profile_s", type=float, default=None, help="profiled window (default 10, quick 5)")
    p.add_argument("--profile_top", type=int, default=15)
    p.add_argument("--decode_slots", default="1,8,32,64")
    p.add_argument("--decode_tokens", type=int, default=None, help="new tokens per slot (default 200, quick 64)")
    p.add_argument("--packing_tasks", type=int, default=None, help="oracle transcripts per env (default 60, quick 20)")
    p.add_argument("--packing_n", type=int, default=None, help="trajectories per mix (default 2000, quick 400)")
    p.add_argument("--traj_rate", type=float, default=20.0, help="arrival rate for the packing simulation")
    p.add_argument("--max_wait_s", type=float, default=2.0, help="packer max wait (section 4; the pipeline default)")
    p.add_argument("--pack_waits", default="2,10", help="max waits simulated in section 3")
    p.add_argument("--flush_rates", default="4,20", help="trajectories/s published, one phase each")
    p.add_argument("--flush_phase_s", type=float, default=None, help="seconds per rate (default 30, quick 10)")
    p.add_argument("--flush_rows", type=int, default=4)
    p.add_argument("--flush_segments", type=int, default=2)
    a = p.parse_args(argv)
    q = a.quick
    defaults = {
        "window_s": (30.0, 8.0),
        "warm_s": (4.5, 3.5),
        "profile_s": (10.0, 5.0),
        "decode_tokens": (200, 64),
        "packing_tasks": (60, 20),
        "packing_n": (2000, 400),
        "flush_phase_s": (30.0, 10.0),
    }
    for k, (full, quick) in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, quick if q else full)
    a.sections = tuple(s.strip() for s in a.sections.split(",") if s.strip())
    bad = set(a.sections) - set(SECTIONS)
    if bad:
        p.error(f"unknown sections {sorted(bad)}; known: {SECTIONS}")
    a.latency_configs = [tuple(int(x) for x in c.split(":")) for c in a.latency_configs.split(",")]
    for C, S in a.latency_configs:
        if C < 1 or S < 1:
            p.error(f"bad C:slots {C}:{S}")
    a.decode_slots = [int(x) for x in a.decode_slots.split(",")]
    a.flush_rates = [float(x) for x in a.flush_rates.split(",")]
    a.pack_waits = [float(x) for x in a.pack_waits.split(",")]
    if a.tokens_per_turn * a.env_steps + 64 > LENGTH:
        p.error("episodes would not fit the 256-token sampler")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    info = machine_info()
    print(f"benchmarks/rollout.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(
        f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
        + "; ".join(f"{k} {v}" for k, v in info.items())
        + f"; load average at start {loadavg()}\n",
        flush=True,
    )
    need_model = {"decode", "latency"} & set(args.sections)
    samplers = None
    if need_model:
        cfg = ModelConfig()
        _, params = split_params(init_model(cfg))
        samplers = Samplers(cfg, params)
    caps: dict[int, float] = {}
    if "decode" in args.sections:
        caps = bench_decode(samplers, args.decode_slots, args.decode_tokens)
    if "latency" in args.sections:
        missing = sorted({s for _, s in args.latency_configs} - set(caps))
        if missing:
            caps.update(decode_caps(samplers, missing, args.decode_tokens))
        bench_latency(samplers, args, caps)
        if args.profile:
            C, S = max(args.latency_configs, key=lambda cs: (cs[0], cs[1]))
            profile_c64(samplers, args, C, S)
    if {"packing", "flush"} & set(args.sections):
        pools = length_pools(args.packing_tasks)
        if "packing" in args.sections:
            bench_packing(args, pools)
        if "flush" in args.sections:
            bench_flush(args, sample_stream(pools, ("calculator", "code"), 4000, 4, seed=2, max_len=LENGTH))
    print(f"total {time.perf_counter() - t0:.0f} s; load average at end {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
