"""Held-out curves of SmolLM2 main-job runs: sampled success per version, greedy at the ends.

    .venv/bin/python benchmarks/real_model_curve.py --run "run 17=/tmp/p36/demo17" \\
        --points "run 12, RL off=0:0.344,2:0.313,10:0.352" --json docs/results/real_model_curves.json \\
        --png docs/results/real_model_curve.png
    .venv/bin/python benchmarks/real_model_curve.py --from_json docs/results/real_model_curves.json --png OUT.png

Each --run reads WORKDIR/eval.jsonl (the evaluator's rows); --points gives a run whose
workdir is gone as `version:success` pairs (sampled). The JSON keeps what was plotted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.telemetry.scalars import read_rows
from localstack.reports.heldout import curve


def read_run(workdir: str) -> dict[str, list[list[float]]]:
    rows = read_rows(Path(workdir) / "eval.jsonl")
    return {mode: [[p["version"], p["success"]] for p in curve(rows, mode)] for mode in ("sampled", "greedy")}


def parse_points(text: str) -> tuple[str, dict[str, list[list[float]]]]:
    name, _, pairs = text.partition("=")
    sampled = [[int(v), float(s)] for v, s in (p.split(":") for p in pairs.split(","))]
    return name, {"sampled": sampled, "greedy": []}


def plot(runs: dict[str, dict[str, list[list[float]]]], png: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, curves in runs.items():
        (line,) = ax.plot(*zip(*curves["sampled"]), marker="o", label=f"{name}: sampled")
        if curves["greedy"]:
            ax.plot(*zip(*curves["greedy"]), marker="s", ls="", color=line.get_color(), alpha=0.6)
    ax.plot([], [], marker="s", ls="", color="grey", label="greedy (v0 and the last)")
    ax.set(xlabel="policy version (learner step)", ylabel="held-out success (256 tasks)", ylim=(0, 1.05))
    ax.set_title("SmolLM2-135M-Instruct, calculator: the main job's held-out curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", default=[], help="NAME=WORKDIR (repeatable)")
    p.add_argument("--points", action="append", default=[], help="NAME=V:S,V:S,... (sampled; repeatable)")
    p.add_argument("--from_json", help="replot a JSON this script wrote")
    p.add_argument("--json", help="write the curves here")
    p.add_argument("--png", required=True)
    args = p.parse_args()
    runs = json.loads(Path(args.from_json).read_text()) if args.from_json else {}
    for spec in args.run:
        name, _, workdir = spec.partition("=")
        runs[name] = read_run(workdir)
    runs.update(parse_points(spec) for spec in args.points)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    plot(runs, args.png)
    for name, curves in runs.items():
        print(f"| {name} | " + ", ".join(f"v{v} {s:.3f}" for v, s in curves["sampled"]) + " |")


if __name__ == "__main__":
    main()
