"""Does decoupling keep the learner busy while tools take seconds? One command, one run:

    .venv/bin/python benchmarks/utilization.py --out docs/results

The learner runs on one core and the rollout side (Pub/Sub emulator, Beam pipeline) on the
other (sched_setaffinity), so every mode gets the same hardware. For each tool latency:
1. the rollout-alone ceiling: the rollout job with requests that never run out, drained by
   a sink (trajectories/s, tokens/s), keeping its records;
2. the learner-alone ceiling: back-to-back train steps on those records;
3. the capacity plan (`localstack.launch.plan`) with the measured rollout ceiling: its settings and
   its predicted duty cycles;
4. sync: `localstack.launch.demo --sync` (one round per version, nothing stale, nothing early);
5. async: `localstack.launch.demo` with the plan's settings.
Both runs start from one warm-started policy (made once here), keep zero-signal groups (a
systems measurement: every trajectory trains) and take the same learner steps per
version. Writes utilization.json and utilization.png into --out and prints the tables.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import loadavg, machine_info, print_table, stop_children_on_exit
from _utilization_modes import learner_alone_pinned, rollout_alone

from core import config
from core.config import configclass, knob, section
from core.contracts.record_shape import LayoutConfig
from core.contracts.run_summary import RunSummary
from localstack.launch.commands import plan_command
from localstack.launch.demo import cpu_set, run_local
from localstack.launch.demo_config import DemoConfig
from localstack.launch.plan import PlanConfig
from localstack.reports.summary import DemoSummary

LATENCIES = ("none", "fixed:0.5", "fixed:2", "lognormal:1:1")
GROUP_SIZE = DemoConfig.group_size  # every run, and the plans, use the demo's


@configclass
class DemoRunConfig:
    """The demo runs' shared settings (this benchmark's and benchmarks/tracing.py's)."""

    steps: int = knob(20, "learner steps per demo run")
    batch_records: int = knob(4, "records per learner step")
    publish_every: int = knob(2, "learner steps per policy version (every mode)")
    learner_cpus: str = knob("0", "the learner's CPUs")
    rollout_cpus: str = knob("1", "the rollout side's CPUs")


@configclass
class UtilizationConfig:
    latencies: tuple[str, ...] = knob(LATENCIES, "tool latencies, one set of runs each")
    run: DemoRunConfig = section(DemoRunConfig)
    warmstart_steps: int = knob(600, "for the one initial policy")
    init_policy: str | None = knob(None, "a policy store to start from (unset: warm start one)")
    measure_s: float = knob(45.0, "rollout-alone window, s")
    eval_n: int = knob(
        0, "held-out tasks per evaluated version in the sync and async runs (0: none); gives the time to --target"
    )
    target: float = knob(0.9, "held-out (sampled) success whose time from v0 is reported")
    workdir: str = knob("/tmp/utilization", "run directories")
    out: str | None = knob(None, "write utilization.json and utilization.png here")


def cli(argv=None) -> UtilizationConfig:
    return config.parse(UtilizationConfig, argv, description=__doc__)


def demo_config(run: DemoRunConfig, **settings) -> DemoConfig:
    """A demo run's tree: the benchmark's pinning, then `settings` by demo flag name."""
    return config.build(DemoConfig, learner_cpus=run.learner_cpus, rollout_cpus=run.rollout_cpus, **settings)


def demo(workdir: Path, cfg: DemoConfig) -> DemoSummary:
    cfg = dataclasses.replace(cfg, workdir=str(workdir))
    print(f"--- localstack.launch.demo {shlex.join(config.to_argv(cfg))}", flush=True)
    return run_local(cfg)


def make_plan(run: DemoRunConfig, lat: str, rollout_rate: float | None, out: Path, **measured) -> dict:
    """The capacity plan for these runs; `measured`: PlanConfig's measured-elsewhere fields."""
    plan = config.build(
        PlanConfig,
        tool_latency=lat,
        batch_records=run.batch_records,
        group_size=GROUP_SIZE,
        publish_every=run.publish_every,
        rollout_rate=rollout_rate or None,
        out=str(out),
        **measured,
    )
    subprocess.run(["taskset", "-c", run.learner_cpus, *plan_command(plan)], check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def staleness(summary: RunSummary) -> tuple[float, int]:
    hist = {int(k): v for k, v in summary.staleness_histogram.items()}
    n = sum(hist.values())
    return (sum(k * v for k, v in hist.items()) / n if n else 0.0), max(hist, default=0)


def time_to_target(s: DemoSummary) -> float | None:
    """Seconds from v0's publication to the first version at the target, sampled (None: not reached)."""
    hit = s.held_out.get("sampled", {}).get("first_at_target")
    return hit["rl_s"] if hit else None


def row(mode: str, s: DemoSummary, layout: LayoutConfig) -> dict:
    L = s.learner
    mean_st, max_st = staleness(L)
    shape = layout.layout.largest
    made = L.trajectories + sum(L.trajectories_dropped_by_pipeline.values())
    rounds = L.sync  # None when asynchronous
    return {
        "mode": mode,
        "wall_s": L.wall_s,
        "steps": L.steps,
        "versions": len(L.policy_versions_published) - 1,
        # After the first step (its compile, and the rollout side's start, excluded).
        "duty": L.steady_duty_cycle,
        "tokens_per_s": L.steady_trained_tokens_per_s,
        "duty_whole_run": L.learner_duty_cycle,
        "made": made,
        "wasted": L.trajectories_dropped_stale + (rounds.lost_trajectories if rounds else 0),
        "in_flight_at_end": (L.requests_published or 0) * GROUP_SIZE - made,
        "mean_staleness": round(mean_st, 2),
        "max_staleness": max_st,
        "fill": round(L.tokens_consumed / max(1, L.records_consumed * shape.rows * shape.seq_len), 3),
        "padding_records": rounds.padding_records if rounds else 0,
        "extra_steps": rounds.extra_steps if rounds else 0,
        "time_to_target_s": time_to_target(s),
        "held_out_last": s.held_out.get("sampled", {}).get("last"),
    }


def run(args) -> dict:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    layout, rollout_cpus = LayoutConfig(), cpu_set(args.run.rollout_cpus)
    results = {"machine": machine_info(), "load_start": loadavg(), "args": dataclasses.asdict(args)}
    init_store = Path(args.init_policy) if args.init_policy else work / "init" / "policy-store"
    if not args.init_policy:  # one warm-started policy, the start of every run
        init = demo_config(args.run, warmstart_steps=args.warmstart_steps, max_steps=0, eval_n=0, plan="off")
        results["init_wall_s"] = demo(work / "init", init).demo_wall_s
    results["latencies"] = []
    for lat in args.latencies:
        d = work / lat.replace(":", "_")
        print(f"=== tool latency {lat}", flush=True)
        d.mkdir(parents=True, exist_ok=True)
        # The plan's engine concurrency does not depend on the rollout ceiling: measure the
        # ceiling at those settings, then plan the credits with it.
        first = make_plan(args.run, lat, None, d / "plan_engine_only.json")
        roll = rollout_alone(
            init_store,
            lat,
            d / "rollout",
            rollout_cpus=rollout_cpus,
            group_size=GROUP_SIZE,
            measure_s=args.measure_s,
            plan_flags=first["pipeline_flags"],
            window=max(512, 2 * first["plan"]["max_concurrent_groups"] * GROUP_SIZE),  # never runs dry
            learner=(cpu_set(args.run.learner_cpus), args.run.batch_records),  # side by side, same window
        )
        learn = roll.pop("learner_alone")
        learn_idle = learner_alone_pinned(
            d / "rollout" / "records.bin", args.run.batch_records, 20, cpu_set(args.run.learner_cpus), d / "rollout"
        )
        print(f"rollout alone: {roll}\nlearner alone: {learn}\n(other core idle: {learn_idle})", flush=True)
        plan = make_plan(  # this run's own stream, not the planner's oracle transcripts
            args.run,
            lat,
            roll["trajectories_per_s"],
            d / "plan.json",
            learner_step_s=learn["step_s"],
            trajectories_per_record=roll["trajectories_per_record"],
            tokens_per_trajectory=roll["tokens_per_s"] / roll["trajectories_per_s"],
        )
        runs = demo_config(
            args.run,
            warmstart_steps=0,
            eval_n=args.eval_n,
            target=args.target,
            filter_zero_signal=False,
            tool_latency=lat,
            max_steps=args.run.steps,
            batch_records=args.run.batch_records,
            publish_every=args.run.publish_every,
            plan=str(d / "plan.json"),
            init_policy=str(init_store),
        )
        sync = demo(d / "sync", dataclasses.replace(runs, sync=True))
        asyn = demo(d / "async", runs)
        limit = min(learn["tokens_per_s"], roll["tokens_per_s"])
        results["latencies"].append(
            {
                "tool_latency": lat,
                "rollout_alone": roll,
                "learner_alone": learn,
                "learner_alone_other_core_idle": learn_idle,
                "plan": plan["plan"],
                "predicted": plan["predicted"],
                "sync": row("sync", sync, layout),
                "async": row("async", asyn, layout),
                "limit_tokens_per_s": limit,
            }
        )
        print_tables(results)
    results["load_end"] = loadavg()
    return results


def print_tables(r: dict) -> None:
    rows = []
    for x in r["latencies"]:
        for mode in ("sync", "async"):
            m, p = x[mode], x["predicted"][mode]
            rows.append(
                [
                    x["tool_latency"],
                    mode,
                    m["wall_s"],
                    m["duty"],
                    round(p["duty_cycle"], 3),
                    m["tokens_per_s"],
                    round(m["tokens_per_s"] / x["limit_tokens_per_s"], 3),
                    m["made"],
                    m["wasted"],
                    m["mean_staleness"],
                    m["max_staleness"],
                    m["fill"],
                    m["versions"],
                    m.get("time_to_target_s"),
                ]
            )
    print_table(
        "sync vs async (learner on one core, rollouts on the other)",
        [
            "tool latency",
            "mode",
            "wall s",
            "duty",
            "predicted duty",
            "trained tok/s",
            "measured/limit",
            "rollouts made",
            "wasted",
            "mean stale",
            "max stale",
            "fill",
            "versions",
            "s to target",
        ],
        rows,
    )
    ceil_rows = [
        [
            x["tool_latency"],
            round(x["learner_alone"]["tokens_per_s"]),
            round(x["learner_alone_other_core_idle"]["tokens_per_s"]),
            round(x["learner_alone"]["step_s"], 3),
            round(x["rollout_alone"]["tokens_per_s"]),
            round(x["rollout_alone"]["trajectories_per_s"], 1),
            round(x["limit_tokens_per_s"]),
            round(x["async"]["tokens_per_s"] / max(1e-9, x["sync"]["tokens_per_s"]), 2),
            x["plan"]["max_in_flight"],
            x["plan"]["max_staleness"],
            x["predicted"]["async"]["binds"],
        ]
        for x in r["latencies"]
    ]
    print_table(
        "ceilings and the plan",
        [
            "tool latency",
            "learner alone tok/s",
            "(other core idle)",
            "step s",
            "rollout alone tok/s",
            "rollout traj/s",
            "limit tok/s",
            "async/sync",
            "plan in flight",
            "plan staleness",
            "plan: binds",
        ],
        ceil_rows,
    )


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [x["tool_latency"] for x in r["latencies"]]
    xs = range(len(labels))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, color in (("sync", "tab:orange"), ("async", "tab:blue")):
        a.plot(xs, [x[mode]["duty"] for x in r["latencies"]], "o-", color=color, label=f"{mode} measured")
        a.plot(
            xs,
            [x["predicted"][mode]["duty_cycle"] for x in r["latencies"]],
            "x--",
            color=color,
            label=f"{mode} planned",
        )
        b.plot(xs, [x[mode]["tokens_per_s"] for x in r["latencies"]], "o-", color=color, label=mode)
    b.plot(xs, [x["limit_tokens_per_s"] for x in r["latencies"]], "k:", label="min(ceilings)")
    b.plot(xs, [x["learner_alone"]["tokens_per_s"] for x in r["latencies"]], "g:", label="learner alone")
    for ax, title in ((a, "learner duty cycle"), (b, "trained tokens/s")):
        ax.set_xticks(list(xs), labels)
        ax.set_xlabel("tool latency per call")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a.set_ylim(0, 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    stop_children_on_exit()
    args = cli(argv)
    t0 = time.monotonic()
    results = run(args)
    results["wall_s"] = round(time.monotonic() - t0, 1)
    print(f"machine {results['machine']}, load {results['load_start']} -> {results['load_end']}, {results['wall_s']} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "utilization.json").write_text(json.dumps(results, indent=2, default=str))
        plot(results, out / "utilization.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
