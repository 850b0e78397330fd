"""The Beam tax: the same episodes through the engine and episode loop alone, and through the
rollout job on the direct runner, on the same pinned core, in one run.

    .venv/bin/python benchmarks/beam_tax.py --init_policy RUN/policy-store --tool_latency fixed:2 --cpus 1

(a) engine alone: one process pinned to --cpus runs the rollout job's own parts without
    Beam: an InferenceEngine with the job's slots, `run_group` for --max_concurrent_groups
    groups at a time (a new request the moment one ends, so work never runs out), the
    environment with the tool latency. Nothing is packed or published.
(b) rollout job: the real rollout job (emulator and pipeline pinned to --cpus), fed by a
    feeder that never runs dry and drained by a sink (benchmarks/_utilization_modes.py).
Both use the same policy (the store's newest version), environment, tool latency, group
size, engine slots, concurrency and record layout, and count over the same window after the
same warm-up: trajectories/s and tokens/s (every token of a trajectory, prompt included).
The ratio (b) / (a) is the share of the engine's throughput the job keeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import loadavg, machine_info, print_table, stop_children_on_exit
from _tax_budget import BudgetProbe, budget_rows
from _utilization_modes import rollout_alone

import environments
from core import config
from core.config import configclass, knob
from core.contracts.record_shape import RecordLayout
from core.contracts.store import PolicyStore
from core.policy.sampling.sampler import Sampler
from core.policy.sources import policy_spec
from core.policy.versions import VersionLoader
from rollout.engine import InferenceEngine
from rollout.engine_config import EngineConfig
from rollout.episodes import run_group

MAX_TOKENS = RecordLayout().trajectory_len  # the rollout job's default trajectory cap


@configclass
class BeamTaxConfig:
    init_policy: str = knob(help="a policy store: its newest version is the policy of both modes")
    tool_latency: str = knob("fixed:2", "per tool call")
    env: str = knob("calculator", "the environment")
    cpus: str = knob("1", "the one core both modes run on, in turn")
    group_size: int = knob(8, "episodes per request (the demo's)")
    warm_s: float = knob(15.0, "seconds after the first trajectory before counting")
    measure_s: float = knob(45.0, "the counting window")
    modes: str = knob("engine,job", "which modes to run: engine (a), job (b), baseline (b with --baseline_flags)")
    baseline_flags: str = knob(
        "--queued_groups 0 --admit_poll_s 0.5 --dofn_per_bundle",
        "the rollout job's flags in the baseline mode (the admission and DoFn handling before issue 22)",
    )
    workdir: str = knob("/tmp/beam-tax", "the job's emulator, logs and records")
    out: str | None = knob(None, "write the results here as JSON")
    budget: bool = knob(
        True, "profile the job over its window: a per-trajectory time budget (py-spy, if installed, splits the CPU)"
    )


def engine_alone(cfg: BeamTaxConfig, engine_cfg: EngineConfig) -> dict:
    """Mode (a): the job's engine and episode loop in this process, pinned to cfg.cpus."""
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in cfg.cpus.split(",")})
    try:
        return _engine_alone(cfg, engine_cfg)
    finally:
        os.sched_setaffinity(0, own)  # the job modes' feeder and sink run off the job's core


def _engine_alone(cfg: BeamTaxConfig, engine_cfg: EngineConfig) -> dict:
    spec = policy_spec(engine_cfg.model.checkpoint, engine_cfg.model.builtin)
    sampler = Sampler(
        spec.cfg,
        engine_cfg.slots,
        MAX_TOKENS,
        prefill=engine_cfg.prefill,
        prefill_slots=engine_cfg.prefill_slots,
    )
    store = PolicyStore(cfg.init_policy)
    version = store.latest_version()
    params, _ = VersionLoader(store, spec.cfg, sampler.abstract_params).load(version)
    sampler.warmup(params)
    engine = InferenceEngine(sampler, lambda: (params, version), MAX_TOKENS)
    tasks = environments.make_tasks(cfg.env, 7, 2000, "train")  # the job's feeder draws the same
    counts = {"trajectories": 0, "tokens": 0}
    clock: dict[str, float] = {}
    delta: dict[str, float] = {}  # the engine's counters over the window

    async def lane(k: int) -> None:
        i = k
        while "end" not in clock:
            envs = [environments.make(cfg.env, tool_latency=cfg.tool_latency) for _ in range(cfg.group_size)]
            group = await run_group(engine, envs, tasks[i % len(tasks)], f"r{i}", engine_cfg.limits(MAX_TOKENS))
            i += engine_cfg.max_concurrent_groups
            now = time.monotonic()
            clock.setdefault("first", now)
            if "start" in clock and now < clock.get("end", float("inf")):
                counts["trajectories"] += len(group)
                counts["tokens"] += sum(len(t) for t in group)

    async def timer() -> None:
        while "first" not in clock:
            await asyncio.sleep(0.1)
        await asyncio.sleep(cfg.warm_s)
        clock["start"] = time.monotonic()
        before = dict(engine.stats)
        await asyncio.sleep(cfg.measure_s)
        clock["end"] = time.monotonic()
        delta.update({k: engine.stats[k] - before[k] for k in before})

    async def main() -> None:
        lanes = [asyncio.create_task(lane(k)) for k in range(engine_cfg.max_concurrent_groups)]
        await timer()
        for t in lanes:
            t.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)

    asyncio.run(main())
    wall = clock["end"] - clock["start"]
    return {
        "trajectories_per_s": counts["trajectories"] / wall,
        "tokens_per_s": counts["tokens"] / wall,
        "engine_busy": delta["busy_s"] / wall,
        "engine_steps_per_s": delta["steps"] / wall,
        "prefill_step_share": delta["prefill_steps"] / max(delta["steps"], 1),
        "generated_tokens_per_s": delta["generated_tokens"] / wall,
        "measured_s": round(wall, 1),
    }


def rollout_job(cfg: BeamTaxConfig, flags: list[str]) -> tuple[dict, dict | None]:
    """Mode (b): the rollout job with these extra flags; and its time budget (cfg.budget)."""
    # Inside the job's counting window: it opens warm_s after the first trajectory, which
    # comes some 20 s after the job starts (imports, compiles).
    cores = {int(c) for c in cfg.cpus.split(",")}
    rest = set(range(os.cpu_count() or 1)) - cores
    own = os.sched_getaffinity(0)
    if rest:  # this process feeds and drains the job (the learner's side): not on its core
        os.sched_setaffinity(0, rest)
    probe = BudgetProbe(cfg.warm_s + 25.0, max(10.0, cfg.measure_s - 30.0), cores)
    if cfg.budget:
        probe.start()
    try:
        job = rollout_alone(
            Path(cfg.init_policy),
            cfg.tool_latency,
            Path(cfg.workdir),
            rollout_cpus=cores,
            group_size=cfg.group_size,
            warm_s=cfg.warm_s,
            measure_s=cfg.measure_s,
            env_name=cfg.env,
            plan_flags=flags,
        )
        if cfg.budget:
            probe.join(timeout=60.0)
    finally:
        os.sched_setaffinity(0, own)
    return {k: v for k, v in job.items() if k != "trajectories_per_s_by_5s"}, probe.result


def main(argv=None) -> int:
    stop_children_on_exit()
    cfg = config.parse(BeamTaxConfig, argv, description=__doc__, prog="benchmarks/beam_tax.py")
    engine_cfg = EngineConfig()  # the rollout job's defaults
    results = {"machine": machine_info(), "load_start": loadavg(), "args": dataclasses.asdict(cfg), "modes": {}}
    modes = cfg.modes.split(",")
    if "engine" in modes:
        print("=== (a) engine and episode loop alone", flush=True)
        results["modes"]["engine"] = engine_alone(cfg, engine_cfg)
    for mode in ("baseline", "job"):  # the older admission first, then today's
        if mode in modes:
            flags = shlex.split(cfg.baseline_flags) if mode == "baseline" else []
            print(f"=== (b) the rollout job on the direct runner {' '.join(flags)}", flush=True)
            results["modes"][mode], budget = rollout_job(cfg, flags)
            if budget:
                results.setdefault("budget", {})[mode] = budget
    results["load_end"] = loadavg()
    rows = [[m, r["trajectories_per_s"], r["tokens_per_s"], r.get("engine_busy")] for m, r in results["modes"].items()]
    for mode in ("baseline", "job"):
        if {"engine", mode} <= set(results["modes"]):
            a, b = results["modes"]["engine"], results["modes"][mode]
            results[f"{mode}_over_engine"] = b["trajectories_per_s"] / a["trajectories_per_s"]
            ratio = [results[f"{mode}_over_engine"], b["tokens_per_s"] / a["tokens_per_s"], None]
            rows.append([f"{mode} / engine", *ratio])
    print_table(
        f"Beam tax: {cfg.env} at {cfg.tool_latency}, core {cfg.cpus}",
        ["mode", "trajectories/s", "tokens/s", "engine busy"],
        rows,
    )
    for mode, b in results.get("budget", {}).items():
        print_table(
            f"Where the {mode} job's core goes, per trajectory ({b['window_s']:.0f} s window"
            f"{', py-spy' if b['profiled'] else ', no py-spy: Python threads are one category'})",
            ["part", "share of the core", "ms / trajectory"],
            budget_rows(b, results["modes"][mode]["trajectories_per_s"]),
        )
    if cfg.out:
        Path(cfg.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
