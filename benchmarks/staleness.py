"""How stale may rollouts be before async stops paying? Wall time to a held-out target, by
staleness bound, with seeds. One command, one run:

    .venv/bin/python benchmarks/staleness.py --out docs/results

From one warm-started calculator policy (made once here, or --init_policy), for each tool
latency and each setting in SETTINGS, for each seed: the demo (`localstack.launch.demo`)
with the evaluator on, learner on one core and the rollout side on the other, as
benchmarks/utilization.py pins them. Settings:
- sync: one round of rollouts per version, nothing stale;
- boundB: async with the capacity plan for a mean lag of B versions (`plan --staleness_bound
  B`: it caps the credit window, and the learner drops records older than the plan's
  max_staleness). The planner's default bound is 2, so bound2 is the planner's default;
- bound2-decoupled: the same plan, trained with decoupled PPO (the ratio taken
  against the learner's own params, each token weighted by pi_prox / mu, capped: AReaL's
  objective) instead of PPO's ratio against the stale sampler.
One plan per latency is measured (the demo's planner, engine-only rollout rate); each bound
re-plans from its measurements, so bounds differ in nothing else. A seed sets the rollout
sampler's and the evaluator's draws (`--rollout.engine_seed`, `--eval_seed`); the tasks and
the starting policy are the same in every run. Sync and async get the same wall budget:
async runs twice sync's steps (it steps about twice as often).

Per run: seconds and versions from v0 to held-out sampled success >= --target (the
evaluator's rows, timed by each version's publication), trained tokens/s and duty, the
staleness of consumed records, records dropped as stale, the PPO diagnostics per step, and
train reward against held-out success per version. Writes staleness.json (after every run:
a rerun skips what is there) and staleness.png into --out and prints the tables.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import loadavg, machine_info, stop_children_on_exit
from _staleness_report import plot, print_tables, run_row

from core import config
from core.config import configclass, knob
from localstack.launch.demo import run_local
from localstack.launch.demo_config import DemoConfig
from localstack.launch.plan import PlanConfig
from trainer.learning.capacity import Measurements, make_plan
from trainer.learning.data.feeder import CreditConfig

# name -> (staleness bound of the plan, or None for sync; demo flags on top)
SETTINGS: dict[str, tuple[float | None, dict]] = {
    "sync": (None, {"sync": True}),
    "bound2": (2.0, {}),  # the planner's default bound
    "bound2-decoupled": (2.0, {"learner.loss": "decoupled_ppo", "learner.tis_cap": 2.0}),
    "bound1": (1.0, {}),
    "bound4": (4.0, {}),
}


@configclass
class StalenessConfig:
    latencies: tuple[str, ...] = knob(("fixed:2", "fixed:0.5"), "tool latencies, one sweep each")
    settings: tuple[str, ...] = knob(tuple(SETTINGS), "which of SETTINGS to run, in this order", choices=SETTINGS)
    seeds: tuple[int, ...] = knob((0, 1, 2), "repeats of every setting (the sampler's and evaluator's seed)")
    sync_steps: int = knob(30, "learner steps of a sync run (async runs twice as many: the same wall budget)")
    batch_records: int = knob(4, "records per learner step")
    publish_every: int = knob(2, "learner steps per policy version")
    eval_n: int = knob(128, "held-out tasks per evaluated version")
    target: float = knob(0.9, "held-out sampled success whose time from v0 is reported (the demo's --target)")
    thresholds: tuple[float, ...] = knob((0.5, 0.6, 0.9), "held-out successes whose times the tables give")
    warmstart_steps: int = knob(2800, "for the one initial policy (the demo's default)")
    init_policy: str | None = knob(None, "a policy store to start from (unset: warm start one)")
    learner_cpus: str = knob("0", "the learner's CPUs")
    rollout_cpus: str = knob("1", "the rollout side's CPUs (emulator, pipeline, evaluator)")
    workdir: str = knob("/tmp/staleness", "run directories")
    out: str | None = knob(None, "write staleness.json and staleness.png here")


def demo_config(args: StalenessConfig, **by_flag) -> DemoConfig:
    return config.build(DemoConfig, learner_cpus=args.learner_cpus, rollout_cpus=args.rollout_cpus, **by_flag)


def replan(base: dict, bound: float, publish_every: int, path: Path) -> Path:
    """The planner's plan `base`, made again from its own measurements for a mean lag of
    `bound` versions; written to `path` in the planner's format (what the demo reads)."""
    m = Measurements(**base["measurements"])
    layout = config.build(PlanConfig).layout.layout  # the demo's default layout, as the planner's
    credits = CreditConfig(0, m.batch_records, layout.largest, DemoConfig.group_size)
    p = make_plan(
        m,
        target_duty=base["plan"]["target_duty"],
        group_size=DemoConfig.group_size,
        publish_every=publish_every,
        min_window=credits.min_window,
        workers=base["plan"]["rollout_workers"],
        staleness_bound=bound,
    )
    plan = {
        **base,
        "plan": {
            **base["plan"],
            "staleness_bound": bound,
            "staleness_bound_why": f"bound {bound:g}: the staleness sweep's setting",
            "max_in_flight": p.max_in_flight,
            "max_staleness": p.max_staleness,
        },
        "predicted": {"async": p.async_prediction.__dict__, "sync": p.sync_prediction.__dict__},
        "learner_flags": p.learner_flags(),
        "pipeline_flags": p.pipeline_flags(),
    }
    path.write_text(json.dumps(plan, indent=2))
    return path


def base_plan(args: StalenessConfig, lat: str, init_store: Path, d: Path) -> dict:
    """The demo's own planner at this latency (a run of 0 steps with --plan auto)."""
    cfg = demo_config(
        args,
        workdir=str(d / "planner"),
        init_policy=str(init_store),
        warmstart_steps=0,
        max_steps=0,
        eval_n=0,
        tool_latency=lat,
        batch_records=args.batch_records,
        publish_every=args.publish_every,
        plan="auto",
        live="off",
    )
    run_local(cfg)
    return json.loads((d / "planner" / "plan.json").read_text())


def one_run(args: StalenessConfig, lat: str, name: str, seed: int, init_store: Path, plans: dict, d: Path) -> dict:
    bound, extra = SETTINGS[name]
    sync = bound is None
    workdir = d / f"{name}-seed{seed}"
    cfg = demo_config(
        args,
        workdir=str(workdir),
        init_policy=str(init_store),
        warmstart_steps=0,
        max_steps=args.sync_steps if sync else 2 * args.sync_steps,
        eval_n=args.eval_n,
        target=args.target,
        tool_latency=lat,
        batch_records=args.batch_records,
        publish_every=args.publish_every,
        plan=str(plans[2.0 if sync else bound]),
        live="off",
        eval_seed=seed,
        **{"rollout.engine_seed": seed},
        **extra,
    )
    print(f"--- {lat} {name} seed {seed}: localstack.launch.demo {' '.join(config.to_argv(cfg))}", flush=True)
    summary = run_local(cfg)
    return run_row(name, seed, workdir, summary, args.target)


def run(args: StalenessConfig, results: dict, save) -> None:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    init_store = Path(args.init_policy) if args.init_policy else work / "init" / "policy-store"
    if not init_store.exists():  # one warm-started policy, the start of every run
        t0 = time.monotonic()
        run_local(
            demo_config(
                args,
                workdir=str(work / "init"),
                warmstart_steps=args.warmstart_steps,
                max_steps=0,
                eval_n=0,
                plan="off",
                live="off",
            )
        )
        results["init_wall_s"] = round(time.monotonic() - t0, 1)
    for lat in args.latencies:
        d = work / lat.replace(":", "_")
        d.mkdir(parents=True, exist_ok=True)
        sweep = results["latencies"].setdefault(lat, {"runs": []})
        if "plan" not in sweep:
            sweep["plan"] = base_plan(args, lat, init_store, d)
            save()
        bounds = {b for b, _ in (SETTINGS[s] for s in args.settings) if b is not None} | {2.0}
        plans = {b: replan(sweep["plan"], b, args.publish_every, d / f"plan_bound{b:g}.json") for b in bounds}
        sweep["plans"] = {f"{b:g}": json.loads(p.read_text())["plan"] for b, p in plans.items()}
        done = {(r["setting"], r["seed"]) for r in sweep["runs"]}
        for seed in args.seeds:  # seed-major: a cut-short sweep has every setting at equal seeds
            for name in args.settings:
                if (name, seed) in done:
                    continue
                sweep["runs"].append(one_run(args, lat, name, seed, init_store, plans, d))
                save()
        print_tables(lat, sweep, args.thresholds)


def main(argv=None) -> int:
    stop_children_on_exit()
    args = config.parse(StalenessConfig, argv, description=__doc__)
    out = Path(args.out or args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "staleness.json"
    results = json.loads(path.read_text()) if path.exists() else {"latencies": {}}
    results.update(machine=machine_info(), args=dataclasses.asdict(args))
    results.setdefault("load", []).append(loadavg())
    t0 = time.monotonic()

    def save():
        path.write_text(json.dumps(results, indent=2, default=str))

    try:
        run(args, results, save)
    finally:
        results["load"].append(loadavg())
        results.setdefault("wall_s", []).append(round(time.monotonic() - t0, 1))
        save()
    plot(results, args.thresholds, out / "staleness.png")
    print(f"machine {results['machine']}, load {results['load']}, {results['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
