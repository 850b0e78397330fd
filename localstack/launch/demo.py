"""The main job on the embedded local stack: `make demo` (python -m localstack.launch.demo).

Starts the Pub/Sub emulator, the streaming rollout pipeline (BundleBasedDirectRunner)
and the learner as separate process groups, waits for the learner to finish, stops
everything (also on failure) and prints the learner's summary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from core import config
from core.contracts.record_shape import LayoutConfig
from core.contracts.run_summary import RunSummary
from core.contracts.store import LATEST
from core.sections import TelemetryDirs
from core.telemetry import trace
from core.telemetry.scalars import read_rows
from localstack.emulators.pubsub import PubSubEmulator
from localstack.launch import cluster, processes
from localstack.launch.commands import evaluator_command, learner_command, plan_command, rollout_command
from localstack.launch.demo_config import DemoConfig, main_job_learner, main_job_rollout, parse_args
from localstack.launch.plan import PlanConfig
from localstack.launch.processes import ProcessGroup
from localstack.reports import reconcile
from localstack.reports.heldout import final_scoring_budget_s, held_out_summary
from localstack.reports.live import Progress, learner_waiting
from localstack.reports.pass_at import pass_at_summary
from localstack.reports.summary import DemoSummary, print_summary
from pipelines.config import RolloutJobConfig
from rollout.evaluator import EvaluatorConfig
from trainer.config import LearnerJobConfig

TOPICS = {"requests": "rollout-requests", "records": "packed-trajectories", "dead": "dead-letters"}


class DemoFailed(RuntimeError):
    pass


def learner_config(cfg: DemoConfig, workdir: Path, topics: dict, subs: dict, store: Path, plan) -> LearnerJobConfig:
    """The learner's tree: the main job's preset and the user's `--learner.*`, the run-wide
    fields and the workdir's paths, with the plan's settings under the user's own."""
    learner = config.replace(
        config.launched(cfg, "learner"),
        requests_topic=topics["requests"],
        records_subscription=subs["records"],
        dead_letter_topic=topics["dead"],
        policy_root=str(store),
        summary_path=str(workdir / "summary.json"),
        checkpoint_dir=str(workdir / "checkpoints"),  # records are acked once one covers them
        data_dir=str(workdir / "datasets"),
    )
    if plan:
        learner = _plan_then_user(learner, plan["learner_flags"], cfg.learner, main_job_learner())
        learner = config.replace(learner, plan=str(workdir / "plan.json"))
    if cfg.learner_processes > 1 and not learner.mesh:  # the batch split over every process's device
        learner = config.replace(learner, mesh=f"data={cfg.learner_processes}")
    return learner


def rollout_config(cfg: DemoConfig, workdir: Path, topics: dict, subs: dict, store: Path, plan) -> RolloutJobConfig:
    rollout = config.replace(
        config.launched(cfg, "rollout"),
        requests_subscription=subs["requests"],
        records_topic=topics["records"],
        dead_letter_topic=topics["dead"],
        policy_root=str(store),
    )
    if plan:
        rollout = _plan_then_user(rollout, plan["pipeline_flags"], cfg.rollout, main_job_rollout())
    return rollout


def evaluator_config(cfg: DemoConfig, workdir: Path, store: Path) -> EvaluatorConfig:
    """Held-out evaluation, its own process: it reads the store, never the records topic."""
    return config.replace(
        cfg.evaluator,
        policy_root=str(store),
        out=str(workdir / "eval.jsonl"),
        # The learner's dataset, and its test split: one seed builds both splits, disjoint.
        data_dir=str(workdir / "datasets"),
        task_seed=cfg.learner.task_seed,
        stop_file=str(workdir / "final_version"),
        timeout_s=cfg.timeout_s + 600,
        max_tokens=cfg.layout.layout.trajectory_len,
    )


def _plan_then_user(tree, plan_flags: list[str], user, preset):
    """The plan's flags on `tree`, then what the user changed on the preset (the user wins)."""
    return config.parse(type(tree), [*plan_flags, *config.to_argv(user, base=preset)], base=tree)


def cpu_set(text: str | None) -> set[int] | None:
    return {int(c) for c in text.split(",")} if text else None


def planner_config(cfg: DemoConfig, out: Path) -> PlanConfig:
    """The planner's tree: the run-wide values, and the sections its measurement shares with
    the run (the learner's step memory and the rollout job's engine too)."""
    plan_cfg = config.build(PlanConfig, **config.forwarded(cfg, "planner"), out=str(out))
    return dataclasses.replace(
        plan_cfg,
        env=cfg.env,
        model=cfg.model,
        layout=cfg.layout,
        lora=cfg.lora,
        compute=cfg.learner.learner.compute,
        engine=cfg.rollout.engine,  # its episodes run as the rollout job's will
    )


def make_plan(cfg: DemoConfig, workdir: Path, env: dict) -> dict | None:
    """The capacity plan the run uses: measured now (auto), read from a file, or none."""
    if cfg.plan == "off":
        return None
    path = Path(cfg.plan) if cfg.plan != "auto" else workdir / "plan.json"
    if cfg.plan == "auto":
        plan_cfg = planner_config(cfg, path)
        with ProcessGroup(plan_command(plan_cfg), workdir / "plan.log", env, cpus=cpu_set(cfg.learner_cpus)) as planner:
            wait_for(planner, 900, "planner")
        PEAK_RSS["planner"] = planner.peak_rss
    plan = json.loads(path.read_text())
    (workdir / "plan.json").write_text(json.dumps(plan, indent=2))  # what the learner reads
    return plan


PEAK_RSS: dict[str, int] = {}  # this run's process groups' peak resident memory, bytes
RUNNING: dict[str, ProcessGroup] = {}  # the groups now running, whose peaks a failed run reports


def peak_rss_gb() -> dict[str, float]:
    """Every process group's peak resident memory so far, GB (the finished planner's too)."""
    peaks = dict(PEAK_RSS)
    for name, group in RUNNING.items():  # a restarted rollout job: the most of either
        peaks[name] = max(peaks.get(name, 0), group.peak_rss)
    return {name: round(v / 1e9, 2) for name, v in peaks.items() if v}


def run_local(cfg: DemoConfig) -> DemoSummary:
    started = time.monotonic()
    processes.start_watchdog()  # SIGKILL of this process must not leave the run behind either
    # Absolute: Orbax refuses a relative checkpoint path, and the children may run elsewhere.
    workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="agentic-rl-demo-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    summary_path, store = workdir / "summary.json", workdir / "policy-store"
    if not cfg.resume:  # the learner would otherwise resume from a previous run's checkpoint
        shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
    own_cpus = os.sched_getaffinity(0)
    if cfg.rollout_cpus:  # the emulator (a JVM) and everything else started here inherit it
        os.sched_setaffinity(0, cpu_set(cfg.rollout_cpus))
    try:
        summary = _run_pinned(cfg, started, workdir, summary_path, store)
    finally:
        os.sched_setaffinity(0, own_cpus)
        if cfg.trace and (workdir / "trace").is_dir():  # also after a failure: the timeline shows why
            trace.merge(workdir / "trace", workdir / "trace.json")
    (workdir / "run_summary.json").write_text(summary.to_json())  # what the report reads
    if not cfg.report:
        return summary
    try:  # the run's results stand without it: a broken report must not fail the run
        from localstack.reports import report

        summary.report = str(report.write_report(workdir))
    except Exception as e:
        print(f"warning: the run report failed: {type(e).__name__}: {e}", file=sys.stderr)
        summary.report = None
    return summary


def telemetry(cfg: DemoConfig, workdir: Path) -> DemoConfig:
    """Every process writes scalars under WORKDIR/logs (one TensorBoard run each) and,
    with --trace, spans under WORKDIR/trace (merged at the end)."""
    dirs = TelemetryDirs(str(workdir / "logs"), str(workdir / "trace") if cfg.trace else None)
    return dataclasses.replace(cfg, telemetry=dirs)


def _run_pinned(cfg: DemoConfig, started: float, workdir: Path, summary_path: Path, store: Path) -> DemoSummary:
    cfg = telemetry(cfg, workdir)
    plan = make_plan(cfg, workdir, {**os.environ, "JAX_PLATFORMS": "cpu"})
    with PubSubEmulator(log_dir=workdir / "emulator") as emu:
        topics = {k: emu.create_topic(v) for k, v in TOPICS.items()}
        subs = {k: emu.create_subscription(f"{v}-sub", v) for k, v in TOPICS.items()}
        # Where the run's topics are, for a person (or a test) who wants to look or publish.
        stack = {"host": emu.host, "project": emu.project, "topics": topics, "subscriptions": subs, "pid": emu.pid}
        (workdir / "emulator.json").write_text(json.dumps(stack, indent=2))
        env = {**os.environ, **emu.env(), "JAX_PLATFORMS": "cpu"}
        learner_cmd = learner_command(learner_config(cfg, workdir, topics, subs, store, plan))
        pipeline_cmd = rollout_command(rollout_config(cfg, workdir, topics, subs, store, plan), emu.project)
        eval_cmd = evaluator_command(evaluator_config(cfg, workdir, store))
        evaluating = cfg.evaluating
        with ExitStack() as running:
            progress = running.enter_context(Progress(workdir, cfg.max_steps, cfg.live))
            learners = [  # one, or several joined as on Vertex AI (localstack/launch/cluster.py)
                running.enter_context(ProcessGroup(learner_cmd, workdir / log, e, cpus=cpu_set(cfg.learner_cpus)))
                for log, e in cluster.learner_envs(cfg.learner_processes, env)
            ]
            learner = learners[0]
            RUNNING["learner"] = learner
            deadline = time.monotonic() + cfg.timeout_s + 60
            # The rollout side starts once policy v0 exists: until then it could only poll,
            # and on two cores that would slow the learner's warm start.
            while not (store / LATEST).exists() and learner.poll() is None and time.monotonic() < deadline:
                progress.update("warm start (behaviour cloning before policy v0)")
                time.sleep(0.5)
            pipeline = running.enter_context(ProcessGroup(pipeline_cmd, workdir / "pipeline.log", env))
            RUNNING["rollout job"] = pipeline
            evaluator = None
            if evaluating:
                evaluator = running.enter_context(ProcessGroup(eval_cmd, workdir / "evaluator.log", env))
                RUNNING["evaluator"] = evaluator
            restarts = {"pipeline": 0, "emulator": 0}
            while learner.poll() is None:
                # Preemptible parts: a dead emulator or rollout job is started again (their
                # lost requests are written off and redone by the learner's request timeout).
                if not emu.alive():
                    _may_restart(restarts, "emulator", cfg.max_restarts, emu.log_tail())
                    emu.restart()
                if pipeline.poll() is not None:
                    _may_restart(restarts, "pipeline", cfg.max_restarts, pipeline.log_tail())
                    log_path = workdir / f"pipeline-restart-{restarts['pipeline']}.log"
                    pipeline = running.enter_context(ProcessGroup(pipeline_cmd, log_path, env))
                    PEAK_RSS["rollout job"] = max(PEAK_RSS.get("rollout job", 0), RUNNING["rollout job"].peak_rss)
                    RUNNING["rollout job"] = pipeline
                if time.monotonic() > deadline:
                    raise DemoFailed(
                        f"learner still running after {cfg.timeout_s + 60}s (--timeout_s + 60); "
                        f"{waited_for(workdir, cfg.max_steps)}\n{learner.log_tail()}"
                    )
                # poll() samples its memory too. It exits only after the final version: a
                # dead one now is said now, not after the rest of the run.
                if evaluator is not None and evaluator.poll() is not None:
                    raise DemoFailed(f"evaluator {evaluator.exit_description()} while the learner trained:\n"
                                     f"{evaluator.log_tail()}")  # fmt: skip
                progress.update("training")
                time.sleep(0.5)
            if learner.poll() != 0:
                raise DemoFailed(f"learner {learner.exit_description()}:\n{learner.log_tail()}")
            if problems := cluster.wait_followers(learners[1:], 120):
                raise DemoFailed("\n".join(problems))
            if evaluating:  # score the final version too, then stop
                final = RunSummary.from_json(summary_path.read_text()).policy_versions_published[-1]
                (workdir / "final_version").write_text(str(final))
                budget = final_scoring_budget_s(read_rows(workdir / "eval.jsonl"))
                wait_for(evaluator, budget, "evaluator", lambda: progress.update("scoring the final version"))
    learned = RunSummary.from_json(summary_path.read_text())
    rows = read_rows(workdir / "eval.jsonl")
    rollout = reconcile.rollout_totals(workdir)  # the workers' last rows: written as they stopped
    pids = {"pipeline": pipeline.pid, "learner": learner.pid, **({"evaluator": evaluator.pid} if evaluating else {})}
    return DemoSummary(
        learned,
        held_out=held_out_summary(rows, cfg.target) if rows else {},
        eval_n=cfg.evaluator.n,
        pass_at=pass_at_summary(rows),
        plan=plan and {"settings": plan["plan"], "predicted": plan["predicted"]},
        demo_wall_s=round(time.monotonic() - started, 1),
        workdir=str(workdir),
        restarts=restarts,
        reconciliation=None if rollout is None else reconcile.reconcile(learned.accounting, rollout, cfg.group_size),
        pids=pids,
        report=None,
        peak_rss_gb=peak_rss_gb(),
    )


def waited_for(workdir: Path, max_steps: int) -> str:
    """What the run was waiting for when it gave up: the learner's step, and why it had no
    records if it said so."""
    rows = read_rows(workdir / "logs" / "learner" / "metrics.jsonl")
    step = rows[-1]["step"] if rows else 0
    text = f"it had trained {step} of {max_steps} steps"
    if not (workdir / "policy-store" / LATEST).exists():
        return text + ", and was still in its warm start (no policy v0)"
    why = learner_waiting(workdir)
    return text + (f"; the learner was waiting for records: {why}" if why else "")


def _may_restart(restarts: dict, name: str, limit: int, log_tail: str) -> None:
    """Counts a restart of `name`, or fails the run once it has used `limit` of them."""
    if restarts[name] >= limit:
        raise DemoFailed(f"the {name} died again after {limit} restarts (--max_restarts):\n{log_tail}")
    restarts[name] += 1
    print(f"warning: the {name} died; starting it again ({restarts[name]}/{limit})", file=sys.stderr, flush=True)


def wait_for(proc: ProcessGroup, timeout_s: float, name: str, tick=lambda: None) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise DemoFailed(f"{name} still running after {timeout_s}s:\n{proc.log_tail()}")
        tick()
        time.sleep(0.5)
    if proc.poll() != 0:
        raise DemoFailed(f"{name} {proc.exit_description()}:\n{proc.log_tail()}")


class Stopped(BaseException):
    """SIGTERM or SIGHUP: unwind like an exception, so every `with` stops what it started."""


def _stop_on_signal(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def with_model_layout(cfg: DemoConfig) -> DemoConfig:
    """With --model and no layout flags, the record layout the checkpoint and the environment
    need (refused, saying why, when its context cannot hold an episode)."""
    if not cfg.model.checkpoint or cfg.layout != LayoutConfig():
        return cfg
    from localstack.launch.model_layout import layout_for_model

    turn = cfg.turn.max_new_tokens_per_turn
    found = layout_for_model(
        cfg.model.checkpoint,
        cfg.env.name,
        turn,
        group_size=cfg.group_size,
        env_config={**cfg.env.config, "tool_latency": "none"},
        oracle_style=cfg.warmstart.oracle,
    )
    print(found.describe(), flush=True)
    return dataclasses.replace(cfg, layout=found.layout)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    # A job timeout, a closed terminal or a supervisor sends these: without a handler the
    # process would die at once and leave the emulator, pipeline and learner running.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_on_signal)
    try:
        cfg = with_model_layout(cfg)
    except (ValueError, KeyError, FileNotFoundError) as e:  # before anything starts
        print(f"demo refused: {e}", file=sys.stderr)
        return 2
    try:
        summary = run_local(cfg)
    except DemoFailed as e:
        print(f"demo failed: {e}", file=sys.stderr)
        if peaks := peak_rss_gb():
            print("peak resident memory: " + ", ".join(f"{k} {v:.2f} GB" for k, v in peaks.items()), file=sys.stderr)
        return 1
    except Stopped as e:
        print(f"demo stopped by {e}; everything it started is stopped", file=sys.stderr)
        return 128 + getattr(signal, str(e)).value
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
