"""Does the planner's rollout rate match what the rollout job delivers? One command:

    .venv/bin/python benchmarks/planner_rate.py --out docs/results   # planner_rate.json

For each environment, at its recipe's settings (tool latency, turn length, env config):
1. one warm-started policy: the demo with its recipe's warm start and no RL step;
2. the planner as the demo runs it, with that policy (`--init_policy`), pinned to the
   rollout core: its engine-only ceiling and its rate from whole groups of real episodes
   (localstack/launch/plan_rollout.py);
3. the rollout job alone on that core, with that policy, fed requests that never run out
   and drained by a sink (benchmarks/_utilization_modes.py): the trajectories/s it delivers.
The issue's bar (56): the planner's rate within 2x of the job's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import loadavg, machine_info, print_table, stop_children_on_exit
from _utilization_modes import rollout_alone

from core import config
from core.config import configclass, knob
from core.contracts.store import LATEST
from localstack.launch.commands import plan_command
from localstack.launch.demo import planner_config, run_local
from localstack.launch.demo_config import parse_args


@configclass
class PlannerRateConfig:
    envs: tuple[str, ...] = knob(("calculator", "code", "guess"), "environments, at their recipes' settings")
    warmstart_steps: int | None = knob(None, "warm-start steps of each policy (unset: the recipe's)", ge=0)
    rollout_cpu: int = knob(1, "the core the planner and the rollout job each run on, in turn", ge=0)
    measure_s: float = knob(45.0, "the rollout job's measured window, s", gt=0)
    workdir: str = knob("/tmp/planner_rate", "run directories")
    out: str | None = knob(None, "write planner_rate.json here")


def one_env(env: str, args: PlannerRateConfig, work: Path) -> dict:
    flags = [f"--env={env}", "--eval_n=0", "--plan=off", "--live=off", "--no-report"]
    if args.warmstart_steps is not None:
        flags.append(f"--warmstart_steps={args.warmstart_steps}")
    # The recipe's warm start, v0 published, no RL step (no rate decay over no steps); kept
    # from an earlier run of this benchmark when its store is there.
    init = parse_args([*flags, "--max_steps=0", "--learner.lr_decay=0", f"--workdir={work / 'init'}"])
    store, t0 = work / "init" / "policy-store", time.monotonic()
    if not (store / LATEST).exists():
        run_local(init)
    warm_s = time.monotonic() - t0
    cfg = parse_args([*flags, f"--init_policy={store}", f"--workdir={work / 'run'}"])
    plan_cfg = planner_config(cfg, work / "plan.json")
    cpu = str(args.rollout_cpu)
    subprocess.run(["taskset", "-c", cpu, *plan_command(plan_cfg)], check=True, stdout=subprocess.DEVNULL)
    plan = json.loads((work / "plan.json").read_text())
    job = rollout_alone(
        store,
        cfg.env.tool_latency or "none",
        work / "rollout",
        rollout_cpus={args.rollout_cpu},
        group_size=cfg.group_size,
        measure_s=args.measure_s,
        settings={"max_new_tokens_per_turn": cfg.turn.max_new_tokens_per_turn},
        env_name=env,
        env_config=cfg.env.config,
    )
    episodes = plan["measured"]["rollout"]
    print(
        f"{env}: planner {plan['measurements']['rollout_rate']:.1f}/s, job {job['trajectories_per_s']:.1f}/s",
        flush=True,
    )
    return {
        "env": env,
        "tool_latency": cfg.env.tool_latency,
        "warmstart_s": round(warm_s, 1),
        "engine_only": plan["engine_only_rate"],
        "planner": plan["measurements"]["rollout_rate"],
        "planner_episodes": episodes,
        "job": job["trajectories_per_s"],
        "job_detail": job,
        "planner_over_job": plan["measurements"]["rollout_rate"] / job["trajectories_per_s"],
        "engine_only_over_job": plan["engine_only_rate"] / job["trajectories_per_s"],
    }


def main(argv=None) -> int:
    args = config.parse(PlannerRateConfig, argv, description=__doc__)
    stop_children_on_exit()
    results = {"machine": machine_info(), "load_start": loadavg(), "envs": []}
    for env in args.envs:
        print(f"=== {env}", flush=True)
        results["envs"].append(one_env(env, args, Path(args.workdir) / env))
        if args.out:  # after each environment: a later one's failure keeps the earlier ones
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "planner_rate.json").write_text(json.dumps(results, indent=2))
    results["load_end"] = loadavg()
    rows = [
        [
            r["env"],
            r["tool_latency"],
            f"{r['engine_only']:.1f}",
            f"{r['planner']:.1f}",
            f"{r['job']:.1f}",
            f"{r['planner_over_job']:.2f}x",
            f"{r['engine_only_over_job']:.2f}x",
            f"{r['planner_episodes']['turns_per_episode']:.2f}",
        ]
        for r in results["envs"]
    ]
    print_table(
        "Rollout rate, trajectories/s on one core: the planner's against the rollout job's",
        ["env", "tools", "engine only", "planner (episodes)", "rollout job", "planner/job", "engine/job", "turns"],
        rows,
        "target: planner/job within 0.5x-2x (issue 56)",
    )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "planner_rate.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
