"""The learner job's parts, one `make_*` per part, each returned fully formed (Acme's
builder is the model): trainer.task wires them and runs the loop."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import environments
from core.contracts.record_shape import RecordLayout, layout_from_flags
from core.contracts.store import PolicyStore
from core.policy.config import model_config
from core.policy.model import abstract_tree
from core.telemetry import scalars, trace
from trainer.learning.accounting import trajectory_accounting
from trainer.learning.batches import BatchBuffer
from trainer.learning.capacity import Measurements, shortfall_warning
from trainer.learning.checkpoint import LearnerCheckpointer
from trainer.learning.consumer import RecordConsumer
from trainer.learning.deliveries import DeliveryConfig
from trainer.learning.feeder import CreditConfig, Feeder, TrajectoryCredits
from trainer.learning.learner import Learner, LearnerConfig
from trainer.learning.losses import LossConfig
from trainer.learning.publisher import PolicyPublisher, learner_state_of
from trainer.learning.schedule import AsyncSchedule, SyncSchedule
from trainer.learning.sharding import make_mesh
from trainer.learning.staleness import StalenessConfig, StalenessControl
from trainer.learning.telemetry import LearnerTelemetry
from trainer.learning.warmstart import WarmStartConfig, warm_start

log = logging.getLogger("trainer")


@dataclasses.dataclass(frozen=True)
class Start:
    """Where the learner starts: from scratch, or from its newest checkpoint."""

    version: int = -1  # the policy version the checkpoint had published (-1: none)
    resumed_from_step: int | None = None
    feeder_position: int = 0
    consumed_ids: dict[str, int] = dataclasses.field(default_factory=dict)  # the dedup set: id -> oldest version
    warmstart_s: float = 0.0

    @property
    def resumed(self) -> bool:
        return self.resumed_from_step is not None


def parse_mesh(text: str | None) -> tuple[int, int] | None:
    """ "data=4,model=2" -> (4, 2); None or "" -> None (one device, no mesh)."""
    if not text:
        return None
    try:
        axes = dict(part.split("=") for part in text.split(","))
        shape = (int(axes.pop("data", 1)), int(axes.pop("model", 1)))
    except ValueError:
        raise ValueError(f"--mesh must look like data=4,model=2, got {text!r}") from None
    if axes or min(shape) < 1:
        raise ValueError(f"--mesh takes positive sizes for the axes data and model only, got {text!r}")
    return shape


def make_mesh_from_flag(text: str | None):
    shape = parse_mesh(text)
    if shape is None:
        return None
    if shape[0] * shape[1] != jax.device_count():
        raise ValueError(f"--mesh {text} needs {shape[0] * shape[1]} devices, have {jax.device_count()}")
    return make_mesh(*shape)


def make_learner_config(args, layout: RecordLayout) -> LearnerConfig:
    loss = LossConfig(
        algorithm=args.loss,
        eps_low=args.eps_low,
        eps_high=args.eps_high,
        aggregation=args.aggregation,
        max_segments=layout.max_segments_per_row,
        tis_cap=args.tis_cap,
        kl_coef=args.kl_coef,
        kl_estimator=args.kl_estimator,
    )
    return LearnerConfig(
        batch_records=args.batch_records,
        learning_rate=args.learning_rate,
        publish_every=args.publish_every,
        seed=args.seed,
        loss=loss,
    )


def make_learner(args, cfg: LearnerConfig, mesh) -> Learner:
    return Learner(model_config(args.model_config), cfg, mesh)


def load_prompts(args) -> list:
    """Training prompts: the environment's TFDS dataset when --data_dir is given (built
    there from the local generator on first use; nothing is downloaded), else generated."""
    environments.load_entry_points()  # environments from installed plugin packages
    if not args.data_dir:
        return environments.make_tasks(args.env, args.task_seed, 1000, "train")
    from environments import datasets

    datasets.build(args.env, args.data_dir, seed=args.task_seed)
    return list(datasets.load_tasks(args.env, "train", args.data_dir))


def make_checkpointer(args) -> LearnerCheckpointer | None:
    return LearnerCheckpointer(args.checkpoint_dir) if args.checkpoint_dir else None


def restore_or_initialise(learner: Learner, checkpointer, args, tasks) -> Start:
    """The newest checkpoint's params, optimizer, reference and bookkeeping; else a warm
    start (when asked) from the initial params. The KL reference is the policy RL starts
    from, loaded once."""
    if learner.cfg.loss.kl_coef > 0:
        learner.set_reference(learner.params)  # the right shapes, for the restore target
    restored = checkpointer.restore_latest(abstract_tree(learner_state_of(learner))) if checkpointer else None
    if restored:
        step, state, meta = restored
        learner.params, learner.opt_state, learner.steps = state["params"], state["opt_state"], step
        if "ref_params" in state:
            learner.ref_params = state["ref_params"]
        return Start(meta["learner_version"], step, meta["feeder_position"], consumed_ids_of(meta))
    t0 = time.monotonic()
    if args.init_policy:
        found = PolicyStore(args.init_policy).load_latest(learner.params_dict())
        if found is None:
            raise ValueError(f"--init_policy {args.init_policy} holds no complete policy version")
        nnx.replace_by_pure_dict(learner.params, found[1])  # the store holds plain dicts
        # Uncommitted device arrays, as the initial params were: Orbax's restored arrays
        # (committed to a device) would make the first step compile for them and the
        # second compile again for its own outputs.
        if learner.mesh is None:
            learner.params = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), learner.params)
        else:
            learner.params = jax.device_put(learner.params, learner._shardings)
        log.info("initial params: version %d of %s (no warm start)", found[0], args.init_policy)
    elif args.warmstart_steps:
        cfg = make_warmstart_config(args)
        demos = environments.make_tasks(args.env, args.task_seed + 1, args.warmstart_tasks, "train")
        learner.params, losses = warm_start(learner.graphdef, learner.params, args.env, demos, cfg)
        log.info("warm start: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
    if learner.cfg.loss.kl_coef > 0:
        learner.set_reference(learner.params)
    return Start(warmstart_s=round(time.monotonic() - t0, 2))


def consumed_ids_of(meta: dict) -> dict[str, int]:
    """The checkpoint's dedup set. Checkpoints written before the dedup horizon hold a plain
    list of ids: with no version known (-1), those ids are never forgotten."""
    ids = meta["consumed_ids"]
    return {str(k): int(v) for k, v in ids.items()} if isinstance(ids, dict) else dict.fromkeys(map(str, ids), -1)


def make_warmstart_config(args) -> WarmStartConfig:
    return WarmStartConfig(
        steps=args.warmstart_steps,
        batch_rows=args.warmstart_batch,
        max_seq_len=layout_from_flags(args).trajectory_len,
        learning_rate=args.warmstart_lr,
        schedule=args.warmstart_schedule,
        warmup_steps=args.warmstart_warmup,
        direct_frac=args.warmstart_direct_frac,
        direct_at=args.warmstart_direct_at,
        seed=args.seed,
    )


def make_publisher(args, learner: Learner, checkpointer, start: Start) -> PolicyPublisher:
    return PolicyPublisher(
        PolicyStore(args.policy_root),
        learner,
        checkpointer,
        version=start.version,
        is_primary=jax.process_index() == 0,
        dtype=jnp.bfloat16 if args.publish_bf16 else None,
        keep_versions=args.keep_versions,
    )


def make_staleness(args) -> StalenessControl:
    max_staleness = 0 if args.sync else args.max_staleness  # sync trains only on its own version
    mean = None if args.sync else args.max_mean_staleness
    return StalenessControl(StalenessConfig(max_staleness, mean))


def make_credits(args, layout: RecordLayout) -> TrajectoryCredits:
    # Same rows and segments per row in every bucket, so one credit rule covers them all.
    cfg = CreditConfig(
        args.max_batches_ahead,
        args.batch_records,
        layout.largest,
        args.group_size,
        sync=args.sync,
        steps_per_round=args.publish_every,
        max_in_flight=args.max_in_flight,
        request_timeout_s=None if args.sync else args.request_timeout_s,
    )
    log.info("feeder credits: %d trajectories in flight (%.2f batches ahead)", cfg.window, cfg.batches_ahead)
    return TrajectoryCredits(cfg.window, rounds=args.sync, request_timeout_s=cfg.request_timeout_s)


def read_plan(args) -> dict | None:
    """The localstack.launch.plan JSON named by --plan, if any."""
    if not args.plan:
        return None
    with open(args.plan) as f:
        return json.load(f)


def warn_if_short(args, credits: TrajectoryCredits) -> str | None:
    """With --plan: a warning (logged and returned) if the window cannot reach its duty cycle."""
    plan = read_plan(args)
    if plan is None or args.sync:
        return None
    m = Measurements(**plan["measurements"])
    bound = plan["plan"].get("staleness_bound")
    warning = shortfall_warning(m, credits.window, args.publish_every, plan["plan"]["target_duty"], bound)
    if warning:
        log.warning("%s", warning)
    return warning


def make_schedule(args, batches: BatchBuffer, credits: TrajectoryCredits) -> AsyncSchedule | SyncSchedule:
    if args.sync:
        plan = read_plan(args)  # its packing estimate sizes the first round
        per_record = plan["measurements"]["trajectories_per_record"] if plan else None
        return SyncSchedule(
            batches, credits, args.publish_every, args.sync_round_timeout_s, args.group_size, per_record
        )
    return AsyncSchedule(batches, args.publish_every)


def make_feeder(args, tasks, credits, staleness: StalenessControl, publisher: PolicyPublisher, start: Start):
    """Requests stamped with the oldest version they may run on; None off the primary
    process (one feeder per job)."""
    if jax.process_index() != 0:
        return None
    return Feeder(
        args.requests_topic,
        tasks,
        credits,
        args.group_size,
        args.env,
        args.env_config,
        min_version=lambda: staleness.cfg.min_request_version(publisher.version),
        start=start.feeder_position,
    )


def make_delivery(args, staleness: StalenessControl) -> DeliveryConfig:
    return DeliveryConfig(args.ack_deadline_s, args.ack_extend_every_s, staleness.cfg.max_staleness)


def check_settings(args) -> None:
    """What would otherwise fail only later (after the warm start, or in every rollout
    worker as dead-lettered requests): refused now, naming the flag."""
    if args.warmstart_steps and not args.init_policy:
        make_warmstart_config(args)
        if args.warmstart_tasks < 1:
            raise ValueError(f"warmstart_tasks must be >= 1 with a warm start, got {args.warmstart_tasks}")
    environments.load_entry_points()
    try:
        environments.make(args.env, **args.env_config)
    except (KeyError, TypeError, ValueError) as e:
        why = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ValueError(f"{why} (--env {args.env!r}, --env_config {json.dumps(args.env_config)})") from None


def make_consumer(args, layout: RecordLayout, start: Start, delivery: DeliveryConfig, checkpointer):
    """Acks a record once a durable checkpoint covers it (at once without checkpoints); the
    checkpoint's dedup set means a restart never trains a record twice."""
    return RecordConsumer(
        args.records_subscription,
        {s.key for s in layout.shapes},
        args.dead_letter_topic,
        delivery=delivery,
        consumed=start.consumed_ids,
        durable=None if checkpointer is None else (lambda: not checkpointer.saving()),
    )


def make_batches(layout: RecordLayout, learner: Learner, staleness: StalenessControl, consumer) -> BatchBuffer:
    return BatchBuffer(layout.shapes, learner.cfg.batch_records, staleness, on_dropped=consumer.settle)


def _primary() -> bool:
    return jax.process_index() == 0  # one writer per run, as in Flax's examples


def make_tracer(args):
    """The learner's timeline (off without --trace_dir, and on every process but the primary)."""
    return trace.install(trace.make_tracer(args.trace_dir if _primary() else None, "learner"))


def make_telemetry(args, tracer, stats) -> LearnerTelemetry:
    writer = scalars.make_writer(args.logdir if _primary() else None, "learner")
    return LearnerTelemetry(writer, tracer, stats.started)


def account(args, stats, parts, schedule) -> dict:
    """The run's trajectory balances (trainer/learning/accounting.py), from the parts' counters."""
    queued = [r for q in parts.batches.queues.values() for r in q]
    queued += [r for batch in getattr(schedule, "pending", []) for r in batch]  # a sync round not yet trained
    feeder, credits = parts.feeder, parts.credits
    return trajectory_accounting(
        requested=(feeder.published - feeder.start_position + feeder.redone) * args.group_size if feeder else 0,
        received=len(stats.rewards),
        trained=stats.trained_trajectories,
        dropped_stale=parts.staleness.dropped_trajectories,
        buffered=sum(len(r.trajectories) for r in queued),
        dropped_by_pipeline=parts.consumer.dropped_trajectories,
        written_off=credits.written_off,
        late=credits.late,
        foreign=credits.foreign,
        in_flight=credits.outstanding,
    )
