"""The lag controller in a world that changes: the demo with the closed loop on, its tools'
latency switched mid-run or a second rollout job joining and leaving (Dataflow scaling out
and in), and how many versions the realised lag takes to come back.

    .venv/bin/python benchmarks/lag_control.py --latencies fixed:0.5,fixed:2,fixed:0.5 --every 6
    .venv/bin/python benchmarks/lag_control.py --latencies fixed:2,fixed:2,fixed:2 --jobs 1,2,1
    .venv/bin/python benchmarks/lag_control.py --latencies fixed:2            # no change: steady state
    .venv/bin/python benchmarks/lag_control.py --analyse WORKDIR               # a finished demo's lag

The demo (`localstack.launch.demo`, the byte model on the calculator unless --demo_flags say
otherwise) runs with `--tool_latency file:PATH` (environments/latency.py): this script
writes the first latency there, then the next one each time the learner has published
--every more versions, watching its metrics. With --jobs, each phase runs that many rollout
jobs: the extra ones are copies of the demo's own (its command, environment and cores),
subscribed to the same requests, started at the phase's start and stopped (SIGTERM, as a
scale-in or a preemption) at its end; what they held is written off and redone by the
learner's request timeout. The learner holds --lag_target with the
loop (trainer/learning/data/lag_control.py), from the window the plan (or --max_in_flight)
gives it.

Per phase: the target, the realised lag per version (the mean staleness of the records its
steps trained), and the versions from the change until the lag is within ±15 % of the
target for 3 versions running. Writes lag_control.json and lag_control.png (lag, window and
in flight, held-out success against time, each change marked) into --out.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import machine_info, print_table, stop_children_on_exit

from core import config
from core.config import configclass, knob
from core.telemetry.scalars import read_rows
from localstack.launch import demo as demo_module
from localstack.launch.demo import cpu_set, run_local
from localstack.launch.demo_config import parse_args
from localstack.launch.processes import ProcessGroup
from localstack.reports.heldout import curve

BAND, RUNNING = 0.15, 3  # within ±15 % of the target, 3 versions running: settled


@configclass
class LagBenchConfig:
    latencies: str = knob("fixed:0.5,fixed:2,fixed:0.5", "the tools' latency, phase by phase")
    jobs: str = knob("", "rollout jobs running, phase by phase (comma-separated; empty: 1 in each)")
    every: int = knob(6, "versions a phase lasts (the last lasts the rest of the run)", ge=1)
    lag_target: float = knob(2.0, "the mean lag the learner's loop holds", gt=0)
    max_staleness: int = knob(4, "the hard cap on a record's lag", ge=1)
    demo_flags: str = knob("", "more demo flags (e.g. '--max_steps=60 --plan=auto')")
    workdir: str = knob("/tmp/lag_control", "the run's workdir")
    out: str = knob("docs/results", "where lag_control.json and .png go")
    analyse: str | None = knob(None, "only read a finished demo's workdir: its lag per version against its target")

    def __post_init__(self):
        counts = self.jobs.split(",") if self.jobs else []
        phases = len(self.latencies.split(","))
        if counts and (len(counts) != phases or not all(c.isdigit() and int(c) >= 1 for c in counts)):
            raise ValueError(f"--jobs needs one count >= 1 per phase of --latencies ({phases}), got {self.jobs!r}")

    @property
    def job_counts(self) -> list[int]:
        """Rollout jobs in each phase (1 in each when --jobs is empty)."""
        return [int(n) for n in self.jobs.split(",")] if self.jobs else [1] * len(self.latencies.split(","))


class WorldSwitch(threading.Thread):
    """Moves to the next phase once the learner has published `every` more versions: writes
    its latency into the file and starts or stops extra rollout jobs (copies of the demo's);
    keeps when (learner wall s) and at which version each change came."""

    def __init__(self, path: Path, latencies: list[str], jobs: list[int], every: int, metrics: Path, cpus):
        super().__init__(daemon=True)
        self.path, self.latencies, self.jobs, self.every, self.metrics = path, latencies, jobs, every, metrics
        self.cpus = cpus
        self.switches: list[dict] = []
        self.extra: list[ProcessGroup] = []
        self.done = threading.Event()
        path.write_text(latencies[0])

    def run(self):
        phase = 0
        while not self.done.is_set() and phase + 1 < len(self.latencies):
            rows = read_rows(self.metrics) if self.metrics.exists() else []
            version = max((r.get("policy/version", 0) for r in rows), default=0)
            if version >= (phase + 1) * self.every:
                phase += 1
                self.path.write_text(self.latencies[phase])
                self.set_jobs(self.jobs[phase])
                wall = rows[-1].get("perf/wall_s") if rows else None
                latency, jobs = self.latencies[phase], self.jobs[phase]
                self.switches.append({"version": version, "wall_s": wall, "latency": latency, "jobs": jobs})
                print(f"--- v{version}: tools now {latency}, {jobs} rollout job(s)", flush=True)
            self.done.wait(0.5)

    def set_jobs(self, n: int) -> None:
        """1 + the extra jobs running: a copy of the demo's rollout job per missing one, the
        newest stopped first."""
        own = demo_module.RUNNING.get("rollout job")
        while 1 + len(self.extra) < n and own is not None:
            log = self.path.parent / f"extra-rollout-{len(self.switches)}-{len(self.extra)}.log"
            self.extra.append(ProcessGroup(own.cmd, log, own.env, cpus=self.cpus).start())
        while 1 + len(self.extra) > n:
            self.extra.pop().stop(term_grace_s=30)

    def stop(self) -> None:
        self.done.set()
        self.set_jobs(1)


def per_version_lag(steps: list[dict]) -> dict[int, float]:
    """The mean staleness of the records trained on each version (steps weighted alike). A
    row's policy/version is the newest after its step's publish: the version a step trained
    on is the one before it."""
    out: dict[int, list[float]] = {}
    trained_on = 0
    for r in steps:
        if "staleness/mean" in r and "policy/version" in r:
            out.setdefault(trained_on, []).append(r["staleness/mean"])
            trained_on = int(r["policy/version"])
    return {v: sum(xs) / len(xs) for v, xs in sorted(out.items())}


def mean_after(lags: dict[int, float], skip: int = 5) -> float | None:
    """The realised mean lag over the versions after the first `skip` (the must-show's)."""
    xs = [x for v, x in lags.items() if v > skip]
    return round(sum(xs) / len(xs), 3) if xs else None


def settled_after(lags: dict[int, float], start: int, end: int | None, target: float) -> int | None:
    """Versions from `start` until the lag is within the band for RUNNING versions running
    (counted to the first of them), within [start, end); None if never."""
    run = 0
    for v in sorted(lags):
        if v < start or (end is not None and v >= end):
            continue
        run = run + 1 if abs(lags[v] - target) <= BAND * target else 0
        if run == RUNNING:
            return v - RUNNING + 1 - start
    return None


def phases(switches: list[dict], latencies: list[str], jobs: list[int], lags: dict[int, float], target: float):
    starts = [0, *(s["version"] for s in switches)]
    out = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else None
        mine = [lag for v, lag in lags.items() if v >= start and (end is None or v < end)]
        out.append({
            "latency": latencies[i],
            "jobs": jobs[i],
            "from_version": start,
            "to_version": end,
            "mean_lag": round(sum(mine) / len(mine), 3) if mine else None,
            "versions_to_settle": settled_after(lags, start, end, target),
        })  # fmt: skip
    return out


def plot(result: dict, steps: list[dict], held: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["perf/wall_s"] for r in steps]
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    target = result["lag_target"]
    ax[0].plot(t, [r.get("staleness/mean", 0) for r in steps], ".-", label="mean lag of the step's records")
    ax[0].axhspan(target * (1 - BAND), target * (1 + BAND), alpha=0.2, label=f"target {target:g} ± 15 %")
    ax[0].set_ylabel("versions")
    ax[1].plot(t, [r.get("feeder/window", 0) for r in steps], label="credit window")
    ax[1].plot(t, [r.get("feeder/in_flight", 0) for r in steps], alpha=0.6, label="in flight")
    ax[1].set_ylabel("trajectories")
    version_at = {}
    for r in steps:
        version_at.setdefault(r["policy/version"], r["perf/wall_s"])
    pts = [(version_at[p["version"]], p["success"]) for p in held if p["version"] in version_at]
    ax[2].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="held-out sampled success")
    ax[2].set_ylabel("success")
    ax[2].set_xlabel("learner wall s")
    for a in ax:
        for s in result["switches"]:
            if s["wall_s"] is not None:
                a.axvline(s["wall_s"], color="k", ls="--", lw=0.8)
        a.legend(fontsize=7, loc="upper left")
    jobs = f", rollout jobs {result['jobs']}" if any(n != 1 for n in result["jobs"]) else ""
    ax[0].set_title(f"lag control, tools {result['latencies']}{jobs} (dashed: a change)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def analyse(workdir: Path) -> int:
    """A finished demo (`make demo`, the loop on by its plan): the lag per version, the mean
    after v5 against the target and the loop's changes."""
    lag = json.loads((workdir / "summary.json").read_text()).get("lag_control") or {}  # the learner's summary
    target = lag.get("target")
    steps = [r for r in read_rows(workdir / "logs" / "learner" / "metrics.jsonl") if "perf/wall_s" in r]
    lags = per_version_lag(steps)
    mean = mean_after(lags)
    print(f"{workdir}: lag per version " + ", ".join(f"v{v} {x:.2f}" for v, x in lags.items()))
    off = f" ({(mean - target) / target:+.1%} of target {target:g})" if target and mean is not None else ""
    print(f"mean lag after v5: {mean}{off}; window {lag.get('window')} in [{lag.get('floor')}, {lag.get('ceiling')}]")
    for c in lag.get("changes", []):
        print(f"  v{c['version']}: {c['reason']}")
    return 0


def main(argv=None) -> int:
    args = config.parse(LagBenchConfig, argv)
    if args.analyse:
        return analyse(Path(args.analyse))
    stop_children_on_exit()
    latencies = args.latencies.split(",")
    jobs = args.job_counts
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "latency").write_text(latencies[0])  # the demo's config checks the file exists
    demo = parse_args([
        f"--workdir={work / 'demo'}", f"--tool_latency=file:{work / 'latency'}", "--live=off",
        f"--learner.lag_target={args.lag_target:g}", f"--learner.max_staleness={args.max_staleness}",
        *args.demo_flags.split(),
    ])  # fmt: skip
    metrics = work / "demo" / "logs" / "learner" / "metrics.jsonl"
    switch = WorldSwitch(work / "latency", latencies, jobs, args.every, metrics, cpu_set(demo.rollout_cpus))
    switch.start()
    print(f"--- localstack.launch.demo {' '.join(config.to_argv(demo))}", flush=True)
    t0 = time.monotonic()
    try:
        summary = run_local(demo)
    finally:
        switch.stop()
    steps = [r for r in read_rows(metrics) if "perf/wall_s" in r]
    lags = per_version_lag(steps)
    result = {
        "command": "python benchmarks/lag_control.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(),
        "started": time.strftime("%F %T", time.gmtime(time.time() - (time.monotonic() - t0))),
        "latencies": latencies,
        "jobs": jobs,
        "lag_target": args.lag_target,
        "switches": switch.switches,
        "lag_by_version": {str(v): round(x, 3) for v, x in lags.items()},
        "phases": phases(switch.switches, latencies, jobs, lags, args.lag_target),
        "mean_lag_after_v5": mean_after(lags),
        "lag_control": summary.learner.lag_control,
        "held_out": curve(read_rows(work / "demo" / "eval.jsonl"), "sampled") if summary.held_out else [],
        "demo_wall_s": summary.demo_wall_s,
        # Nothing lost when a job leaves: what it held is written off and requested again.
        "accounting": dataclasses.asdict(summary.learner.accounting) if summary.learner.accounting else None,
        "reconciliation": dataclasses.asdict(summary.reconciliation) if summary.reconciliation else None,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lag_control.json").write_text(json.dumps(result, indent=2, default=str))
    plot(result, steps, result["held_out"], out / "lag_control.png")
    print_table(
        f"lag control: target {args.lag_target:g}, ±{BAND:.0%}, settled = {RUNNING} versions running within",
        ["phase", "tools", "rollout jobs", "versions", "mean lag", "versions from the change to settled"],
        [
            [i, p["latency"], p["jobs"], f"{p['from_version']}-{'end' if p['to_version'] is None else p['to_version']}",
             p["mean_lag"], p["versions_to_settle"] if p["versions_to_settle"] is not None else "not settled"]
            for i, p in enumerate(result["phases"])
        ],
    )  # fmt: skip
    changes = (summary.learner.lag_control or {}).get("changes", [])
    print(f"{len(changes)} window changes: " + "; ".join(f"v{c['version']} {c['old']}->{c['new']}" for c in changes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
