"""Rollout-side benchmarks: latency hiding, decode throughput, packing fill, flush latency.

    python benchmarks/rollout.py            # everything (~6-8 min on 2 cores)
    python benchmarks/rollout.py --quick    # a short run of everything (~2-3 min)
    python benchmarks/rollout.py --sections decode,latency

Sections (tiny model: core.policy.config.ModelConfig() defaults, random init, JAX on CPU):

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
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import loadavg, machine_info
from _rollout_decode import LENGTH, Samplers, bench_decode, decode_caps
from _rollout_latency import bench_latency, profile_c64
from _rollout_packing import bench_flush, bench_packing, length_pools, sample_stream

from core.contracts.record_shape import DEFAULT_MAX_SEGMENTS_PER_ROW
from core.policy.config import ModelConfig
from core.policy.model import init_model, split_params

SECTIONS = ("decode", "latency", "packing", "flush")


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
    p.add_argument("--flush_segments", type=int, default=DEFAULT_MAX_SEGMENTS_PER_ROW)
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
