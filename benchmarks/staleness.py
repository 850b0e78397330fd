"""How stale may rollouts be before async stops paying? Wall time to a held-out target, by
staleness bound, with seeds. One command, one run:

    .venv/bin/python benchmarks/staleness.py --out docs/results

From one warm-started policy of --env (made once here with the environment's recipe, or
--init_policy), for each tool latency and each setting in SETTINGS, for each seed: the demo
(`localstack.launch.demo`, the environment's recipe under `--demo_flags`) with the evaluator
on, learner on one core and the rollout side on the other, as benchmarks/utilization.py pins
them. Settings:
- sync: one round of rollouts per version, nothing stale;
- default: async as `agentic-rl demo --env ENV --tool_latency L` runs it: the planner's own
  plan (its default bound at L, localstack/launch/staleness_evidence.py), under the
  recipe's flags (a recipe's --learner.max_in_flight wins over the plan's, as in the demo);
- boundB: async with the capacity plan for a mean lag of B versions (`plan --staleness_bound
  B`: it caps the credit window, and the learner drops records older than the plan's
  max_staleness), the plan's credit window set even where the recipe sets one;
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
train reward against held-out success per version. Writes staleness.json (staleness_ENV.json
for another --env; after every run: a rerun skips what is there) and its .png into --out and
prints the tables.
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
from localstack.launch.demo_config import DemoConfig, parse_args
from localstack.launch.plan import PlanConfig
from trainer.learning.capacity import Measurements, make_plan
from trainer.learning.data.feeder import CreditConfig, CreditWindow

# name -> (staleness bound of the plan, "planner" for its own, or None for sync; demo flags on top)
SETTINGS: dict[str, tuple[float | str | None, dict]] = {
    "sync": (None, {"sync": True}),
    "default": ("planner", {}),
    "bound2": (2.0, {}),
    "bound2-decoupled": (2.0, {"learner.loss": "decoupled_ppo", "learner.tis_cap": 2.0}),
    "bound1": (1.0, {}),
    "bound4": (4.0, {}),
}


@configclass
class StalenessConfig:
    env: str = knob("calculator", "the environment; its recipe (localstack/launch/recipes.py) is every run's base")
    demo_flags: tuple[str, ...] = knob(
        (), "demo flags for every run, on the recipe (`--demo_flags=--learner.lr_decay=0`)"
    )
    latencies: tuple[str, ...] = knob(("fixed:2", "fixed:0.5"), "tool latencies, one sweep each")
    settings: tuple[str, ...] = knob(tuple(SETTINGS), "which of SETTINGS to run, in this order", choices=SETTINGS)
    seeds: tuple[int, ...] = knob((0, 1, 2), "repeats of every setting (the sampler's and evaluator's seed)")
    sync_steps: int = knob(30, "learner steps of a sync run (async runs twice as many: the same wall budget)")
    batch_records: int | None = knob(None, "records per learner step (unset: the recipe's)")
    publish_every: int = knob(2, "learner steps per policy version")
    eval_n: int = knob(128, "held-out tasks per evaluated version")
    target: float = knob(0.9, "held-out sampled success whose time from v0 is reported (the demo's --target)")
    thresholds: tuple[float, ...] = knob((0.5, 0.6, 0.9), "held-out successes whose times the tables give")
    window_s: float = knob(30.0, "the tables' second reading: the held-out curve averaged over this long", gt=0)
    warmstart_steps: int | None = knob(None, "for the one initial policy (unset: the recipe's)")
    init_policy: str | None = knob(None, "a policy store to start from (unset: warm start one)")
    learner_cpus: str = knob("0", "the learner's CPUs")
    rollout_cpus: str = knob("1", "the rollout side's CPUs (emulator, pipeline, evaluator)")
    workdir: str = knob("/tmp/staleness", "run directories")
    out: str | None = knob(None, "write staleness[_ENV].json and .png here")


def demo_config(args: StalenessConfig, **by_flag) -> DemoConfig:
    """The demo as `agentic-rl demo --env ENV DEMO_FLAGS` would run it, with `by_flag` on top
    (None: the recipe's value)."""
    recipe = parse_args([f"--env={args.env}", *args.demo_flags])
    given = {k: v for k, v in by_flag.items() if v is not None}
    return config.build(
        DemoConfig, base=recipe, learner_cpus=args.learner_cpus, rollout_cpus=args.rollout_cpus, **given
    )


def replan(base: dict, bound: float, publish_every: int, path: Path) -> Path:
    """The planner's plan `base`, made again from its own measurements for a mean lag of
    `bound` versions; written to `path` in the planner's format (what the demo reads)."""
    m = Measurements(**base["measurements"])
    layout = config.build(PlanConfig).layout.layout  # the demo's default layout, as the planner's
    credits = CreditWindow(
        CreditConfig(max_batches_ahead=0, group_size=DemoConfig.group_size), m.batch_records, layout.largest
    )
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
    plan = plans[2.0 if sync else bound]
    if isinstance(bound, float):  # the plan's window, whatever the recipe says
        extra = {**extra, "learner.max_in_flight": json.loads(plan.read_text())["plan"]["max_in_flight"]}
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
        plan=str(plan),
        live="off",
        eval_seed=seed,
        **{"rollout.engine_seed": seed},
        **extra,
    )
    print(f"--- {lat} {name} seed {seed}: localstack.launch.demo {' '.join(config.to_argv(cfg))}", flush=True)
    summary = run_local(cfg)
    return run_row(name, seed, workdir, summary, args.target)


def run(args: StalenessConfig, results: dict, save) -> None:
    work = Path(args.workdir) / args.env  # each environment its own warm start
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
        bounds = {b for b, _ in (SETTINGS[s] for s in args.settings) if isinstance(b, float)} | {2.0}
        plans = {b: replan(sweep["plan"], b, args.publish_every, d / f"plan_bound{b:g}.json") for b in bounds}
        plans["planner"] = d / "planner" / "plan.json"
        key = {b: f"{b:g}" if isinstance(b, float) else b for b in plans}
        sweep["plans"] = {key[b]: json.loads(p.read_text())["plan"] for b, p in plans.items()}
        done = {(r["setting"], r["seed"]) for r in sweep["runs"]}
        for seed in args.seeds:  # seed-major: a cut-short sweep has every setting at equal seeds
            for name in args.settings:
                if (name, seed) in done:
                    continue
                sweep["runs"].append(one_run(args, lat, name, seed, init_store, plans, d))
                save()
        print_tables(lat, sweep, args.thresholds, args.window_s)


def main(argv=None) -> int:
    stop_children_on_exit()
    args = config.parse(StalenessConfig, argv, description=__doc__)
    out = Path(args.out or args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "staleness" if args.env == "calculator" else f"staleness_{args.env}"
    path = out / f"{stem}.json"
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
    plot(results, args.thresholds, out / f"{stem}.png")
    print(f"machine {results['machine']}, load {results['load']}, {results['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
