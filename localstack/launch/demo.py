"""The main job on the embedded local stack: `make demo` (python -m localstack.launch.demo).

Starts the Pub/Sub emulator, the streaming rollout pipeline (BundleBasedDirectRunner)
and the learner as separate process groups, waits for the learner to finish, stops
everything (also on failure) and prints the learner's summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from core.contracts.record_shape import RecordLayout
from core.contracts.store import LATEST
from core.telemetry import trace
from core.telemetry.scalars import read_rows
from localstack.emulators.pubsub import PubSubEmulator
from localstack.launch import processes
from localstack.launch.processes import ProcessGroup
from localstack.reports import reconcile
from localstack.reports.heldout import held_out_summary
from localstack.reports.live import Progress
from localstack.reports.summary import print_summary

TOPICS = {"requests": "rollout-requests", "records": "packed-trajectories", "dead": "dead-letters"}


class DemoFailed(RuntimeError):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workdir", default=None, help="logs, policy store and summary (default: a temp dir)")
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--publish_every", type=int, default=2)
    p.add_argument("--keep_versions", type=int, default=5, help="policy versions kept in the store")
    p.add_argument("--batch_records", type=int, default=4, help="records per learner step (up to 16 episodes each)")
    p.add_argument("--group_size", type=int, default=8, help="episodes per prompt (GRPO group)")
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument(
        "--keep_zero_signal",
        action="store_true",
        help="also train on groups whose rewards are all equal (they carry no gradient, only dilute it)",
    )
    p.add_argument("--env", default="calculator", help="calculator, guess or code (any registered name)")
    p.add_argument(
        "--tool_latency", default="fixed:0.5", help="per tool call: none, fixed:S, uniform:A:B, lognormal:M:S"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the learner checkpoint a previous run left in --workdir (default: start afresh)",
    )
    p.add_argument(
        "--max_restarts",
        type=int,
        default=3,
        help="times a dead rollout pipeline, and a dead Pub/Sub emulator, is started again (0: fail the run)",
    )
    p.add_argument("--policy_poll_s", type=float, default=0.5)
    p.add_argument("--max_wait_s", type=float, default=1.0)
    p.add_argument("--timeout_s", type=float, default=900.0)
    p.add_argument(
        "--sync",
        action="store_true",
        help="the synchronous baseline (trainer.task --sync): one round of rollouts per policy version",
    )
    p.add_argument(
        "--warmstart_steps",
        type=int,
        default=2800,
        help="behaviour cloning on oracle episodes before v0, so RL starts with signal",
    )
    p.add_argument("--warmstart_batch", type=int, default=16)
    p.add_argument("--warmstart_tasks", type=int, default=12000, help="distinct train tasks the demonstrations use")
    p.add_argument(
        "--warmstart_direct_frac",
        type=float,
        default=0.5,
        help="share of demonstrations that answer at once instead of calling the tool: RL learns to call",
    )
    p.add_argument("--eval_n", type=int, default=256, help="held-out test tasks per evaluated version (0: off)")
    p.add_argument("--eval_modes", default="sampled,greedy", help="sampled (temperature 1) and/or greedy")
    p.add_argument("--eval_nice", type=int, default=10, help="the evaluator's CPU niceness (it skips versions)")
    p.add_argument("--target", type=float, default=0.9, help="held-out success the summary reports reaching")
    p.add_argument(
        "--plan",
        default="auto",
        help="auto: run localstack.launch.plan first and use its credits, staleness bound and engine "
        "concurrency; a plan JSON to use; off: the learner's and pipeline's own defaults",
    )
    p.add_argument("--target_duty", type=float, default=0.95, help="the learner duty cycle the plan aims at")
    p.add_argument("--rollout_rate", type=float, default=None, help="for the plan: measured rollout ceiling")
    p.add_argument("--learner_cpus", default=None, help="pin the learner (and the planner) to these cores, e.g. 0")
    p.add_argument("--rollout_cpus", default=None, help="pin the emulator, pipeline and evaluator, e.g. 1")
    p.add_argument("--init_policy", default=None, help="start RL from this policy store's newest version")
    p.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record every process's spans and merge them into WORKDIR/trace.json (Perfetto)",
    )
    p.add_argument("--live", choices=("auto", "panel", "lines", "off"), default="auto", help="progress while it runs")
    p.add_argument("--learner_flags", default="", help="extra flags for trainer.task, e.g. '--learning_rate=0'")
    p.add_argument("--pipeline_flags", default="", help="extra flags for pipelines.rollout")
    args = p.parse_args(argv)
    if args.max_restarts < 0:
        p.error(f"--max_restarts must be >= 0, got {args.max_restarts}")
    for flag in ("learner_cpus", "rollout_cpus"):  # refused here, not once the watchdog runs
        text = getattr(args, flag)
        if text is None:
            continue
        cores = [c.strip() for c in text.split(",")]
        if not all(c.isdigit() and int(c) < (os.cpu_count() or 1) for c in cores):
            p.error(f"--{flag} must be comma-separated core numbers below {os.cpu_count()}, got {text!r}")
    return args


def rollout_command(project: str, requests_sub: str, records_topic: str, dead_topic: str, store, flags) -> list[str]:
    """The streaming rollout job on the local runner, with the contract's record layout."""
    return [
        sys.executable,
        "-m",
        "pipelines.rollout",
        "--runner=BundleBasedDirectRunner",
        "--streaming",
        f"--project={project}",
        f"--requests_subscription={requests_sub}",
        f"--records_topic={records_topic}",
        f"--dead_letter_topic={dead_topic}",
        f"--policy_root={store}",
        *RecordLayout().to_flags(),  # the contract's defaults, the same for both sides
        *flags,
    ]


def cpu_set(text: str | None) -> set[int] | None:
    return {int(c) for c in text.split(",")} if text else None


def make_plan(args, workdir: Path, env: dict) -> dict | None:
    """The capacity plan the run uses: measured now (auto), read from a file, or none."""
    if args.plan == "off":
        return None
    path = Path(args.plan) if args.plan != "auto" else workdir / "plan.json"
    if args.plan == "auto":
        cmd = [
            sys.executable,
            "-m",
            "localstack.launch.plan",
            f"--env={args.env}",
            f"--tool_latency={args.tool_latency}",
            f"--batch_records={args.batch_records}",
            f"--group_size={args.group_size}",
            f"--publish_every={args.publish_every}",
            f"--target_duty={args.target_duty}",
            f"--max_wait_s={args.max_wait_s}",
            *([f"--rollout_rate={args.rollout_rate}"] if args.rollout_rate else []),
            *RecordLayout().to_flags(),
            f"--out={path}",
        ]
        with ProcessGroup(cmd, workdir / "plan.log", env, cpus=cpu_set(args.learner_cpus)) as planner:
            wait_for(planner, 300, "planner")
    plan = json.loads(path.read_text())
    (workdir / "plan.json").write_text(json.dumps(plan, indent=2))  # what the learner reads
    return plan


def run_local(args) -> dict:
    started = time.monotonic()
    processes.start_watchdog()  # SIGKILL of this process must not leave the run behind either
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="agentic-rl-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    summary_path, store = workdir / "summary.json", workdir / "policy-store"
    if not args.resume:  # the learner would otherwise resume from a previous run's checkpoint
        shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
    own_cpus = os.sched_getaffinity(0)
    if args.rollout_cpus:  # the emulator (a JVM) and everything else started here inherit it
        os.sched_setaffinity(0, cpu_set(args.rollout_cpus))
    try:
        summary = _run_pinned(args, started, workdir, summary_path, store)
    finally:
        os.sched_setaffinity(0, own_cpus)
        if args.trace and (workdir / "trace").is_dir():  # also after a failure: the timeline shows why
            trace.merge(workdir / "trace", workdir / "trace.json")
    (workdir / "run_summary.json").write_text(json.dumps(summary, indent=2))  # what the report reads
    try:  # the run's results stand without it: a broken report must not fail the run
        from localstack.reports import report

        summary["report"] = str(report.write_report(workdir))
    except Exception as e:
        print(f"warning: the run report failed: {type(e).__name__}: {e}", file=sys.stderr)
        summary["report"] = None
    return summary


def telemetry_flags(args, workdir: Path) -> list[str]:
    """Every process writes scalars under WORKDIR/logs (one TensorBoard run each) and,
    with --trace, spans under WORKDIR/trace (merged at the end)."""
    return [f"--logdir={workdir / 'logs'}", *([f"--trace_dir={workdir / 'trace'}"] if args.trace else [])]


def _run_pinned(args, started: float, workdir: Path, summary_path: Path, store: Path) -> dict:
    plan = make_plan(args, workdir, {**os.environ, "JAX_PLATFORMS": "cpu"})
    telemetry = telemetry_flags(args, workdir)
    with PubSubEmulator(log_dir=workdir / "emulator") as emu:
        topics = {k: emu.create_topic(v) for k, v in TOPICS.items()}
        subs = {k: emu.create_subscription(f"{v}-sub", v) for k, v in TOPICS.items()}
        # Where the run's topics are, for a person (or a test) who wants to look or publish.
        stack = {"host": emu.host, "project": emu.project, "topics": topics, "subscriptions": subs, "pid": emu.pid}
        (workdir / "emulator.json").write_text(json.dumps(stack, indent=2))
        env = {**os.environ, **emu.env(), "JAX_PLATFORMS": "cpu"}
        py = sys.executable
        shape = RecordLayout().to_flags()  # the contract's defaults, the same for both sides
        pipeline_cmd = rollout_command(
            emu.project,
            subs["requests"],
            topics["records"],
            topics["dead"],
            store,
            [
                f"--policy_poll_s={args.policy_poll_s}",
                f"--max_wait_s={args.max_wait_s}",
                *([] if args.keep_zero_signal else ["--filter_zero_signal"]),
                *(plan["pipeline_flags"] if plan else []),
                *telemetry,
                *shlex.split(args.pipeline_flags),
            ],
        )
        learner_cmd = [
            py,
            "-m",
            "trainer.task",
            f"--requests_topic={topics['requests']}",
            f"--records_subscription={subs['records']}",
            f"--dead_letter_topic={topics['dead']}",
            f"--policy_root={store}",
            f"--max_steps={args.max_steps}",
            f"--publish_every={args.publish_every}",
            f"--batch_records={args.batch_records}",
            f"--keep_versions={args.keep_versions}",
            f"--group_size={args.group_size}",
            f"--timeout_s={args.timeout_s}",
            f"--summary_path={summary_path}",
            f"--checkpoint_dir={workdir / 'checkpoints'}",  # records are acked once one covers them
            f"--warmstart_steps={args.warmstart_steps}",
            f"--warmstart_batch={args.warmstart_batch}",
            f"--warmstart_tasks={args.warmstart_tasks}",
            f"--warmstart_direct_frac={args.warmstart_direct_frac}",
            f"--learning_rate={args.learning_rate}",
            *(["--sync"] if args.sync else []),
            f"--env={args.env}",
            f"--env_config={json.dumps({'tool_latency': args.tool_latency})}",
            f"--data_dir={workdir / 'datasets'}",
            *shape,
            *([f"--init_policy={args.init_policy}"] if args.init_policy else []),
            *([*plan["learner_flags"], f"--plan={workdir / 'plan.json'}"] if plan else []),
            *telemetry,
            *shlex.split(args.learner_flags),
        ]
        # Held-out evaluation, its own process: it reads the store, never the records topic.
        eval_cmd = [
            py,
            "-m",
            "rollout.evaluator",
            f"--policy_root={store}",
            f"--out={workdir / 'eval.jsonl'}",
            f"--env={args.env}",
            f"--n={args.eval_n}",
            f"--modes={args.eval_modes}",
            f"--data_dir={workdir / 'datasets'}",
            f"--stop_file={workdir / 'final_version'}",
            f"--timeout_s={args.timeout_s + 600}",
            f"--max_tokens={RecordLayout().trajectory_len}",
            f"--nice={args.eval_nice}",
            *telemetry,
        ]
        evaluating = args.eval_n > 0
        with ExitStack() as running:
            progress = running.enter_context(Progress(workdir, args.max_steps, args.live))
            learner = running.enter_context(
                ProcessGroup(learner_cmd, workdir / "learner.log", env, cpus=cpu_set(args.learner_cpus))
            )
            deadline = time.monotonic() + args.timeout_s + 60
            # The rollout side starts once policy v0 exists: until then it could only poll,
            # and on two cores that would slow the learner's warm start.
            while not (store / LATEST).exists() and learner.poll() is None and time.monotonic() < deadline:
                progress.update("warm start (behaviour cloning before policy v0)")
                time.sleep(0.5)
            pipeline = running.enter_context(ProcessGroup(pipeline_cmd, workdir / "pipeline.log", env))
            evaluator = None
            if evaluating:
                evaluator = running.enter_context(ProcessGroup(eval_cmd, workdir / "evaluator.log", env))
            restarts = {"pipeline": 0, "emulator": 0}
            while learner.poll() is None:
                # Preemptible parts: a dead emulator or rollout job is started again (their
                # lost requests are written off and redone by the learner's request timeout).
                if not emu.alive():
                    _may_restart(restarts, "emulator", args.max_restarts, emu.log_tail())
                    emu.restart()
                if pipeline.poll() is not None:
                    _may_restart(restarts, "pipeline", args.max_restarts, pipeline.log_tail())
                    log_path = workdir / f"pipeline-restart-{restarts['pipeline']}.log"
                    pipeline = running.enter_context(ProcessGroup(pipeline_cmd, log_path, env))
                if time.monotonic() > deadline:
                    raise DemoFailed(f"learner still running after {args.timeout_s + 60}s:\n{learner.log_tail()}")
                progress.update("training")
                time.sleep(0.5)
            if learner.poll() != 0:
                raise DemoFailed(f"learner exited with {learner.poll()}:\n{learner.log_tail()}")
            if evaluating:  # score the final version too, then stop
                final = json.loads(summary_path.read_text())["policy_versions_published"][-1]
                (workdir / "final_version").write_text(str(final))
                wait_for(evaluator, 900, "evaluator", lambda: progress.update("scoring the final version"))
    summary = json.loads(summary_path.read_text())
    rows = read_rows(workdir / "eval.jsonl")
    summary["held_out"] = held_out_summary(rows, args.target) if rows else {}
    summary["plan"] = plan and {"settings": plan["plan"], "predicted": plan["predicted"]}
    summary["eval_n"] = args.eval_n
    summary["demo_wall_s"] = round(time.monotonic() - started, 1)
    summary["workdir"] = str(workdir)
    summary["restarts"] = restarts
    rollout = reconcile.rollout_totals(workdir)  # the workers' last rows: written as they stopped
    if rollout is not None and summary.get("accounting"):
        summary["reconciliation"] = reconcile.reconcile(summary["accounting"], rollout, args.group_size)
    summary["pids"] = {"pipeline": pipeline.pid, "learner": learner.pid}
    if evaluating:
        summary["pids"]["evaluator"] = evaluator.pid
    return summary


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
        raise DemoFailed(f"{name} exited with {proc.poll()}:\n{proc.log_tail()}")


class Stopped(BaseException):
    """SIGTERM or SIGHUP: unwind like an exception, so every `with` stops what it started."""


def _stop_on_signal(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def main(argv=None) -> int:
    args = parse_args(argv)
    # A job timeout, a closed terminal or a supervisor sends these: without a handler the
    # process would die at once and leave the emulator, pipeline and learner running.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_on_signal)
    try:
        summary = run_local(args)
    except DemoFailed as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    except Stopped as e:
        print(f"demo stopped by {e}; everything it started is stopped", file=sys.stderr)
        return 128 + getattr(signal, str(e)).value
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
