"""Rollout-side benchmarks: latency hiding, decode throughput, packing fill, flush latency.

    python benchmarks/rollout.py            # everything (~6-8 min on 2 cores)
    python benchmarks/rollout.py --quick    # a short run of everything (~2-3 min)
    python benchmarks/rollout.py --sections decode,latency

Sections (tiny model: core.policy.model.config.ModelConfig() defaults, random init, JAX on CPU):

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

import dataclasses
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The repo root first: `import rollout` must find the rollout/ package, not this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _report import loadavg, machine_info, stop_children_on_exit
from _rollout_decode import LENGTH, Samplers, bench_decode, decode_caps
from _rollout_latency import bench_latency, profile_c64
from _rollout_packing import bench_flush, bench_packing, length_pools, sample_stream

from core import config
from core.config import configclass, knob
from core.contracts.record_shape import DEFAULT_MAX_SEGMENTS_PER_ROW
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from pipelines.packing_config import PackingConfig

SECTIONS = ("decode", "latency", "packing", "flush")


# ----------------------------------------------------------------------------- main
# Settings left unset take these (full run, --quick) values.
_UNSET = {
    "window_s": (30.0, 8.0),
    "warm_s": (4.5, 3.5),
    "profile_s": (10.0, 5.0),
    "decode_tokens": (200, 64),
    "packing_tasks": (60, 20),
    "packing_n": (2000, 400),
    "flush_phase_s": (30.0, 10.0),
}


def _unset(name: str, text: str) -> str:
    full, quick = _UNSET[name]
    return f"{text} (unset: {full:g}, with --quick {quick:g})"


@configclass
class RolloutBenchConfig:
    quick: bool = knob(False, "short windows and fewer tokens: the second value of every unset setting")
    sections: tuple[str, ...] = knob(SECTIONS, f"comma-separated subset of {SECTIONS}", choices=SECTIONS)
    tool_latency_s: float = knob(1.0, "latency: wait of every scripted environment step, s")
    env_steps: int = knob(3, "env steps per episode (2 tool turns + a final answer)")
    tokens_per_turn: int = knob(16, "latency: tokens generated per model turn")
    latency_configs: tuple[str, ...] = knob(
        ("1:1", "8:8", "32:32", "64:64", "64:32"),
        "C:slots pairs; C=1:slots=1 gives L1",
        matches=(r"0*[1-9][0-9]*:0*[1-9][0-9]*", "C:slots, two positive ints"),
    )
    window_s: float | None = knob(None, _unset("window_s", "steady-state window per config, s"))
    warm_s: float | None = knob(None, _unset("warm_s", "warm-up before the window, s"))
    profile: bool = knob(True, "cProfile one more C=64 run (latency section)")
    profile_s: float | None = knob(None, _unset("profile_s", "profiled window, s"))
    profile_top: int = knob(15, "functions listed per cProfile table")
    decode_slots: tuple[int, ...] = knob((1, 8, 32, 64), "decode: slot counts")
    decode_tokens: int | None = knob(None, _unset("decode_tokens", "new tokens per slot"))
    packing_tasks: int | None = knob(None, _unset("packing_tasks", "oracle transcripts per env"))
    packing_n: int | None = knob(None, _unset("packing_n", "trajectories per mix"))
    traj_rate: float = knob(20.0, "arrival rate for the packing simulation, trajectories/s")
    max_wait_s: float = knob(PackingConfig().max_wait_s, "packer max wait (section 4; the pipeline default)")
    pack_waits: tuple[float, ...] = knob((2.0, 10.0), "max waits simulated in section 3")
    flush_rates: tuple[float, ...] = knob((4.0, 20.0), "trajectories/s published, one phase each")
    flush_phase_s: float | None = knob(None, _unset("flush_phase_s", "seconds per rate"))
    flush_rows: int = knob(4, "flush: rows per record")
    flush_segments: int = knob(DEFAULT_MAX_SEGMENTS_PER_ROW, "flush: max segments per row")

    def __post_init__(self):
        if self.tokens_per_turn * self.env_steps + 64 > LENGTH:
            raise ValueError("episodes would not fit the 256-token sampler")

    @property
    def latency_pairs(self) -> list[tuple[int, int]]:
        try:
            return [(int(c), int(s)) for c, s in (cs.split(":") for cs in self.latency_configs)]
        except ValueError:
            raise ValueError(f"--latency_configs: expected C:slots pairs, got {self.latency_configs}") from None


def parse_args(argv) -> RolloutBenchConfig:
    cfg = config.parse(RolloutBenchConfig, argv, description=__doc__)
    fill = {k: v[cfg.quick] for k, v in _UNSET.items() if getattr(cfg, k) is None}
    return dataclasses.replace(cfg, **fill)


def main(argv=None) -> int:
    stop_children_on_exit()
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
        missing = sorted({s for _, s in args.latency_pairs} - set(caps))
        if missing:
            caps.update(decode_caps(samplers, missing, args.decode_tokens))
        bench_latency(samplers, args, caps)
        if args.profile:
            C, S = max(args.latency_pairs, key=lambda cs: (cs[0], cs[1]))
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
