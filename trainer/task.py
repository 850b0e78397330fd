"""Learner entry point (local process or Vertex AI custom job): `python -m trainer.task`.

The loop, top to bottom: restore the newest checkpoint or initialise (warm start),
publish policy v0, start the feeder; then poll records -> admit (staleness) -> batch ->
`learner.train_step` -> every `publish_every` steps publish a version and checkpoint.
The parts come from `trainer.learning.builder`, one `make_*` each.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from types import SimpleNamespace

from core.contracts.record_shape import add_layout_arguments, layout_from_flags
from core.policy.config import MODEL_CONFIGS
from trainer.cloud.distributed import maybe_initialize_distributed, read_vertex_env
from trainer.learning import builder as B
from trainer.learning.accounting import format_accounting
from trainer.learning.losses import AGGREGATIONS, ALGORITHMS, KL_ESTIMATORS
from trainer.learning.run_stats import RunStats
from trainer.learning.warmstart import DIRECT_AT, SCHEDULES, WarmStartConfig

log = logging.getLogger("trainer")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests_topic", required=True)
    p.add_argument("--records_subscription", required=True)
    p.add_argument("--dead_letter_topic", default=None)
    # On Vertex AI the job's model dir is a natural default (gs://…/model/).
    p.add_argument(
        "--policy_root", default=os.environ.get("AIP_MODEL_DIR"), required=os.environ.get("AIP_MODEL_DIR") is None
    )
    p.add_argument("--model_config", default="tiny", choices=sorted(MODEL_CONFIGS))
    p.add_argument("--max_steps", type=int, default=20)
    p.add_argument("--timeout_s", type=float, default=600.0, help="give up (exit 1) after this long")
    p.add_argument("--batch_records", type=int, default=2)
    add_layout_arguments(p)
    p.add_argument("--mesh", default=None, help="device mesh, e.g. data=4,model=2 (default: one device)")
    p.add_argument("--group_size", type=int, default=4)
    p.add_argument("--publish_every", type=int, default=5)
    p.add_argument("--max_batches_ahead", type=int, default=1, help="feeder credits, in batches")
    p.add_argument(
        "--max_in_flight",
        type=int,
        default=None,
        help="feeder credits, in trajectories requested and not yet back (overrides --max_batches_ahead)",
    )
    p.add_argument(
        "--max_staleness",
        type=int,
        default=2,
        help="drop records older than this many versions (--sync: always 0)",
    )
    p.add_argument(
        "--sync",
        action="store_true",
        help="the synchronous baseline: request one round (publish_every batches) at version v, "
        "wait for all of it, train on it, publish v+1, repeat",
    )
    p.add_argument(
        "--sync_round_timeout_s",
        type=float,
        default=300.0,
        help="a round whose trajectories are not all back by then trains on what came (counted as lost)",
    )
    p.add_argument(
        "--max_mean_staleness",
        type=float,
        default=None,
        help="wait for fresher data while the ready data is staler than this on average",
    )
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--loss", default="ppo", choices=ALGORITHMS)
    p.add_argument("--eps_low", type=float, default=0.2)
    p.add_argument("--eps_high", type=float, default=0.28)
    p.add_argument("--aggregation", default="token-mean", choices=AGGREGATIONS)
    p.add_argument("--tis_cap", type=float, default=None, help="truncated importance sampling cap (off)")
    p.add_argument("--kl_coef", type=float, default=0.0, help="KL to the reference (the v0 policy)")
    p.add_argument("--kl_estimator", default="k3", choices=KL_ESTIMATORS)
    p.add_argument("--env", default="calculator")
    p.add_argument("--env_config", type=json.loads, default={}, help='JSON, e.g. {"tool_latency": "fixed:0.1"}')
    p.add_argument("--task_seed", type=int, default=0)
    p.add_argument(
        "--data_dir",
        default=None,
        help="read prompts from the environment's TFDS dataset here (built locally if missing)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--init_policy",
        default=None,
        help="start from the newest version in this policy store (a dir or gs://…) instead of a warm start",
    )
    p.add_argument(
        "--plan",
        default=None,
        help="a localstack.launch.plan JSON: warn at start if the credit window cannot reach its duty cycle",
    )
    p.add_argument(
        "--warmstart_steps",
        type=int,
        default=0,
        help="behaviour-cloning steps on oracle episodes before policy v0 (0 = random init)",
    )
    p.add_argument("--warmstart_batch", type=int, default=WarmStartConfig.batch_rows)
    p.add_argument("--warmstart_lr", type=float, default=WarmStartConfig.learning_rate)
    p.add_argument(
        "--warmstart_schedule",
        choices=SCHEDULES,
        default=WarmStartConfig.schedule,
        help="cosine: linear warmup, then decay to 0 (sharper copying than a constant rate)",
    )
    p.add_argument("--warmstart_warmup", type=int, default=WarmStartConfig.warmup_steps)
    p.add_argument(
        "--warmstart_direct_at",
        choices=DIRECT_AT,
        default=WarmStartConfig.direct_at,
        help="where direct-answer demonstrations answer: at the first action, or after some of the calls",
    )
    p.add_argument(
        "--warmstart_tasks",
        type=int,
        default=1000,
        help="oracle demonstrations drawn from this many generated train tasks (more tasks: less memorising)",
    )
    p.add_argument(
        "--warmstart_direct_frac",
        type=float,
        default=0.0,
        help="share of demonstrations that answer directly instead of calling the tool (RL's decision to learn)",
    )
    p.add_argument(
        "--peak_tflops",
        type=float,
        default=None,
        help="the accelerator's peak, for model-FLOPs utilisation (e.g. 197 per v5e chip)",
    )
    p.add_argument("--publish_bf16", action="store_true", help="publish policy versions in bfloat16")
    p.add_argument("--keep_versions", type=int, default=5, help="policy versions kept in the store")
    p.add_argument(
        "--checkpoint_dir",
        default=os.environ.get("AIP_CHECKPOINT_DIR"),
        help="learner checkpoints (a dir or gs://…), saved at every policy publish; "
        "a restarted learner resumes from the newest",
    )
    p.add_argument(
        "--request_timeout_s",
        type=float,
        default=300.0,
        help="a rollout request not back within this is written off and asked again (async only)",
    )
    p.add_argument(
        "--ack_deadline_s",
        type=int,
        default=120,
        help="ack deadline asked for records held until a checkpoint covers them (10..600)",
    )
    p.add_argument(
        "--ack_extend_every_s", type=float, default=30.0, help="how often held records' deadlines are extended"
    )
    p.add_argument("--summary_path", default=None, help="also write the run summary here as JSON")
    p.add_argument(
        "--logdir",
        default=os.environ.get("AIP_TENSORBOARD_LOG_DIR"),
        help="per-step scalars: TensorBoard event files and metrics.jsonl under <logdir>/learner "
        "(default: Vertex AI's AIP_TENSORBOARD_LOG_DIR; unset: not written)",
    )
    p.add_argument("--trace_dir", default=None, help="the learner's timeline spans (Perfetto); unset: off")
    return p


def parse_args(argv):
    return build_parser().parse_args(argv)


def run(args) -> dict:
    layout = layout_from_flags(args)
    # Bounds, the warm start and the environment are refused before anything starts.
    learner_cfg = B.make_learner_config(args, layout)
    staleness, credits = B.make_staleness(args), B.make_credits(args, layout)
    delivery = B.make_delivery(args, staleness)
    B.check_settings(args)
    tracer = B.make_tracer(args)
    learner = B.make_learner(args, learner_cfg, B.make_mesh_from_flag(args.mesh))
    tasks = B.load_prompts(args)
    checkpointer = B.make_checkpointer(args)
    with tracer.span("warm start or restore", "learner"):
        start = B.restore_or_initialise(learner, checkpointer, args, tasks)
    publisher = B.make_publisher(args, learner, checkpointer, start)
    publisher.publish_start(start.resumed)  # v0 for the workers (or the resumed params again)
    B.warn_if_short(args, credits)
    feeder = B.make_feeder(args, tasks, credits, staleness, publisher, start)
    consumer = B.make_consumer(args, layout, start, delivery, checkpointer)  # acks once checkpointed
    batches = B.make_batches(layout, learner, staleness, consumer)
    schedule = B.make_schedule(args, batches, credits)  # async, or synchronous rounds
    stats = RunStats(peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None)
    tel = B.make_telemetry(args, tracer, stats)  # a row per step, spans on the timeline
    parts = SimpleNamespace(staleness=staleness, credits=credits, consumer=consumer, batches=batches, feeder=feeder)
    if feeder:
        feeder.start()
    deadline = time.monotonic() + args.timeout_s
    _Stop.graceful, _Stop.requested = True, None
    going = lambda: learner.steps < args.max_steps and _Stop.requested is None
    try:
        while going():
            if time.monotonic() > deadline or (feeder and feeder.error):
                reason = feeder.error if feeder and feeder.error else f"timeout after {args.timeout_s}s"
                raise RuntimeError(f"learner stopped at step {learner.steps}: {reason}")
            polled_at = time.perf_counter_ns()
            received = consumer.poll(max_messages=100, timeout_s=1.0)
            tel.polled(polled_at, len(received))
            for rec in received:
                credits.returned(t.trajectory_id for t in rec.trajectories)  # back: so are their credits
                stats.on_record(rec)
                batches.add(rec, publisher.version)
            credits.returned(consumer.take_dropped())
            if feeder:
                feeder.redo_timed_out()  # a request lost with a rollout worker is asked again
            while going() and (batch := schedule.next_batch(publisher.version)):
                tel.data_ready()
                looked_up = time.perf_counter_ns()
                flops = learner.step_flops(batch)  # compiled once per shape, outside the timing
                tel.compiled(looked_up)
                t0 = time.monotonic()
                with tel.span("train step", step=learner.steps + 1):
                    metrics = learner.train_step(batch)
                step_s = time.monotonic() - t0
                consumer.settle(batch)
                stats.on_step(batch, metrics, step_s, flops)
                if schedule.publish_due(learner.steps):
                    with tel.span("publish", version=publisher.version + 1):
                        publisher.publish()
                    with tel.span("checkpoint"):  # its records are acked once it is durable
                        dedup = consumer.checkpoint_ids(publisher.version)
                        publisher.checkpoint(feeder.published if feeder else 0, dedup)
                    schedule.next_round()
                row = tel.on_step(learner.steps, publisher.version, stats, batch, metrics, step_s, parts)
                log.info(
                    "step %d version %d loss %.4f reward %.3f duty %.2f (recent %.2f) staleness %.1f",
                    learner.steps,
                    publisher.version,
                    metrics["losses/policy_loss"],
                    stats.mean_reward(),
                    row["perf/duty_cycle"],
                    row["perf/duty_cycle_recent"],
                    row["staleness/mean"],
                )
    finally:
        _Stop.graceful = False
        if feeder:
            feeder.stop()
        if checkpointer is not None:
            checkpointer.close()  # waits for the last save
        consumer.close()  # acks what that save covers, nacks the rest back to the subscription
        tel.close()
    summary = {**stats.summary(learner, start, publisher, consumer, feeder, staleness, layout), **schedule.summary()}
    summary["accounting"] = B.account(args, stats, parts, schedule)
    summary["exit_code"] = _Stop.requested or 0
    if _Stop.requested:
        log.warning("stopped by a signal at step %d (exit code %d)", learner.steps, _Stop.requested)
    for line in format_accounting(summary["accounting"]):
        (log.info if summary["accounting"]["balanced"] else log.error)("trajectories: %s", line)
    return summary


class _Stop:
    """SIGTERM (a job timeout, a closed terminal). In the loop: the iteration finishes, so
    every counter stays consistent, then the usual teardown and summary. Elsewhere (a warm
    start, say): unwind at once."""

    graceful = False
    requested: int | None = None


def _exit_on_signal(signum, _frame):
    if _Stop.graceful:
        _Stop.requested = 128 + signum
        return
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # force: absl (imported by orbax and tfds) installs a root handler first, which would
    # swallow our lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    args = parse_args(argv)
    # Multi-host (a TPU slice of several hosts): join the JAX cluster before any JAX work.
    dist = maybe_initialize_distributed(read_vertex_env())
    summary = run(args)
    if not dist.is_primary:
        return 0
    print(json.dumps(summary, indent=2))
    if args.summary_path:
        with open(args.summary_path, "w") as f:
            json.dump(summary, f, indent=2)
    return summary["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
