"""The main job with a learner of one JAX process and of two (`--learner_processes`), one
after the other in one invocation, on the same settings: the learner's step time, the
first (compiling) step, the warm start and the whole demo, as measured by the runs.

    .venv/bin/python benchmarks/learner_processes.py --steps 20

On this 2-core machine two processes share the cores with the rollout job, the evaluator
and the emulator, so the two-process learner is expected to be slower: the point of the
mode is that the multi-host path runs for real (issue 25), not speed.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import loadavg, machine_info, print_table, stop_children_on_exit

from core import config
from core.config import configclass, knob
from core.telemetry.scalars import read_rows


@configclass
class LearnerProcessesBenchConfig:
    processes: tuple[int, ...] = knob((1, 2), "learner process counts, run one after the other")
    steps: int = knob(20, "learner steps per run")
    warmstart_steps: int = knob(200, "warm-start steps per run (both processes run it, collectively)")
    workdir: str = knob("/tmp/learner-processes-bench", "run directories")
    out: str | None = knob(None, "write the table's numbers here as JSON")


def run_one(cfg: LearnerProcessesBenchConfig, n: int) -> dict:
    from localstack.launch.demo import run_local
    from localstack.launch.demo_config import DemoConfig

    workdir = Path(cfg.workdir) / f"processes-{n}"
    args = config.build(
        DemoConfig,
        workdir=str(workdir),
        learner_processes=n,
        max_steps=cfg.steps,
        warmstart_steps=cfg.warmstart_steps,
        filter_zero_signal=False,  # a short warm start: train on equal-reward groups too
        eval_n=0,
        live="off",
        trace=False,
    )
    summary = run_local(args)
    steps = [r["perf/step_s"] for r in read_rows(workdir / "logs" / "learner" / "metrics.jsonl") if "perf/step_s" in r]
    warm = steps[2:] or steps  # the first steps compile
    return {
        "processes": n,
        "mesh": summary.learner.mesh,
        "steps": summary.learner.steps,
        "balanced": summary.learner.accounting.balanced,
        "first_step_s": round(steps[0], 2) if steps else None,
        "median_step_s": round(statistics.median(warm), 4) if warm else None,
        "warmstart_s": summary.learner.warmstart_s,
        "demo_s": summary.demo_wall_s,
    }


def main(argv=None) -> int:
    cfg = config.parse(LearnerProcessesBenchConfig, sys.argv[1:] if argv is None else argv, description=__doc__)
    stop_children_on_exit()
    rows = [run_one(cfg, n) for n in cfg.processes]
    base = rows[0]["median_step_s"]
    cols = ["processes", "mesh", "steps", "balanced", "first step s", "median step s", "vs first row", "warm start s"]
    print_table(
        f"learner processes ({machine_info().get('cpu', '?')}, load {loadavg()})",
        [*cols, "demo s"],
        [
            [r["processes"], r["mesh"], r["steps"], r["balanced"], r["first_step_s"], r["median_step_s"]]
            + [
                f"{r['median_step_s'] / base:.2f}x" if base and r["median_step_s"] else "-",
                r["warmstart_s"],
                r["demo_s"],
            ]
            for r in rows
        ],
    )
    if cfg.out:
        Path(cfg.out).write_text(json.dumps({"machine": machine_info(), "runs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
