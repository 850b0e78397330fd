"""Rollout-side benchmarks: latency hiding, decode throughput, packing fill, flush latency.

    python benchmarks/rollout.py            # everything (~6-8 min on 2 cores)
    python benchmarks/rollout.py --quick    # a short run of everything (~2-3 min)
    python benchmarks/rollout.py --sections decode,latency

Sections (tiny model: trainer.config.ModelConfig() defaults, random init, JAX on CPU):

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
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import fmt, loadavg, machine_info, print_table  # noqa: E402
import numpy as np
from _envs import ScriptedConfig, ScriptedToolEnv, oracle_lengths

import environments
from pipelines.engine import InferenceEngine, Sequence
from trainer import tokenizer
from trainer.config import ModelConfig, RecordShape
from trainer.model import init_model, split_params
from trainer.sampling import Sampler

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
    return {"tokens": engine.stats["generated_tokens"], "wall": wall, "steps": engine.stats["steps"],
            "step_ms": engine.stats["busy_s"] / engine.stats["steps"] * 1000}


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
                nxt, lp = sampler1.step(params, np.array([[tokens[-1]]], np.int32),
                                        np.array([len(tokens) - 1]), np.array([1]))
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
    print_table(f"2. Decode throughput: all S slots busy, {new_tokens} new tokens per slot, no tool waits",
                ["S", "tokens", "engine tok/s", "engine step ms", "engine wall s", "naive tok/s", "naive wall s",
                 "speed-up"], rows,
                "naive = 1-slot Sampler, one episode at a time, one token per call (prompt fed token by token).")
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
    return {**engine.stats, "jit_s": t["s"], "jit_calls": t["calls"], "dec_s": t["decode_s"],
            "dec_calls": t["decode_calls"], "t": time.perf_counter()}


def run_continuous(sampler: Sampler, params, C: int, cfg: ScriptedConfig, max_new: int, warm_s: float,
                   window_s: float, stagger_s: float, seed: int = 0) -> dict:
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
    d = {k: b[k] - a[k] for k in ("steps", "prefill_steps", "generated_tokens", "fed_tokens", "refeeds", "busy_s",
                                  "jit_s", "jit_calls", "dec_s", "dec_calls")}
    return {
        "C": C, "slots": sampler.slots, "episodes": len(eps), "window_s": window,
        "eps_per_s": rate, "eps_counted": len(eps) / window, "short_workers": short,
        "latency_s": statistics.fmean(e["end"] - e["start"] for e in eps) if eps else None,
        "gen_s": statistics.fmean(e["gen_s"] for e in eps) if eps else None,
        "wait_s": statistics.fmean(e["wait_s"] for e in eps) if eps else None,
        "generated_per_ep": statistics.fmean(e["generated"] for e in eps) if eps else None,
        "step_ms": d["busy_s"] / d["steps"] * 1000 if d["steps"] else None,
        "jit_ms": d["jit_s"] / d["jit_calls"] * 1000 if d["jit_calls"] else None,
        "dec_ms": d["dec_s"] / d["dec_calls"] * 1000 if d["dec_calls"] else None,
        "pre_ms": (d["jit_s"] - d["dec_s"]) / (d["jit_calls"] - d["dec_calls"]) * 1000
        if d["jit_calls"] > d["dec_calls"] else None,
        "prefill_share": (d["jit_s"] - d["dec_s"]) / d["jit_s"] if d["jit_s"] else None,
        "gap_ms": window / d["steps"] * 1000 if d["steps"] else None,
        "decode_steps": d["steps"] - d["prefill_steps"], "prefill_steps": d["prefill_steps"],
        "refeeds": d["refeeds"], "busy": d["busy_s"] / window, "jit_busy": d["jit_s"] / window,
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
        r = run_continuous(samplers.get(slots), params, C, cfg, args.tokens_per_turn,
                           warm_s=args.warm_s, window_s=args.window_s, stagger_s=args.tool_latency_s)
        if C == 1 and slots == 1:
            L1 = r["latency_s"]
        results.append(r)
    rows = []
    for r in results:
        by_latency = r["C"] / L1 if L1 else None
        cap = caps.get(r["slots"], float("inf")) / gen_per_ep
        ideal = min(by_latency, cap) if by_latency else cap
        r.update(ideal=ideal, ratio=r["eps_per_s"] / ideal, cap=cap)
        rows.append([r["C"], r["slots"], r["episodes"], r["eps_counted"], r["eps_per_s"], ideal, cap, f"{r['ratio']:.0%}",
                     r["latency_s"], r["gen_s"], r["step_ms"], r["jit_ms"], r["dec_ms"], r["pre_ms"],
                     f"{r['prefill_share']:.0%}", r["gap_ms"], r["decode_steps"], r["prefill_steps"], r["refeeds"], f"{r['busy']:.0%}", r["tokens_per_step"]])
    print_table(
        f"1. Latency hiding: scripted env, {args.env_steps} steps x {args.tool_latency_s:g} s tool wait, "
        f"{args.tokens_per_turn} tokens per turn ({gen_per_ep} per episode), {args.window_s:g} s window "
        f"after {args.warm_s:g} s warm-up",
        ["C", "slots", "episodes", "count/window", "eps/s", "ideal eps/s", "decode cap", "measured/ideal", "ep latency s",
         "gen s/ep", "step ms", "jit ms", "jit decode ms", "jit prefill ms", "prefill share", "wall ms/step", "decode steps", "prefill steps", "refeeds",
         "engine busy", "tokens/step"], rows,
        f"L1 (C=1 latency) = {fmt(L1)} s; ideal = min(C / L1, decode cap); decode cap = section-2 tok/s at "
        f"S=slots / {gen_per_ep}. step ms = InferenceEngine._step; jit ms = Sampler.step inside it (all steps, then "
        f"width-1 decode and width-16 prefill steps apart; prefill share = prefill jit time / all jit time); wall ms/step "
        f"= window / steps; engine busy = time inside _step / window. eps/s = sum over the C episode loops of "
        f"(completions - 1) / (last - first completion time) in the window; count/window = completions / window.")
    short = sum(r["short_workers"] for r in results)
    if short:
        print(f"warning: {short} episode loops had < 2 completions in their window and were not counted: "
              f"use a longer --window_s")
    return {"results": results, "L1": L1}


def profile_c64(samplers: Samplers, args, C: int, slots: int) -> str:
    cfg = ScriptedConfig(tool_latency_s=args.tool_latency_s, steps=args.env_steps)
    prof = cProfile.Profile()
    prof.enable()
    r = run_continuous(samplers.get(slots), samplers.params, C, cfg, args.tokens_per_turn,
                       warm_s=args.warm_s, window_s=args.profile_s, stagger_s=args.tool_latency_s)
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(args.profile_top)
    st.sort_stats("cumulative").print_stats(args.profile_top)
    text = out.getvalue()
    header = (f"cProfile of C={C}, slots={slots} ({args.warm_s:g} s warm-up + {args.profile_s:g} s window, "
              f"{r['eps_per_s']:.3g} eps/s under the profiler)")
    print(header)
    print(_trim_pstats(text))
    return text


def _trim_pstats(text: str) -> str:
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("Ordered by", "List reduced")):
            continue
        keep.append(line.replace(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/", "")
                    .replace(sys.prefix, "<venv>"))
    return "\n".join(keep)


# ----------------------------------------------------------------------------- 3. packing
def length_pools(n_per_env: int) -> dict[str, list[int]]:
    t0 = time.perf_counter()
    pools = {}
    for env in ("calculator", "code", "guess"):
        try:
            pools[env] = oracle_lengths(env, n_per_env)
        except Exception as e:  # noqa: BLE001 - e.g. no sandbox: report, keep the others
            print(f"[packing] no {env} transcripts: {type(e).__name__}: {e}")
    print("[packing] oracle transcripts: " + ", ".join(
        f"{k}: n={len(v)} min={min(v)} median={int(np.median(v))} max={max(v)}" for k, v in pools.items())
        + f" ({time.perf_counter() - t0:.1f} s)")
    return pools


def _traj(tid: str, n: int):
    from pipelines.trajectory import Trajectory
    mask = np.zeros(n, np.uint8)
    mask[n // 3:] = 1
    return Trajectory(trajectory_id=tid, request_id=tid.split("/")[0], task_id="bench",
                      tokens=(np.arange(n) % 256).astype(np.int32), loss_mask=mask,
                      behaviour_logprobs=np.where(mask == 1, -1.0, 0.0).astype(np.float32),
                      policy_versions=np.where(mask == 1, 0, -1).astype(np.int32), reward=0.0,
                      status="finished", advantage=0.5)


def sample_stream(pools: dict[str, list[int]], envs: tuple[str, ...], n: int, group: int, seed: int,
                  max_len: int) -> list[int]:
    """Lengths in arrival order: groups of `group` trajectories of one env (chosen per
    group), each an independent draw from that env's oracle lengths, cut to max_len as
    FitToBuckets(overlong="truncate") does."""
    rng = random.Random(seed)
    envs = tuple(e for e in envs if e in pools)
    out = []
    while len(out) < n:
        pool = pools[rng.choice(envs)]
        out += [min(rng.choice(pool), max_len) for _ in range(group)]
    return out[:n]


def stream_pack(lengths: list[int], shape: RecordShape, rate: float, max_wait_s: float | None,
                rearm: bool = False, extra_rows: int = 0) -> dict:
    """The packer's logic on a stream arriving at `rate` trajectories/s (simulated clock),
    as PackRecordsFn does it: after each arrival take_full_records; a max-wait flush packs
    the whole buffer max_wait_s after the first trajectory entered an EMPTY buffer (the
    timer is not re-armed when full records leave and some trajectories stay); a final
    flush packs what is left. Two simulated alternatives (not in pipelines/ today):
    rearm=True restarts the max-wait clock at the oldest trajectory still buffered after a
    full record leaves; extra_rows > 0 keeps that many extra rows buffered before emitting."""
    from pipelines.packing import build_record, first_fit_decreasing, pack, take_full_records
    buffer, first, arrived = [], None, {}
    emitted = {"full": [], "max_wait": [], "final": []}

    def take(buf):
        if extra_rows == 0:
            return take_full_records(buf, shape)
        ready = []
        while True:
            rows = first_fit_decreasing([len(t) for t in buf], shape.seq_len, shape.max_segments_per_row,
                                        [t.trajectory_id for t in buf])
            if len(rows) <= shape.rows + extra_rows:
                return ready, buf
            ready.append(build_record(buf, rows[:shape.rows], shape))
            used = {i for r in rows[:shape.rows] for i in r}
            buf = [t for i, t in enumerate(buf) if i not in used]

    for i, n in enumerate(lengths):
        now = i / rate
        if max_wait_s is not None and first is not None and now >= first + max_wait_s:
            emitted["max_wait"] += pack(buffer, shape)
            buffer, first = [], None
        t = _traj(f"g{i // 4:06d}/{i % 4}", n)
        arrived[t.trajectory_id] = now
        buffer.append(t)
        if first is None:
            first = now
        ready, buffer = take(buffer)
        emitted["full"] += ready
        if not buffer:
            first = None
        elif ready and rearm:
            first = min(arrived[b.trajectory_id] for b in buffer)
    if buffer:
        emitted["final"] += pack(buffer, shape)
    cells = shape.rows * shape.seq_len

    def fill(recs):
        return sum(r.num_tokens for r in recs) / (len(recs) * cells) if recs else None

    allrecs = [r for v in emitted.values() for r in v]
    assert sum(len(r.trajectories) for r in allrecs) == len(lengths)
    return {"records": len(allrecs), "full": len(emitted["full"]), "max_wait": len(emitted["max_wait"]),
            "final": len(emitted["final"]), "fill_full": fill(emitted["full"]),
            "fill_stream": fill(emitted["full"] + emitted["max_wait"]), "fill_all": fill(allrecs),
            "per_row": len(lengths) / (len(allrecs) * shape.rows)}


PACK_SHAPES = (RecordShape(4, 256, 2), RecordShape(8, 256, 2), RecordShape(8, 256, 8), RecordShape(16, 256, 8),
               RecordShape(8, 512, 8), RecordShape(4, 1024, 16))


def bench_packing(args, pools: dict[str, list[int]]) -> None:
    waits = args.pack_waits
    policies = [("final flush only", None, False, 0)]
    for x in waits:
        policies += [(f"max-wait {x:g} s (as implemented)", x, False, 0), (f"max-wait {x:g} s, re-armed (sim)", x, True, 0)]
    policies.append((f"max-wait {waits[-1]:g} s, re-armed, +1 record buffered (sim)", waits[-1], True, -1))
    short = [policies[0], (f"max-wait {waits[0]:g} s (as implemented)", waits[0], False, 0),
             (f"max-wait {waits[-1]:g} s, re-armed (sim)", waits[-1], True, 0)]
    for mix, envs, pols in (("calc+code", ("calculator", "code"), policies),
                            ("calc+code+guess", ("calculator", "code", "guess"), short)):
        if not all(e in pools for e in envs):
            continue
        lengths = sample_stream(pools, envs, args.packing_n, 4, seed=1, max_len=LENGTH)
        rows = []
        for shape in PACK_SHAPES:
            for label, wait, rearm, extra in pols:
                r = stream_pack(lengths, shape, args.traj_rate, wait, rearm, shape.rows if extra < 0 else extra)
                rows.append([f"{shape.rows}x{shape.seq_len}", shape.max_segments_per_row, label, r["records"],
                             f"{r['full']}/{r['max_wait']}/{r['final']}", _pct(r["fill_full"]),
                             _pct(r["fill_stream"]), _pct(r["fill_all"]), r["per_row"]])
        print_table(
            f"3. Packing fill, {mix} oracle-transcript lengths (mean {np.mean(lengths):.0f}, "
            f"min {min(lengths)}, max {max(lengths)} tokens): {len(lengths)} trajectories in groups of 4 "
            f"arriving at {args.traj_rate:g} traj/s (simulated clock)",
            ["shape", "max seg/row", "flush policy", "records", "full/max-wait/final", "fill (full recs)",
             "fill (stream)", "fill (all)", "traj/row"], rows,
            "fill = non-pad tokens / all tokens of the records. 'stream' = full + max-wait records (what a running "
            "job emits); 'all' adds the end-of-stream flush. (sim) = simulated packer policy, not in pipelines/ today.")


def _pct(x):
    return "-" if x is None else f"{x:.1%}"


# ----------------------------------------------------------------------------- 4. flush latency
def bench_flush(args, lengths: list[int]) -> None:
    from localstack.processes import ProcessGroup
    from localstack.pubsub_emulator import PubSubEmulator
    from trainer import pubsub_io, records

    shape = (args.flush_rows, LENGTH)
    workdir = tempfile.mkdtemp(prefix="bench-flush-")
    t_start = time.perf_counter()
    with PubSubEmulator(log_dir=os.path.join(workdir, "emulator")) as emu:
        tin, tout = emu.create_topic("bench-groups"), emu.create_topic("bench-records")
        sin, sout = emu.create_subscription("bench-groups-sub", "bench-groups"), \
            emu.create_subscription("bench-records-sub", "bench-records")
        env = {**os.environ, **emu.env(), "JAX_PLATFORMS": "cpu"}
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_packer_pipeline.py"),
               "--runner=BundleBasedDirectRunner", "--streaming", f"--project={emu.project}",
               f"--input_subscription={sin}", f"--output_topic={tout}", f"--rows={args.flush_rows}",
               f"--seq_len={LENGTH}", f"--max_segments_per_row={args.flush_segments}",
               f"--max_wait_s={args.max_wait_s}"]
        pub, sub = emu.publisher(), pubsub_io.subscriber_client(emu.env()[pubsub_io.EMULATOR_ENV])
        got: list[tuple[float, dict, list[str]]] = []
        stop = threading.Event()

        def puller():
            while not stop.is_set():
                msgs = pubsub_io.pull(sub, sout, 100, timeout_s=1.0)
                pubsub_io.ack(sub, sout, [m.ack_id for m in msgs])
                for m in msgs:
                    rec = records.decode(m.message.data, shape)
                    got.append((m.message.publish_time.timestamp(), dict(m.message.attributes),
                                [t.trajectory_id for t in rec.trajectories]))

        finished: dict[str, float] = {}
        phase_of: dict[str, str] = {}
        lens = iter(lengths * 100)

        def publish_group(rid: str, phase: str):
            lg = [next(lens) for _ in range(4)]
            now = time.time()
            for i in range(4):
                finished[f"{rid}/{i}"] = now
                phase_of[f"{rid}/{i}"] = phase
            return pubsub_io.publish(pub, tin, json.dumps({"request_id": rid, "finished_at": now,
                                                           "lengths": lg}).encode())

        th = threading.Thread(target=puller, daemon=True)
        th.start()
        with ProcessGroup(cmd, os.path.join(workdir, "pipeline.log"), env) as pipeline:
            # Ready when a warm-up group comes back as a record.
            deadline, k = time.monotonic() + 180, 0
            while not any(p.startswith("warm") for _, _, ids in got for p in ids):
                if pipeline.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"packer pipeline not ready:\n{pipeline.log_tail()}")
                publish_group(f"warm{k}", "warm").result()
                k += 1
                time.sleep(1.0)
            ready_s = time.perf_counter() - t_start
            time.sleep(args.max_wait_s + 2)
            for rate in args.flush_rates:
                gps = rate / 4
                t0, n, futures = time.monotonic(), 0, []
                while time.monotonic() < t0 + args.flush_phase_s:
                    futures.append(publish_group(f"r{rate:g}-{n}", f"{rate:g}"))
                    n += 1
                    time.sleep(max(0.0, t0 + n / gps - time.monotonic()))
                for f in futures:
                    f.result()
                time.sleep(args.max_wait_s + 3)
            want = {t for t, p in phase_of.items() if p != "warm"}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not want <= {i for _, _, ids in got for i in ids}:
                time.sleep(0.5)
            alive = pipeline.poll() is None
            log_tail = pipeline.log_tail()
        stop.set()
        th.join(timeout=5)
    if not alive:
        print(f"[flush] pipeline exited early:\n{log_tail}")
    seen = {}
    rec_by_phase: dict[str, list] = {}
    for pt, attrs, ids in got:
        phases = {phase_of.get(i) for i in ids}
        for i in ids:
            seen.setdefault(i, pt)
        for p in phases:
            rec_by_phase.setdefault(p, []).append(attrs)
    rows = []
    for rate in args.flush_rates:
        p = f"{rate:g}"
        tids = [t for t, ph in phase_of.items() if ph == p]
        lat = np.array([seen[t] - finished[t] for t in tids if t in seen]) * 1000
        recs = rec_by_phase.get(p, [])
        reasons = {}
        for a in recs:
            reasons[a.get("flush_reason")] = reasons.get(a.get("flush_reason"), 0) + 1
        packer = np.array([float(a["packer_latency_ms"]) for a in recs if a.get("packer_latency_ms") not in (None, "None")])
        fill = statistics.fmean(int(a["num_tokens"]) / (args.flush_rows * LENGTH) for a in recs) if recs else None
        q = (lambda x, v: float(np.percentile(x, v))) if len(lat) else (lambda x, v: None)
        rows.append([p, len(tids), len(lat), len(recs), q(lat, 50), q(lat, 95), q(lat, 99),
                     float(lat.max()) if len(lat) else None,
                     float(np.percentile(packer, 95)) if len(packer) else None,
                     " ".join(f"{k}:{v}" for k, v in sorted(reasons.items())), _pct(fill)])
    print_table(
        f"4. Flush latency (packer alone, BundleBasedDirectRunner, emulator): shape {args.flush_rows}x{LENGTH}, "
        f"{args.flush_segments} seg/row, max_wait {args.max_wait_s:g} s, {args.flush_phase_s:g} s per rate",
        ["traj/s", "trajectories", "seen", "records", "p50 ms", "p95 ms", "p99 ms", "max ms",
         "packer p95 ms", "flush reasons", "mean fill"], rows,
        f"latency per trajectory = record's Pub/Sub publish_time - the trajectory's finished_at (stamped when its "
        f"group was published to the input topic). packer p95 = the packer's own emit time - oldest finished_at "
        f"in the record (per record). Pipeline ready after {ready_s:.0f} s.")


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short windows and fewer tokens (~2-3 min)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--tool_latency_s", type=float, default=1.0)
    p.add_argument("--env_steps", type=int, default=3, help="env steps per episode (2 tool turns + a final answer)")
    p.add_argument("--tokens_per_turn", type=int, default=16)
    p.add_argument("--latency_configs", default="1:1,8:8,32:32,64:64,64:32",
                   help="C:slots pairs; C=1:slots=1 gives L1")
    p.add_argument("--window_s", type=float, default=None, help="steady-state window per config (default 30, quick 8)")
    p.add_argument("--warm_s", type=float, default=None, help="warm-up before the window (default 4.5, quick 3.5)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                   help="cProfile one more C=64 run (latency section)")
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
    defaults = {"window_s": (30.0, 8.0), "warm_s": (4.5, 3.5), "profile_s": (10.0, 5.0), "decode_tokens": (200, 64),
                "packing_tasks": (60, 20), "packing_n": (2000, 400), "flush_phase_s": (30.0, 10.0)}
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
    print(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; " + "; ".join(f"{k} {v}" for k, v in info.items())
          + f"; load average at start {loadavg()}\n", flush=True)
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
