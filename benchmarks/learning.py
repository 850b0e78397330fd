"""Does the agent get better, and is RL the reason? One command, one run:

    .venv/bin/python benchmarks/learning.py --out docs/results

1. the calculator main job exactly as `make demo` runs it (its defaults: warm start, then
   asynchronous RL with tool latency), held-out success of every evaluated version;
2. the RL-off control: the same run, same seeds, learning rate 0 (the learner still
   consumes records and publishes versions, but no update reaches the weights);
3. before/after held-out success for every other environment (`--envs`), same machinery.
Writes `learning.json` (every evaluation row) and `learning_curve.png` (success against
RL wall time and against learner step, main job vs control) into --out, and prints the
tables that docs/RESULTS.md quotes. Runs one job at a time: the machine has 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import loadavg, machine_info, print_table, stop_children_on_exit

from core import config
from core.config import configclass, knob
from core.contracts.run_summary import SchemaError
from core.telemetry.scalars import read_rows
from localstack.launch.demo import run_local
from localstack.launch.demo_config import DemoConfig
from localstack.reports.heldout import curve, held_out_summary
from localstack.reports.summary import DemoSummary, read_summary


def demo_config(flags: list[str], base: DemoConfig | None = None) -> DemoConfig:
    """The user's demo flags (this benchmark's text knobs) on `base` (else the demo's defaults)."""
    return config.parse(DemoConfig, flags, prog="agentic-rl demo", base=base)


def to_json(job: dict) -> str:
    return json.dumps({**job, "summary": job["summary"].to_dict()}, default=str)


def run_job(name: str, workdir: Path, cfg: DemoConfig) -> dict:
    t0 = time.monotonic()
    cfg = dataclasses.replace(cfg, workdir=str(workdir))
    flags = config.to_argv(cfg)
    print(f"--- {name}: localstack.launch.demo {shlex.join(flags)}", flush=True)
    summary = run_local(cfg)
    rows = read_rows(workdir / "eval.jsonl")
    job = {"name": name, "flags": flags, "wall_s": round(time.monotonic() - t0, 1), "summary": summary, "rows": rows}
    (workdir / "job.json").write_text(to_json(job))
    return job


def job_from_run(name: str, workdir: Path, cfg: DemoConfig) -> dict:
    """A finished run's job from its files (--from_runs): job.json (wall time included)
    when this benchmark wrote it, else the demo's or the learner's summary and the
    evaluator's eval.jsonl."""
    if (workdir / "job.json").exists():
        job = json.loads((workdir / "job.json").read_text())
        try:
            return {**job, "summary": DemoSummary.from_dict(job["summary"])}
        except SchemaError as e:  # written before summaries were typed: rebuilt from the run's files
            print(f"{workdir / 'job.json'}: {e}", flush=True)
    summary, why = read_summary(workdir)
    if summary is None:
        raise SystemExit(f"{workdir}: {why}")
    rows = read_rows(workdir / "eval.jsonl")
    if not summary.held_out and rows:
        summary.held_out = held_out_summary(rows)
    flags = config.to_argv(dataclasses.replace(cfg, workdir=str(workdir)))
    return {"name": name, "flags": flags, "wall_s": None, "summary": summary, "rows": rows}


def plot(jobs: list[dict], path: Path, title: str = "calculator") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4))
    for job in jobs:
        c = curve(job["rows"], "sampled")
        if not c:
            continue
        by_time.plot([p["rl_s"] for p in c], [p["success"] for p in c], marker="o", label=job["name"])
        by_step.plot([p["step"] for p in c], [p["success"] for p in c], marker="o", label=job["name"])
    for ax, xlabel in ((by_time, "seconds since policy v0 (RL wall time)"), (by_step, "learner step")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out success (sampled, T = 1)")
        ax.set_ylim(0, 1)
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{title}: held-out success of each evaluated policy version")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@configclass
class LearningBenchConfig:
    out: str = knob("docs/results", "where learning.json and learning_curve.png go")
    workdir: str = knob("/tmp/learning-bench", "run directories (logs, stores)")
    demo_flags: str = knob("", "extra flags for every demo run")
    envs: tuple[str, ...] = knob(("guess", "code"), "other environments, before/after (empty: none)")
    env_flags: str = knob("--max_steps=40", "extra flags for the other environments")
    # The code oracle runs the sandbox twice per demonstration, so its warm start uses fewer.
    flags_for: dict[str, str] = knob(
        {"code": "--warmstart_tasks=600 --warmstart_steps=600"},
        'extra flags for single environments, {"ENV": "FLAGS", ...} (replaces the default)',
    )
    no_control: bool = knob(False, "skip the RL-off control run")
    from_runs: bool = knob(False, "only assemble tables, JSON and plot from --workdir")


def main(argv=None) -> int:
    stop_children_on_exit()
    args = config.parse(LearningBenchConfig, argv, description=__doc__)
    out, work = Path(args.out), Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine_info()}  load: {loadavg()}", flush=True)
    extra = shlex.split(args.demo_flags)
    main_job = demo_config(extra)
    plan = [("calculator, async RL (make demo)", "calc-rl", main_job)]
    if not args.no_control:
        control = config.replace(main_job, **{"learner.learning_rate": 0.0})
        plan.append(("calculator, RL off (learning rate 0)", "calc-control", control))
    for env in args.envs:  # the demo flags, then the environment, then its own flags: the last one wins
        flags = [*shlex.split(args.env_flags), *shlex.split(args.flags_for.get(env, ""))]
        plan.append((f"{env}, async RL", env, demo_config(flags, base=config.replace(main_job, env=env))))
    jobs = [(job_from_run if args.from_runs else run_job)(name, work / d, cfg) for name, d, cfg in plan]

    rows = []
    for job in jobs:
        held_out = job["summary"].held_out
        for mode in ("sampled", "greedy"):
            held = held_out.get(mode)
            if not held:
                continue
            hit = held["first_at_target"]
            rows.append(
                [
                    job["name"],
                    mode,
                    held["first"]["success"],
                    held["last"]["success"],
                    f"v{held['last']['version']} / step {held['last']['step']}",
                    held["last"]["rl_s"],
                    f"v{hit['version']} at {hit['rl_s']} s" if hit else "-",
                    job["wall_s"],
                ]
            )
    print_table(
        "held-out success before and after RL",
        ["job", "mode", "v0", "last", "last version", "RL s", "first >= 0.90", "wall s"],
        rows,
    )
    for job in jobs[:2]:
        print_table(
            f"curve: {job['name']} (sampled)",
            ["version", "step", "RL s", "success"],
            [[c["version"], c["step"], c["rl_s"], c["success"]] for c in curve(job["rows"], "sampled")],
        )
    plot(jobs[:2], out / "learning_curve.png")
    doc = {"machine": machine_info(), "jobs": [json.loads(to_json(job)) for job in jobs]}
    (out / "learning.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'learning.json'} and {out / 'learning_curve.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
