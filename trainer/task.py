"""Learner entry point (local process or Vertex AI custom job): `agentic-rl learner`
(python -m trainer.task). Its flags are trainer/config.py's LearnerJobConfig.

Restore the newest checkpoint or initialise (warm start), publish policy v0, start the
data plane's feeder; then, per step: the next batch -> `learner.train_step` -> settle ->
every `publish_every` steps publish a version and checkpoint it -> a telemetry row. The
parts come from `trainer.learning.builder`, one `make_*` each.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from core import config
from core.contracts.pubsub_io import PermanentError
from core.contracts.run_summary import RunSummary
from core.contracts.store import StoreAccessError
from trainer.cloud.distributed import maybe_initialize_distributed, read_vertex_env
from trainer.config import VERTEX_ENV_DEFAULTS, LearnerJobConfig
from trainer.learning import builder as B
from trainer.learning.accounting import format_accounting
from trainer.learning.lockstep import STOP, Lockstep
from trainer.learning.memory import StepDoesNotFit
from trainer.learning.run_stats import RunStats

log = logging.getLogger("trainer")


def vertex_env_flags(environ=os.environ) -> list[str]:
    """Vertex AI's directories as flags, placed before the user's (which win)."""
    return [f"--{flag}={environ[var]}" for flag, var in VERTEX_ENV_DEFAULTS.items() if environ.get(var)]


def parse_config(argv: list[str] | None) -> LearnerJobConfig:
    """The learner's config from its command line (a refused setting exits, naming the flag)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return config.parse(LearnerJobConfig, [*vertex_env_flags(), *argv], description=__doc__, prog="agentic-rl learner")


parse_args = parse_config  # what trainer.cloud.vertex checks a job's learner flags with


def run(cfg: LearnerJobConfig) -> RunSummary | None:
    B.check_settings(cfg)  # the environment, before anything starts
    mesh = B.make_mesh_from_flag(cfg.mesh)  # a mesh the devices cannot form: refused here
    B.check_resources(cfg)  # wrong Pub/Sub names, a missing bucket: named now, not retried
    tracer = B.make_tracer(cfg.trace_dir)
    learner = B.make_learner(cfg, mesh)
    tasks = B.load_prompts(cfg.env, cfg.task_seed, cfg.data_dir, cfg.env_config)
    checkpointer = B.make_checkpointer(cfg.checkpoint_dir, cfg.checkpoint_unverified)
    with tracer.span("warm start or restore", "learner"):
        start = B.restore_or_initialise(
            learner,
            checkpointer,
            cfg.warmstart,
            cfg.env,
            cfg.task_seed,
            cfg.init_policy,
            init_policy_unverified=cfg.init_policy_unverified,
            env_config=cfg.env_config,
        )
    publisher = B.make_publisher(cfg, learner, checkpointer, start)
    publisher.publish_start(start.resumed)  # v0 for the workers (or the resumed params again)
    stats = RunStats(peak_flops=cfg.peak_tflops * 1e12 if cfg.peak_tflops else None)
    tel = B.make_telemetry(cfg.logdir, tracer, stats)  # a row per step, spans on the timeline
    plane = B.make_data_plane(cfg, tasks, publisher, start, checkpointer, stats, tel)  # acks once checkpointed
    lockstep = Lockstep()  # several processes: process 0's plane decides, the others follow it
    plane.start()
    deadline = time.monotonic() + cfg.timeout_s
    _Stop.graceful, _Stop.requested = True, None
    try:
        while True:
            if time.monotonic() > deadline or plane.error:
                reason = plane.error or f"timeout after {cfg.timeout_s}s"
                if isinstance(reason, PermanentError):
                    raise reason  # the feeder's topic is wrong or not ours: main names it
                raise RuntimeError(f"learner stopped at step {learner.steps}: {reason}")
            stop = learner.steps >= cfg.max_steps or _Stop.requested is not None
            if (batch := lockstep.batch(stop, lambda: plane.next_batch(publisher.version))) is STOP:
                break
            if not batch:
                continue
            tel.data_ready()
            looked_up = time.perf_counter_ns()
            flops = learner.step_flops(batch)  # compiled once per shape, outside the timing
            tel.compiled(looked_up)
            t0 = time.monotonic()
            with tel.span("train step", step=learner.steps + 1):
                metrics = learner.train_step(batch)
            step_s = time.monotonic() - t0
            if not lockstep.primary:  # publishing is a collective: when process 0 says
                _follow_publish(lockstep, publisher)
                continue
            plane.settle(batch, metrics, step_s, flops)
            if lockstep.agree(plane.publish_due(learner.steps)):
                with tel.span("publish", version=publisher.version + 1):
                    publisher.publish()
                with tel.span("checkpoint"):  # its records are acked once it is durable
                    publisher.checkpoint(plane.feeder_position, plane.checkpoint_ids(publisher.version, learner.steps))
                plane.published()
            row = tel.on_step(learner.steps, publisher.version, stats, batch, metrics, step_s, plane)
            log.info(
                "step %d version %d loss %.4f reward %.3f duty %.2f (recent %.2f) staleness %.1f",
                *(learner.steps, publisher.version, metrics["losses/policy_loss"], stats.mean_reward()),
                *(row["perf/duty_cycle"], row["perf/duty_cycle_recent"], row["staleness/mean"]),
            )
    finally:
        _Stop.graceful = False
        plane.stop()
        if checkpointer is not None:
            checkpointer.close()  # waits for the last save
        plane.close()  # acks what that save covers, nacks the rest back to the subscription
        tel.close()
    if not lockstep.primary:
        return None  # process 0 accounts for the run
    summary = plane.summary(learner, start, publisher, exit_code=_Stop.requested or 0)
    if _Stop.requested:
        log.warning("stopped by a signal at step %d (exit code %d)", learner.steps, _Stop.requested)
    for line in format_accounting(summary.accounting):
        (log.info if summary.accounting.balanced else log.error)("trajectories: %s", line)
    return summary


def _follow_publish(lockstep: Lockstep, publisher) -> None:
    """A following process's part of a publish and checkpoint (gathers, Orbax's save)."""
    if lockstep.agree(False):
        publisher.publish()
        publisher.checkpoint(0, {})  # process 0 writes the checkpoint's bookkeeping


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
    cfg = parse_config(argv)
    log.info("learner starting: env %s, %d steps", cfg.env, cfg.max_steps)
    # Multi-host (a TPU slice of several hosts): join the JAX cluster before any JAX work.
    dist = maybe_initialize_distributed(read_vertex_env())
    if dist.initialized:
        log.info(
            "JAX process %d of %d (coordinator %s)", dist.process_index, dist.process_count, dist.coordinator_address
        )
    try:
        summary = run(cfg)
    except (PermanentError, StoreAccessError) as e:  # no retry can fix these: say which resource
        log.error("stopped: %s", e)
        return 2
    except StepDoesNotFit as e:  # refused before it could run out of memory
        log.error("refused: %s", e)
        return 2
    if not dist.is_primary:
        return 0
    print(summary.to_json())
    if cfg.summary_path:
        with open(cfg.summary_path, "w") as f:
            f.write(summary.to_json())
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
