"""Does every recipe learn, and is RL the reason? For each environment, its recipe's main
job (`make demo ARGS="--env ENV"`, the recipe's defaults) and the RL-off control (the
same run and seeds, `--learner.learning_rate=0`), one job at a time:

    .venv/bin/python benchmarks/recipes.py --envs code,guess --out docs/results

Prints per job: held-out success at v0 and the last version (sampled and greedy), the
failure classes of those evaluations, the share of groups with no signal, the warm start
and RL wall time; writes `recipes.json` and `<env>_curve.png` into --out (docs/RESULTS.md
quotes them).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from _report import loadavg, machine_info, print_table, stop_children_on_exit
from learning import job_from_run, plot, run_job, to_json

from core import config
from core.config import configclass, knob
from localstack.launch.demo_config import parse_args
from localstack.reports import reconcile


@configclass
class RecipesBenchConfig:
    envs: tuple[str, ...] = knob(("code", "guess"), "environments whose recipes run")
    out: str = knob("docs/results", "where recipes.json and the curves go")
    workdir: str = knob("/tmp/recipes-bench", "run directories")
    demo_flags: str = knob("", "extra demo flags for every job (after the recipe)")
    no_control: bool = knob(False, "skip the RL-off controls")
    from_runs: bool = knob(False, "only assemble tables, JSON and plots from --workdir")


def outcomes(rows: list[dict], version: int, mode: str) -> str:
    for r in rows:
        if r["version"] == version and r["mode"] == mode:
            return ", ".join(f"{k} {v}" for k, v in sorted(r.get("outcomes", {}).items()))
    return "-"


def zero_signal_share(workdir: Path) -> str:
    totals = reconcile.rollout_totals(workdir) or {}
    groups = totals.get("groups", 0)
    return f"{totals.get('groups_zero_signal', 0) / groups:.2f} of {groups:.0f}" if groups else "-"


def main(argv=None) -> int:
    stop_children_on_exit()
    args = config.parse(RecipesBenchConfig, argv, description=__doc__)
    out, work = Path(args.out), Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine_info()}  load: {loadavg()}", flush=True)
    jobs = []
    for env in args.envs:
        flags = [f"--env={env}", *shlex.split(args.demo_flags)]
        pair = [(f"{env}, RL", f"{env}-rl", parse_args(flags))]
        if not args.no_control:
            pair.append((f"{env}, RL off", f"{env}-control", parse_args([*flags, "--learner.learning_rate=0"])))
        done = [(job_from_run if args.from_runs else run_job)(name, work / d, cfg) for name, d, cfg in pair]
        for job, (_, d, _) in zip(done, pair):
            job["workdir"] = str(work / d)
        plot(done, out / f"{env}_curve.png", title=env)
        jobs += done
    rows, failures = [], []
    for job in jobs:
        s = job["summary"]
        for mode in ("sampled", "greedy"):
            held = s.held_out.get(mode)
            if not held:
                continue
            first, last = held["first"], held["last"]
            rows.append(
                [job["name"], mode, first["success"], last["success"], f"v{last['version']} / step {last['step']}"]
                + [last["rl_s"], s.learner.warmstart_s, job["wall_s"], zero_signal_share(Path(job["workdir"]))]
            )
            failures.append([job["name"], mode, outcomes(job["rows"], first["version"], mode)])
            failures.append(["", "", outcomes(job["rows"], last["version"], mode) + f" (v{last['version']})"])
    print_table(
        "held-out success per recipe",
        ["job", "mode", "v0", "last", "last version", "RL s", "warm start s", "wall s", "zero-signal groups"],
        rows,
    )
    print_table("how held-out episodes ended (v0, then the last version)", ["job", "mode", "outcomes"], failures)
    doc = {"machine": machine_info(), "jobs": [json.loads(to_json(job)) for job in jobs]}
    (out / "recipes.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'recipes.json'} and the curves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
