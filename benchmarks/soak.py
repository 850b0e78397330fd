"""Soak: run the main job (`localstack.launch.demo`) for a wall-clock duration and watch for leaks.

    .venv/bin/python benchmarks/soak.py --minutes 20 --out runs/soak -- --init_policy STORE --eval_n 64
    .venv/bin/python benchmarks/soak.py --report_only runs/soak      # rebuild report and plot
    # a real checkpoint (`make real-model`) with LoRA: its recipe, one record a step
    .venv/bin/python benchmarks/soak.py --minutes 30 --out runs/soak-smol -- \
        --model ~/.cache/agentic-rl/models/SmolLM2-135M-Instruct --lora_rank 8 --batch_records 1 --eval_n 16

Flags after `--` go to the demo. The soak gives the demo a step budget it cannot reach and
a learner timeout past the duration, then SIGTERMs it at the end: the demo turns SIGTERM
into its normal teardown and exits 143, the expected ending here. Every --every_s it samples
each process of the demo's tree (psutil: RSS, threads, fds, CPU %, summed per role) and the
processes' telemetry JSONL under WORKDIR/logs (backlog, accounting counters), appending one
flat row to OUT/soak_samples.jsonl. At the end (however it ends) it stops the demo, checks
that no process of the run survives, and writes OUT/soak_report.md and OUT/soak.png
(benchmarks/_soak_report.py holds the thresholds and verdicts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _jvm_probe as jvm
import _soak_report as report
import psutil

from core import config
from core.config import configclass, derived, knob
from localstack.reports.live import Tail

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10**8  # a budget the learner cannot finish, so the duration decides
TIMEOUT_PAST_S = 1800  # the learner's --timeout_s is the duration plus this (its own give-up)
STOP_GRACE_S = 300  # the demo's teardown: three process groups, the JVM and the trace merge
SURVIVOR_WAIT_S = 15  # the watchdog and JVM take a moment to go after the demo exits


class Interrupted(BaseException):
    """SIGTERM or SIGHUP to the soak: unwind through `finally` like Ctrl-C does."""


def _interrupt(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


@configclass
class SoakConfig:
    minutes: float = knob(20.0, "wall-clock duration of the run")
    every_s: float = knob(5.0, "seconds between samples")
    jvm_gc_every_s: float = knob(300.0, "seconds between the emulator JVM's forced GC + heap reading (0: never)")
    out: str | None = knob(None, "samples, report and plot (unset: runs/soak-TIMESTAMP)")
    workdir: str | None = knob(None, "the demo's --workdir (unset: OUT/workdir)")
    report_only: str | None = knob(None, "rebuild report and plot from this OUT's samples")
    tracemalloc: int = knob(
        0,
        "frames per site: the rollout workers and the evaluator trace Python's allocations and write "
        "WORKDIR/logs/<process>/tracemalloc.txt, the sites grown most since their first sample (0: off)",
        ge=0,
    )
    gc_types: bool = knob(
        False,
        "the rollout workers, the evaluator and the learner count their objects by type into that file "
        "(no tracing cost; diagnosis only: on CPython < 3.13 walking every object can break another "
        "thread's tuple(...) with a SystemError, core/process_memory.py)",
    )
    demo_flags: tuple[str, ...] = derived((), "the flags after `--`, for the demo")


def parse_args(argv) -> SoakConfig:
    i = argv.index("--") if "--" in argv else len(argv)
    cfg = config.parse(SoakConfig, argv[:i], description=__doc__)
    return dataclasses.replace(cfg, demo_flags=tuple(argv[i + 1 :]))


# -- the process tree ----------------------------------------------------------------------
def role_of(proc: psutil.Process, demo_pid: int) -> str:
    if proc.pid == demo_pid:
        return "demo"
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    line = " ".join(cmd)
    for module, role in (
        ("trainer.task", "learner"),
        ("pipelines.job", "rollout"),
        ("rollout.evaluator", "evaluator"),
        ("localstack.launch.plan", "planner"),
        ("localstack.launch.watchdog", "watchdog"),
    ):
        if module in line:
            return role
    # The emulator: gcloud's Python wrapper, its shell launcher and the JVM.
    if cmd and (Path(cmd[0]).name == "java" or "gcloud" in line or "pubsub-emulator" in line):
        return "emulator"
    return "other"


class TreeSampler:
    """RSS, threads, fds and CPU % of the demo's process tree, summed per role."""

    def __init__(self, demo_pid: int):
        self.demo_pid = demo_pid
        self.procs: dict[tuple[int, float], psutil.Process] = {}  # kept so cpu_percent has an interval
        self.seen: dict[tuple[int, float], str] = {}  # every process of the run: (pid, start) -> role

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.demo_pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def sample(self) -> dict:
        row: dict[str, float] = {}
        now: set = set()
        for fresh in self.tree():
            try:
                key = (fresh.pid, fresh.create_time())
                proc = self.procs.setdefault(key, fresh)
                with proc.oneshot():
                    role = self.seen.get(key) or role_of(proc, self.demo_pid)
                    first = key not in self.seen
                    vals = {
                        "rss_mb": proc.memory_info().rss / 2**20,
                        "threads": proc.num_threads(),
                        "fds": proc.num_fds(),
                        "cpu_pct": proc.cpu_percent(None),  # since the last sample; 0.0 on first sight
                        "procs": 1,
                    }
                self.seen[key] = role
                now.add(key)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            if first:
                del vals["cpu_pct"]  # no interval yet: absent, not zero
            for name, v in vals.items():
                for r in (role, "all"):
                    row[f"{name}/{r}"] = row.get(f"{name}/{r}", 0) + v
        self.procs = {k: p for k, p in self.procs.items() if k in now}  # exited ones go
        return {k: round(v, 2) for k, v in row.items()}


# -- the telemetry files -------------------------------------------------------------------
def _num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class TelemetrySampler:
    """The newest learner and rollout rows (localstack.reports.live.Tail: new lines only, so a long
    run does not reread its files), folded into backlog, counters and dedup sizes."""

    def __init__(self, workdir: Path, group_size: int):
        self.logs, self.group_size = workdir / "logs", group_size
        self.tails: dict[Path, Tail] = {}
        self.learner: dict = {}
        self.rollout: dict[str, dict] = {}
        self.trained: int | None = None  # sum of data/batch_trajectories over every learner row
        self.evals = 0

    def _rows(self, path: Path) -> list[dict]:
        return self.tails.setdefault(path, Tail(path)).rows()

    def refresh(self) -> None:
        for row in self._rows(self.logs / "learner" / "metrics.jsonl"):
            self.learner = row
            if _num(row.get("data/batch_trajectories")):
                self.trained = (self.trained or 0) + row["data/batch_trajectories"]
        for path in sorted(self.logs.glob("rollout-*/metrics.jsonl")):
            for row in self._rows(path):
                self.rollout[path.parent.name] = row
        self.evals += len(self._rows(self.logs.parent / "eval.jsonl"))

    def _l(self, key: str):
        v = self.learner.get(key)
        return v if _num(v) else None

    def _r(self, key: str):
        vals = [r[key] for r in self.rollout.values() if _num(r.get(key))]
        return sum(vals) if vals else None

    def sample(self) -> dict:
        self.refresh()
        L, R = self._l, self._r
        packed, received, published, episodes = (
            R("rollout/records"),
            L("data/records_received"),
            L("feeder/requests_published"),
            R("rollout/episodes"),
        )
        trained = L("data/trajectories_trained")  # a field the learner may add; else our running sum
        row = {
            "backlog/records_waiting": None if packed is None or received is None else packed - received,
            "backlog/learner_buffered": L("data/records_buffered"),
            "backlog/learner_held_unacked": L("data/records_held_unacked"),  # where the learner writes it
            "backlog/feeder_in_flight": L("feeder/in_flight"),
            "backlog/requested_not_finished": (
                None if published is None or episodes is None else published * self.group_size - episodes
            ),
            "backlog/episodes_running": R("rollout/episodes_in_flight"),
            "counter/learner_steps": self.learner.get("step"),
            "counter/policy_version": L("policy/version"),
            "counter/requests_published": published,
            "counter/episodes_finished": episodes,
            "counter/records_packed": packed,
            "counter/records_received": received,
            "counter/trajectories_received": L("data/trajectories_received"),
            "counter/trajectories_trained": trained if trained is not None else self.trained,
            "counter/evals": self.evals or None,
            "counter/dropped_stale": L("data/records_dropped_stale"),
            "counter/duplicates": L("data/records_duplicate"),
            "counter/dead_letters_learner": L("data/records_dead_lettered"),
            "counter/dead_letters_rollout": R("rollout/dead_letters"),
            "counter/bad_requests": R("rollout/bad_requests"),
            "counter/pubsub_errors": L("data/pubsub_errors"),
        }
        # Any dedup/consumed-id set size a process reports (e.g. data/dedup_ids), by its own name.
        for k in self.learner:
            if "dedup" in k and _num(self.learner[k]):
                row[f"dedup/learner_{k.split('/')[-1]}"] = self.learner[k]
        for k in {k for r in self.rollout.values() for k in r if "dedup" in k}:
            row[f"dedup/rollout_{k.split('/')[-1]}"] = R(k)
        return {k: v for k, v in row.items() if v is not None}  # missing fields stay absent


# -- the run -------------------------------------------------------------------------------
def survivors(seen: dict, workdir: Path, out: Path) -> list[str]:
    """Processes of the run still alive: seen in the tree (same pid and start time) or
    naming the workdir or OUT in their command line."""
    # Not this process nor its ancestors: a wrapper (timeout, a shell) also names OUT.
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = {}
    for (pid, started), role in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                found[pid] = f"{pid} {role}"
        except psutil.NoSuchProcess:
            pass
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        line = " ".join(p.info["cmdline"] or [])
        if (
            p.pid not in mine
            and p.info["status"] != psutil.STATUS_ZOMBIE
            and (str(workdir) in line or str(out) in line)
        ):
            found.setdefault(p.pid, f"{p.pid} {line[:100]}")
    return sorted(found.values())


def stop_demo(demo: subprocess.Popen) -> str:
    """SIGTERM the demo's group (its children run in groups of their own, which the demo's
    teardown stops); SIGKILL after the grace period, when the demo's watchdog takes over."""
    if demo.poll() is not None:
        return f"the demo exited by itself with {demo.returncode} before the soak stopped it"
    began = time.monotonic()
    try:
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()
        return f"SIGTERM not obeyed within {STOP_GRACE_S} s: SIGKILLed (its watchdog stops the rest)"
    except ProcessLookupError:
        demo.wait()
    if demo.returncode == 128 + signal.SIGTERM:
        took = time.monotonic() - began
        return f"stopped by the soak's SIGTERM: the demo's teardown took {took:.1f} s (exit 143, as expected)"
    return f"SIGTERMed by the soak, but the demo exited with {demo.returncode}"


def run(args) -> int:
    from localstack.launch.commands import demo_command
    from localstack.launch.demo_config import DemoConfig

    out = Path(args.out or ROOT / "runs" / time.strftime("soak-%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir or out / "workdir").resolve()
    duration_s = args.minutes * 60
    ours = config.build(DemoConfig, workdir=str(workdir), max_steps=STEPS, timeout_s=duration_s + TIMEOUT_PAST_S)
    demo_cfg = config.parse(DemoConfig, list(args.demo_flags), prog="agentic-rl demo", base=ours)  # the caller's win
    cmd = demo_command(demo_cfg)
    meta = {
        "command": shlex.join(cmd),
        "workdir": str(workdir),
        "every_s": args.every_s,
        "minutes": args.minutes,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (out / "soak_meta.json").write_text(json.dumps(meta, indent=2))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    samples, how, demo, tree = [], "the soak failed before the demo started", None, None
    try:
        with open(out / "demo.log", "wb") as log:
            env = {**os.environ, **({"AGENTIC_RL_TRACEMALLOC": str(args.tracemalloc)} if args.tracemalloc else {})}
            env.update({"AGENTIC_RL_GC_TYPES": "1"} if args.gc_types else {})
            demo = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        print(f"soak: demo pid {demo.pid}, {args.minutes} min, log {out / 'demo.log'}", flush=True)
        tree, tel = TreeSampler(demo.pid), TelemetrySampler(workdir, demo_cfg.group_size)
        started, next_gc_t = time.monotonic(), 60.0  # the first heap reading after start-up
        with open(out / "soak_samples.jsonl", "w", buffering=1) as f:
            while (t := time.monotonic() - started) < duration_s and demo.poll() is None:
                row = {"t": round(t, 2), "wall_time": round(time.time(), 3), **tree.sample(), **tel.sample()}
                if args.jvm_gc_every_s and t >= next_gc_t and (pid := jvm.java_pid(tree.seen)):
                    row.update(jvm.heap_after_gc(pid))
                    next_gc_t = t + args.jvm_gc_every_s
                samples.append(row)
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
                if len(samples) % max(int(60 / args.every_s), 1) == 0:
                    steps, rss = row.get("counter/learner_steps", "-"), row.get("rss_mb/all", 0)
                    print(f"soak: {t / 60:5.1f} min  learner step {steps}  tree RSS {rss:.0f} MB", flush=True)
                time.sleep(max(args.every_s - (time.monotonic() - started - t), 0))
        how = "the duration ended" if demo.poll() is None else f"the demo ended early, at {t / 60:.1f} min"
    except (KeyboardInterrupt, Interrupted) as e:
        how = f"the soak was interrupted ({type(e).__name__} {e})"
    except Exception as e:
        how = f"the soak failed: {type(e).__name__}: {e}"
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the teardown itself must finish
            signal.signal(sig, signal.SIG_IGN)
        if demo is not None:
            how = f"{how}; {stop_demo(demo)}"
        deadline = time.monotonic() + SURVIVOR_WAIT_S
        while (left := survivors(tree.seen if tree else {}, workdir, out)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for entry in left:  # ours by pid and start time, or by our paths in their command line
            try:
                psutil.Process(int(entry.split()[0])).kill()
            except psutil.NoSuchProcess:
                pass
        meta["ending"] = {"how": how, "demo_rc": demo.returncode if demo else None, "survivors": left}
        (out / "soak_meta.json").write_text(json.dumps(meta, indent=2))
        text = report.write_report(out, samples, meta)
        report.plot(out, samples)
        print(text, flush=True)
        print(f"soak: report {out / 'soak_report.md'}, plot {out / 'soak.png'}", flush=True)
    ok = (
        demo is not None
        and demo.returncode in (0, 128 + signal.SIGTERM)
        and not left
        and how.startswith("the duration ended")
    )
    return 0 if ok else 1


def report_only(out: Path) -> int:
    samples = report.load_samples(out / "soak_samples.jsonl")
    meta_path = out / "soak_meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    print(report.write_report(out, samples, meta))
    report.plot(out, samples)
    return 0


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.report_only:
        return report_only(Path(args.report_only))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
