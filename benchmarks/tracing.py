"""What the timeline costs: tracing on against off, side by side, in one run.

    .venv/bin/python benchmarks/tracing.py --out docs/results

1. per span, in this process: an enabled span (enter, exit, one args dict) and a
   disabled one (`--no-trace`: the NULL tracer), in nanoseconds;
2. episodes/s of the real engine and episode code in one process, the tracer swapped
   on and off every 5 s under the same running episodes (the clean comparison: one
   process, alternating phases);
3. the rollout ceiling (benchmarks/_utilization_modes.rollout_alone: the real rollout job
   on one core, requests that never run out), with every worker's trace and scalars on
   and off, after a discarded warm-up run, in the order of ORDER so slow drift cancels:
   trajectories/s;
4. the main job (`localstack.launch.demo`, the learner and the rollouts on a core each, one
   warm-started policy, the same capacity plan, eval off), `--trace` and `--no-trace`
   alternated the same way: steady trained tokens/s and learner duty cycle.
Writes tracing.json into --out and prints the tables. Spans per second seen in the
traced runs, times the cost of one span, is the bound the A/B ratios cannot resolve
below their noise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import loadavg, machine_info, print_table, stop_children_on_exit
from _utilization_modes import rollout_alone
from utilization import DemoRunConfig, demo, demo_config, make_plan

from core import config
from core.config import configclass, knob
from core.telemetry import trace

# A warm-up run first (discarded: the first run after a quiet spell was the slowest of
# each set, by 25-35 %), then on, off, off, on, on, off: a linear drift cancels in the means.
ORDER = (None, True, False, False, True, True, False)


@configclass
class TracingBenchConfig:
    init_policy: str = knob("/tmp/utilization/init/policy-store", "a warm-started store")
    tool_latency: str = knob("fixed:0.5", "the demo's default")
    run: DemoRunConfig = config.section(DemoRunConfig)
    measure_s: float = knob(30.0, "rollout-alone window, s")
    workdir: str = knob("/tmp/tracing-bench", "run directories")
    out: str | None = knob(None, "write tracing.json here")
    skip: tuple[str, ...] = knob((), "comma-separated sections to skip: episodes,rollout,demo")


def cli(argv=None) -> TracingBenchConfig:
    return config.parse(TracingBenchConfig, argv, description=__doc__)


def span_cost_ns(n: int = 200_000) -> dict:
    with tempfile.TemporaryDirectory() as d:
        tracer = trace.Tracer(d, "bench")
        out = {}
        for name, t in (("enabled", tracer), ("disabled", trace.NULL)):
            t0 = time.perf_counter_ns()
            for i in range(n):
                with t.span("model turn", "episode 3", i=i):
                    pass
            out[f"{name}_ns_per_span"] = round((time.perf_counter_ns() - t0) / n, 1)
            tracer.flush()  # the writer's share is in the enabled cost below
        t0 = time.perf_counter_ns()
        for i in range(n):
            with tracer.span("model turn", "episode 3", i=i):
                pass
        tracer.flush()
        out["enabled_with_write_ns_per_span"] = round((time.perf_counter_ns() - t0) / n, 1)
        tracer.close()
    return out


def episodes_ab(init_policy: str, phase_s: float = 5.0, phases: int = 40, concurrency: int = 64) -> dict:
    """Episodes/s of the real engine and episode code in this process (calculator, no tool
    latency: all CPU, the worst case for a per-span cost), the tracer swapped on and off
    every `phase_s` seconds under the same running episodes: one process, one warm cache,
    alternating phases, so drift and run-to-run spread cancel."""
    import asyncio

    from flax import nnx

    import environments
    from core.contracts.store import PolicyStore
    from core.policy.model.config import model_config
    from core.policy.model.transformer import abstract_tree
    from core.policy.sampling.sampler import Sampler
    from rollout.engine import InferenceEngine
    from rollout.episodes import EpisodeLimits, run_episode

    sampler = Sampler(model_config("tiny"), slots=concurrency, length=256)
    target = abstract_tree(nnx.to_pure_dict(sampler.abstract_params))
    _, loaded = PolicyStore(init_policy).load_latest(target)
    params = jax_state(sampler.abstract_params, loaded)
    engine = InferenceEngine(sampler, lambda: (params, 0), 256)
    tasks = environments.make_tasks("calculator", 3, 5000, "train")
    limits = EpisodeLimits()
    with tempfile.TemporaryDirectory() as d:
        tracer, lanes = trace.Tracer(d, "bench"), trace.Lanes("episode")
        state = {"on": True, "done": 0}
        counts = []  # (tracer on?, episodes finished, seconds) per phase

        async def worker(i):
            k = i
            while True:
                t = tracer if state["on"] else trace.NULL
                env = environments.make("calculator", tool_latency="none")
                await run_episode(engine, env, tasks[k % len(tasks)], limits, t, lanes)
                state["done"] += 1
                k += concurrency

        async def main():
            workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
            await asyncio.sleep(10.0)  # compile and fill the slots
            for p in range(phases):
                state["on"], before, t0 = p % 4 in (0, 3), state["done"], time.monotonic()  # on off off on ...
                await asyncio.sleep(phase_s)
                counts.append((state["on"], state["done"] - before, time.monotonic() - t0))
            for w in workers:
                w.cancel()

        asyncio.run(main())
        spans = tracer.spans
        tracer.close()
    on = [n / s for o, n, s in counts if o]
    off = [n / s for o, n, s in counts if not o]
    return {
        "phases": [{"trace": o, "episodes_per_s": round(n / s, 2)} for o, n, s in counts],
        "on_mean": round(statistics.mean(on), 2),
        "off_mean": round(statistics.mean(off), 2),
        "on_over_off": round(statistics.mean(on) / statistics.mean(off), 4),
        # Standard error of the ratio from the phase-to-phase spread.
        "ratio_stderr": round(
            statistics.mean(on)
            / statistics.mean(off)
            * math.hypot(
                statistics.stdev(on) / statistics.mean(on) / math.sqrt(len(on)),
                statistics.stdev(off) / statistics.mean(off) / math.sqrt(len(off)),
            ),
            4,
        ),
        "spans_recorded": spans,
    }


def jax_state(template, loaded):
    import jax
    from flax import nnx

    state = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(state, loaded)
    return state


def spans_per_s(trace_dir: Path, wall_s: float) -> dict:
    counts = {}
    for path in trace_dir.glob(f"*{trace.SUFFIX}"):
        source = path.name.split("-")[0]
        counts[source] = counts.get(source, 0) + sum(e["ph"] == "X" for e in trace.read_events(path))
    return {k: round(v / wall_s, 1) for k, v in counts.items()}


def rollout_ab(args, work: Path, plan: dict) -> list[dict]:
    rows = []
    for i, on in enumerate(ORDER):
        d = work / f"rollout_{i}_{'warmup' if on is None else 'on' if on else 'off'}"
        telemetry = {"trace_dir": str(d / "trace"), "logdir": str(d / "logs")} if on else {}
        r = rollout_alone(
            Path(args.init_policy),
            args.tool_latency,
            d,
            rollout_cpus={int(c) for c in args.run.rollout_cpus.split(",")},
            measure_s=args.measure_s,
            plan_flags=plan["pipeline_flags"],
            settings=telemetry,
        )
        row = {"trace": on, "trajectories_per_s": round(r["trajectories_per_s"], 2), "tokens_per_s": r["tokens_per_s"]}
        if on:
            # Spans over the whole pipeline lifetime / the time it ran: a rate for the bound.
            row["spans_per_s"] = spans_per_s(d / "trace", r["measured_s"] + 15.0)
        print(f"rollout-alone trace={on}: {row}", flush=True)
        rows.append(row)
    return rows


def demo_ab(args, work: Path, plan_path: Path) -> list[dict]:
    rows = []
    common = demo_config(
        args.run,
        init_policy=args.init_policy,
        warmstart_steps=0,
        eval_n=0,
        filter_zero_signal=False,
        max_steps=args.run.steps,
        batch_records=args.run.batch_records,
        publish_every=args.run.publish_every,
        tool_latency=args.tool_latency,
        plan=str(plan_path),
        live="off",
    )
    for i, on in enumerate(ORDER):
        d = work / f"demo_{i}_{'warmup' if on is None else 'on' if on else 'off'}"
        learned = demo(d, dataclasses.replace(common, trace=bool(on))).learner
        row = {
            "trace": on,
            "steady_trained_tokens_per_s": learned.steady_trained_tokens_per_s,
            "steady_duty_cycle": learned.steady_duty_cycle,
            "wall_s": learned.wall_s,
        }
        if on:
            row["spans_per_s"] = spans_per_s(d / "trace", learned.wall_s)
        print(f"demo trace={on}: {row}", flush=True)
        rows.append(row)
    return rows


def ratio(rows: list[dict], key: str) -> dict:
    on = [r[key] for r in rows if r["trace"] is True]
    off = [r[key] for r in rows if r["trace"] is False]
    return {
        "on": on,
        "off": off,
        "on_over_off": round(statistics.mean(on) / statistics.mean(off), 4),
        # The run-to-run spread within one setting: a ratio closer to 1 than this is noise.
        "spread_off": round((max(off) - min(off)) / statistics.mean(off), 4) if len(off) > 1 else None,
    }


def main(argv=None) -> int:
    stop_children_on_exit()
    args = cli(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip)
    results = {"machine": machine_info(), "load_start": loadavg(), "args": dataclasses.asdict(args)}
    results["span_cost"] = span_cost_ns()
    print(f"span cost: {results['span_cost']}", flush=True)
    if "episodes" not in skip:
        results["episodes"] = episodes_ab(args.init_policy)
        print(f"episodes in one process: {results['episodes']}", flush=True)
    plan_path = work / "plan.json"
    plan = make_plan(args.run, args.tool_latency, None, plan_path) if {"rollout", "demo"} - skip else None
    if "rollout" not in skip:
        results["rollout"] = rows = rollout_ab(args, work, plan)
        results["rollout_ratio"] = ratio(rows, "trajectories_per_s")
    if "demo" not in skip:
        results["demo"] = rows = demo_ab(args, work, plan_path)
        results["demo_ratio"] = ratio(rows, "steady_trained_tokens_per_s")
    results["load_end"] = loadavg()
    print_tables(results)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "tracing.json").write_text(json.dumps(results, indent=2))
    return 0


def print_tables(r: dict) -> None:
    c = r["span_cost"]
    print_table(
        "Cost of one span (this process)",
        ["enabled ns", "enabled + write ns", "disabled ns"],
        [[c["enabled_ns_per_span"], c["enabled_with_write_ns_per_span"], c["disabled_ns_per_span"]]],
    )
    if "episodes" in r:
        e = r["episodes"]
        print_table(
            "episodes in one process, tracer swapped on/off every 5 s (phase order as run)",
            ["phase", "trace", "episodes/s"],
            [[i, "on" if p["trace"] else "off", p["episodes_per_s"]] for i, p in enumerate(e["phases"])],
            note=f"on/off = {e['on_over_off']} ± {e['ratio_stderr']} (standard error); {e['spans_recorded']} spans",
        )
    for section, key in (("rollout", "trajectories_per_s"), ("demo", "steady_trained_tokens_per_s")):
        if section not in r:
            continue
        rows = [
            [
                i,
                "on" if x["trace"] else "off",
                x[key],
                ", ".join(f"{k} {v}" for k, v in x.get("spans_per_s", {}).items()),
            ]
            for i, x in enumerate(r[section])
        ]
        q = r[f"{section}_ratio"]
        print_table(
            f"{section}: {key}, trace on vs off (run order as listed)",
            ["run", "trace", key, "spans/s"],
            rows,
            note=f"on/off = {q['on_over_off']}; spread of the 'off' runs (max - min) / mean = {q['spread_off']}",
        )


if __name__ == "__main__":
    sys.exit(main())
