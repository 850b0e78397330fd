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
import threading
import time

from core import config, heap
from core.contracts.pubsub_io import PermanentError
from core.contracts.run_summary import RunSummary
from core.contracts.store import StoreAccessError
from trainer.cloud.distributed import maybe_initialize_distributed, read_vertex_env
from trainer.config import VERTEX_ENV_DEFAULTS, LearnerJobConfig
from trainer.learning import builder
from trainer.learning.data.accounting import format_accounting
from trainer.learning.run_stats import RunStats
from trainer.learning.step.lockstep import STOP, Lockstep
from trainer.learning.step.memory import StepDoesNotFit

log = logging.getLogger("trainer")


def vertex_env_flags(environ=os.environ) -> list[str]:
    """Vertex AI's directories as flags, placed before the user's (which win)."""
    return [f"--{flag}={environ[var]}" for flag, var in VERTEX_ENV_DEFAULTS.items() if environ.get(var)]


def parse_config(argv: list[str] | None) -> LearnerJobConfig:
    """The learner's config from its command line (a refused setting exits, naming the flag)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return config.parse(LearnerJobConfig, [*vertex_env_flags(), *argv], description=__doc__, prog="agentic-rl learner")


def compile_cache_dir(cfg: LearnerJobConfig, environ=os.environ) -> str | None:
    """Where the learner's compiles persist: the environment's JAX_COMPILATION_CACHE_DIR
    (JAX reads it itself), else --compile_cache_dir, else beside the checkpoints."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    if cfg.compile_cache_dir:
        return cfg.compile_cache_dir
    return cfg.checkpoint_dir.rstrip("/") + "/xla_cache" if cfg.checkpoint_dir else None


def run(cfg: LearnerJobConfig) -> RunSummary | None:
    builder.check_settings(cfg)  # the environment, before anything starts
    if cache := compile_cache_dir(cfg):
        import jax

        jax.config.update("jax_compilation_cache_dir", cache)
    mesh = builder.make_mesh_from_flag(cfg.mesh)  # a mesh the devices cannot form: refused here
    builder.check_resources(cfg)  # wrong Pub/Sub names, a missing bucket: named now, not retried
    tracer = builder.make_tracer(cfg.telemetry.trace_dir)
    learner = builder.make_learner(cfg, mesh)
    tasks = builder.load_prompts(cfg.env.name, cfg.task_seed, cfg.data_dir, cfg.env.settings)
    checkpointer = builder.make_checkpointer(cfg.checkpoint_dir, cfg.checkpoint_unverified)
    with tracer.span("warm start or restore", "learner"):
        start = builder.restore_or_initialise(learner, checkpointer, cfg)
    publisher = builder.make_publisher(cfg, learner, checkpointer, start)
    publisher.publish_start(start.resumed)  # v0 for the workers (or the resumed params again)
    stats = RunStats(peak_flops=cfg.peak_tflops * 1e12 if cfg.peak_tflops else None)
    tel = builder.make_telemetry(cfg.telemetry.logdir, tracer, stats)  # a row per step, spans on the timeline
    plane = builder.make_data_plane(cfg, tasks, publisher, start, checkpointer, stats, tel)  # acks once checkpointed
    lockstep = Lockstep()  # several processes: process 0's plane decides, the others follow it
    plane.start()
    with GracefulStop() as stop:
        try:
            if lockstep.primary:
                _lead(cfg, learner, publisher, plane, tel, stats, lockstep, stop)
            else:
                _follow(learner, publisher, lockstep)
        finally:
            plane.stop()
            if checkpointer is not None:
                checkpointer.close()  # waits for the last save
            plane.close()  # acks what that save covers, nacks the rest back to the subscription
            tel.close()
    if not lockstep.primary:
        return None  # process 0 accounts for the run
    summary = plane.summary(learner, start, publisher, exit_code=stop.exit_code)
    if stop.exit_code:
        log.warning("stopped by a signal at step %d (exit code %d)", learner.steps, stop.exit_code)
    for line in format_accounting(summary.accounting):
        (log.info if summary.accounting.balanced else log.error)("trajectories: %s", line)
    return summary


def _lead(cfg, learner, publisher, plane, tel, stats, lockstep: Lockstep, stop: GracefulStop) -> None:
    """Process 0's loop (the whole learner, with one process): the next batch -> a train
    step -> settle it -> every publish_every steps a version and its checkpoint -> a row."""
    deadline = time.monotonic() + cfg.timeout_s
    while True:
        if time.monotonic() > deadline or plane.error:
            reason = plane.error or f"timeout after {cfg.timeout_s}s"
            if isinstance(reason, PermanentError):
                raise reason  # the feeder's topic is wrong or not ours: main names it
            raise RuntimeError(f"learner stopped at step {learner.steps}: {reason}")
        done = learner.steps >= cfg.max_steps or stop.requested
        if (batch := lockstep.batch(done, lambda: plane.next_batch(publisher.version))) is STOP:
            return
        if not batch:
            continue
        tel.data_ready()
        looked_up = time.perf_counter_ns()
        flops = learner.step_flops(batch)  # compiled once per shape, outside the timing
        tel.compiled(looked_up)
        with tel.span("checkpoint wait"):  # a CPU learner's step waits for the save (publisher.before_step)
            publisher.before_step()
        t0 = time.monotonic()
        with tel.span("train step", step=learner.steps + 1):
            metrics = learner.train_step(batch)
        step_s = time.monotonic() - t0
        trained_at = publisher.version  # the version this step trained on: its records' lag is from it
        plane.settle(batch, metrics, step_s, flops, trained_at)
        if lockstep.agree(plane.publish_due(learner.steps)):
            with tel.span("publish", version=publisher.version + 1):
                publisher.publish()
            with tel.span("checkpoint"):  # its records are acked once it is durable
                publisher.checkpoint(plane.feeder_position, plane.checkpoint_ids(publisher.version, learner.steps))
            plane.published(publisher.version)
        row = tel.on_step(learner.steps, publisher.version, stats, batch, metrics, step_s, plane, trained_at)
        log.info(
            "step %d version %d loss %.4f reward %.3f duty %.2f (recent %.2f) staleness %.1f",
            *(learner.steps, publisher.version, metrics["losses/policy_loss"], stats.mean_reward()),
            *(row["perf/duty_cycle"], row["perf/duty_cycle_recent"], row["staleness/mean"]),
        )


def _follow(learner, publisher, lockstep: Lockstep) -> None:
    """Another process of a multi-host learner: it trains what process 0 broadcasts and
    joins its publishes and checkpoints (collectives), until process 0 says stop."""
    while (batch := lockstep.batch(False, lambda: None)) is not STOP:
        if not batch:
            continue
        publisher.before_step()
        learner.train_step(batch)
        if lockstep.agree(False):
            publisher.publish()
            publisher.checkpoint(0, {})  # process 0 writes the checkpoint's bookkeeping


class GracefulStop:
    """While active, SIGTERM (a job timeout, a closed terminal) asks the loop to stop: the
    iteration finishes, so every counter stays consistent, then the usual teardown and
    summary. Outside it (a warm start, say) main's handler unwinds at once."""

    def __init__(self):
        self._asked, self.exit_code = threading.Event(), 0

    @property
    def requested(self) -> bool:
        return self._asked.is_set()

    def _on_signal(self, signum, _frame) -> None:
        self.exit_code = 128 + signum
        self._asked.set()

    def __enter__(self) -> GracefulStop:
        main_thread = threading.current_thread() is threading.main_thread()
        self._previous = signal.signal(signal.SIGTERM, self._on_signal) if main_thread else None
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    heap.limit_arenas(2)  # before JAX's and Orbax's threads: fewer arenas, less fragmentation (core/heap.py)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # force: absl (imported by orbax and tfds) installs a root handler first, which would
    # swallow our lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    cfg = parse_config(argv)
    log.info("learner starting: env %s, %d steps", cfg.env.name, cfg.max_steps)
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
