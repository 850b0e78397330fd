"""The learner job's parts, one `make_*` per part, each returned fully formed (Acme's
builder is the model) from typed config sections (trainer/config.py): trainer.task wires
them and runs the loop."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import environments
from core.contracts import pubsub_io
from core.contracts.record_shape import RecordLayout
from core.contracts.store import PolicyStore
from core.policy.model.transformer import abstract_tree
from core.policy.sources import policy_spec
from core.policy.text.chat_format import chat_format_for
from core.telemetry import scalars, trace
from trainer.cloud.distributed import is_primary
from trainer.config import LearnerJobConfig, parse_mesh
from trainer.learning.capacity import Measurements, shortfall_warning
from trainer.learning.data.batches import BatchBuffer
from trainer.learning.data.consumer import RecordConsumer
from trainer.learning.data.data_plane import DataPlane
from trainer.learning.data.feeder import CreditWindow, Feeder, TrajectoryCredits
from trainer.learning.data.lag_control import LagController, window_bounds
from trainer.learning.data.schedule import AsyncSchedule, SyncSchedule
from trainer.learning.data.staleness import StalenessControl
from trainer.learning.data.starvation import StarvationWatch
from trainer.learning.persistence.checkpoint import LearnerCheckpointer
from trainer.learning.persistence.publisher import PolicyPublisher, learner_state_of
from trainer.learning.step.learner import Learner
from trainer.learning.step.lockstep import FollowerPlane
from trainer.learning.step.sharding import make_mesh
from trainer.learning.telemetry import LearnerTelemetry
from trainer.learning.warmstart import warm_start

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


def make_mesh_from_flag(text: str | None):
    shape = parse_mesh(text)
    if shape is None:
        return None
    if shape[0] * shape[1] != jax.device_count():
        raise ValueError(f"--mesh {text} needs {shape[0] * shape[1]} devices, have {jax.device_count()}")
    return make_mesh(*shape)


def make_learner(cfg: LearnerJobConfig, mesh) -> Learner:
    """The built-in policy (random init from --seed), or the --model checkpoint's weights;
    the learner keeps the tokenizer: its warm start and published versions use it."""
    spec = policy_spec(cfg.model.checkpoint, cfg.model.builtin)
    model = None
    if spec.checkpoint:
        from core.policy.formats.hf_weights import load_checkpoint

        _, model = load_checkpoint(spec.checkpoint)
        log.info("initial params: the checkpoint %s", spec.checkpoint)
    # Every segment of every record is at most the layout's trajectory length (the consumer
    # refuses longer ones): the learner's attention only needs that band of each row.
    learner = Learner(
        spec.cfg,
        cfg.learner,
        mesh,
        model=model,
        span=cfg.record_layout.trajectory_len,
        max_segments=cfg.record_layout.max_segments_per_row,
        total_steps=cfg.max_steps,
        tokenizer=spec.tokenizer,
        tokenizer_source=spec.tokenizer_source,
    )
    # The one compile the run's record shape needs, now: a step that cannot fit in memory is
    # refused with the numbers before the warm start (trainer/learning/step/memory.py).
    shape = cfg.record_layout.largest
    found = learner.compile_for(cfg.learner.batch_records * shape.rows, shape.seq_len)
    log.info(
        "train step at %dx%d: %.2f GB resident, %.2f GB more while it runs, %s free",
        cfg.learner.batch_records * shape.rows,
        shape.seq_len,
        found.resident_bytes / 1e9,
        found.extra_bytes / 1e9,
        "?" if found.free_bytes is None else f"{found.free_bytes / 1e9:.1f} GB",
    )
    return learner


def load_prompts(env: str, task_seed: int, data_dir: str | None, env_config: dict | None = None) -> list:
    """Training prompts: the environment's TFDS dataset when --data_dir is given (built
    there from the local generator on first use; nothing is downloaded), else generated;
    either way drawn as --env_config sets the environment up."""
    environments.load_entry_points()  # environments from installed plugin packages
    if not is_primary():
        return []  # only process 0 feeds (and builds the dataset: two builders would race)
    if not data_dir:
        return environments.make_tasks(env, task_seed, 1000, "train", env_config)
    from environments import datasets

    datasets.build(env, data_dir, seed=task_seed, env_config=env_config)
    return list(datasets.load_tasks(env, "train", data_dir))


def make_checkpointer(checkpoint_dir: str | None, unverified: bool = False) -> LearnerCheckpointer | None:
    return LearnerCheckpointer(checkpoint_dir, allow_unverified=unverified) if checkpoint_dir else None


def restore_or_initialise(learner: Learner, checkpointer, cfg: LearnerJobConfig) -> Start:
    """The newest checkpoint's params, optimizer, reference and bookkeeping; else the
    newest version of --init_policy; else a warm start (when asked) from the initial
    params. The KL reference is the policy RL starts from, loaded once."""
    if learner.cfg.loss.kl_coef > 0:
        learner.set_reference(learner.params)  # the right shapes, for the restore target
    restored = checkpointer.restore_latest(abstract_tree(learner_state_of(learner))) if checkpointer else None
    if restored:
        step, state, meta = restored
        learner.restore(step, state)
        return Start(meta["learner_version"], step, meta["feeder_position"], consumed_ids_of(meta))
    t0 = time.monotonic()
    warmstart, env, env_config = cfg.warmstart, cfg.env.name, cfg.env.settings
    if cfg.init_policy:
        store = PolicyStore(cfg.init_policy, allow_unverified=cfg.init_policy_unverified)
        found = store.load_latest(learner.params_dict())
        if found is None:
            raise ValueError(f"--init_policy {cfg.init_policy} holds no complete policy version")
        learner.load_params(found[1])  # the store holds plain dicts
        log.info("initial params: version %d of %s (no warm start)", found[0], cfg.init_policy)
    elif warmstart.steps:
        demos = environments.make_tasks(env, cfg.task_seed + 1, warmstart.tasks, "train", env_config)
        fmt = chat_format_for(learner.tokenizer)  # demonstrations in the model's own format
        # The warm start has its own optimizer: one Adam state in memory, not two.
        losses = learner.train_params_with(
            lambda params: warm_start(
                learner.graphdef,
                params,
                env,
                demos,
                warmstart,
                fmt,
                learner.frozen,
                env_config,
                compute=learner.cfg.compute,
                # One transcript per row, up to the layout's trajectory length; the learner's seed.
                seq_len=cfg.record_layout.trajectory_len,
                seed=cfg.learner.seed,
            )
        )
        log.info("warm start: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
    if learner.cfg.loss.kl_coef > 0:
        learner.set_reference(learner.params)
    return Start(warmstart_s=round(time.monotonic() - t0, 2))


def consumed_ids_of(meta: dict) -> dict[str, int]:
    """The checkpoint's dedup set. Checkpoints written before the dedup horizon hold a plain
    list of ids: with no version known (-1), those ids are never forgotten."""
    ids = meta["consumed_ids"]
    return {str(k): int(v) for k, v in ids.items()} if isinstance(ids, dict) else dict.fromkeys(map(str, ids), -1)


def make_publisher(cfg: LearnerJobConfig, learner: Learner, checkpointer, start: Start) -> PolicyPublisher:
    return PolicyPublisher(
        PolicyStore(cfg.policy_root),
        learner,
        checkpointer,
        version=start.version,
        is_primary=is_primary(),
        dtype=jnp.bfloat16 if cfg.publish_bf16 else None,
        keep_versions=cfg.keep_versions,
        delta_every=cfg.delta_every,
        delta_max_share=cfg.delta_max_share,
    )


def make_credits(window: CreditWindow) -> TrajectoryCredits:
    # Same rows and segments per row in every bucket, so one credit rule covers them all.
    log.info("feeder credits: %d trajectories in flight (%.2f batches ahead)", window.window, window.batches_ahead)
    return TrajectoryCredits(window.window, rounds=window.sync, request_timeout_s=window.request_timeout)


def read_plan(path: str | None) -> dict | None:
    """The localstack.launch.plan JSON at `path` (--plan), if any."""
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def warn_if_short(plan: dict | None, credits: TrajectoryCredits, publish_every: int) -> str | None:
    """With a plan: a warning (logged and returned) if the window cannot reach its duty cycle."""
    if plan is None:
        return None
    m = Measurements(**plan["measurements"])
    bound = plan["plan"].get("staleness_bound")
    warning = shortfall_warning(m, credits.window, publish_every, plan["plan"]["target_duty"], bound)
    if warning:
        log.warning("%s", warning)
    return warning


def make_schedule(cfg: LearnerJobConfig, batches: BatchBuffer, credits: TrajectoryCredits, plan: dict | None):
    if cfg.sync:
        per_record = plan["measurements"]["trajectories_per_record"] if plan else None  # sizes the first round
        steps, group = cfg.learner.publish_every, cfg.credits.group_size
        return SyncSchedule(batches, credits, steps, cfg.sync_round_timeout_s, group, per_record)
    return AsyncSchedule(batches, cfg.learner.publish_every)


def make_feeder(cfg: LearnerJobConfig, tasks, credits, staleness: StalenessControl, publisher, start: Start):
    """Requests stamped with the oldest version they may run on; None off the primary
    process (one feeder per job)."""
    if not is_primary():
        return None
    return Feeder(
        cfg.requests_topic,
        tasks,
        credits,
        cfg.credits.group_size,
        cfg.env.name,
        cfg.env.settings,
        min_version=lambda: staleness.cfg.min_request_version(publisher.version),
        start=start.feeder_position,
    )


def check_settings(cfg: LearnerJobConfig) -> None:
    """What would otherwise fail only later (in every rollout worker, as dead-lettered
    requests): refused now, naming the flag."""
    environments.load_entry_points()
    try:
        environments.make(cfg.env.name, **cfg.env.settings)
    except (KeyError, TypeError, ValueError) as e:
        why = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ValueError(f"{why} (--env {cfg.env.name!r}, --env_config {json.dumps(cfg.env.settings)})") from None
    if cfg.model.checkpoint:
        check_prompt_fits(cfg)


def check_resources(cfg: LearnerJobConfig) -> None:
    """A misspelled subscription or topic, or a missing bucket, fails now with its name
    (pubsub_io.PermanentError, store.StoreAccessError) instead of retrying until --timeout_s."""
    topics = [cfg.requests_topic, *([cfg.dead_letter_topic] if cfg.dead_letter_topic else [])]
    for note in pubsub_io.preflight(subscriptions=[cfg.records_subscription], topics=topics):
        log.info("start-up check: %s", note)
    if note := PolicyStore(cfg.policy_root).check_access():
        log.info("start-up check: %s", note)


def check_prompt_fits(cfg: LearnerJobConfig, turn_tokens: int = 32) -> None:
    """A checkpoint's chat prompt (system turn, tools block) can be hundreds of tokens: a
    layout whose episodes cannot hold it and one model turn is refused, with the numbers."""
    spec = policy_spec(cfg.model.checkpoint)
    fmt, env = chat_format_for(spec.tokenizer), environments.make(cfg.env.name, **cfg.env.settings)
    prompt = max(
        len(fmt.prompt_ids(t.prompt, env.tools()))
        for t in environments.make_tasks(cfg.env.name, 0, 8, "train", cfg.env.settings)
    )
    room = cfg.record_layout.trajectory_len
    if prompt + turn_tokens > room:
        raise ValueError(
            f"--model {cfg.model.checkpoint}: a {cfg.env.name} prompt in its chat format is {prompt} tokens "
            "(tools block included), "
            f"so episodes of at most {room} tokens (--max_trajectory_len / --seq_len) leave no room to act; "
            f"give a longer layout (the demo sizes one from the checkpoint: localstack/launch/model_layout.py)"
        )


def make_consumer(cfg: LearnerJobConfig, layout: RecordLayout, start: Start, checkpointer) -> RecordConsumer:
    """Acks a record once a durable checkpoint covers it (at once without checkpoints); the
    checkpoint's dedup set means a restart never trains a record twice."""
    return RecordConsumer(
        cfg.records_subscription,
        {s.key for s in layout.shapes},
        cfg.dead_letter_topic,
        delivery=cfg.delivery,
        max_staleness=cfg.applied_staleness().max_staleness,
        max_trajectory_len=layout.trajectory_len,
        consumed=start.consumed_ids,
        durable=None if checkpointer is None else checkpointer.durable_step,
    )


def make_data_plane(cfg: LearnerJobConfig, tasks, publisher, start: Start, checkpointer, stats, tel) -> DataPlane:
    """The consumer, feeder, credits, batch buffer, staleness control and schedule, as one."""
    if not is_primary():
        return FollowerPlane()  # one data plane per job, in process 0 (trainer/learning/step/lockstep.py)
    layout = cfg.record_layout
    staleness, credits = StalenessControl(cfg.applied_staleness()), make_credits(cfg.credit_window())
    plan = read_plan(cfg.plan)
    if not cfg.sync:
        warn_if_short(plan, credits, cfg.learner.publish_every)
    feeder = make_feeder(cfg, tasks, credits, staleness, publisher, start)
    consumer = make_consumer(cfg, layout, start, checkpointer)
    batches = BatchBuffer(layout.shapes, cfg.learner.batch_records, staleness, on_dropped=consumer.settle)
    schedule = make_schedule(cfg, batches, credits, plan)
    group = cfg.credits.group_size
    watch = StarvationWatch(cfg.starvation)
    lag = make_lag_control(cfg, credits)
    return DataPlane(layout, group, staleness, credits, consumer, batches, schedule, feeder, stats, tel, watch, lag)


def make_lag_control(cfg: LearnerJobConfig, credits: TrajectoryCredits) -> LagController | None:
    """The closed loop on the lag, asynchronous runs with a --lag_target only; it starts
    from the window the credits have (the plan's, or --max_in_flight)."""
    if cfg.lag.target is None or cfg.sync:
        return None
    w, group = cfg.credit_window(), cfg.credits.group_size
    steps, bound = cfg.learner.publish_every, cfg.staleness.max_staleness
    floor, ceiling = window_bounds(w.min_window, w.per_batch, steps, bound, group)
    lag = LagController(cfg.lag, credits.window, floor, ceiling, group)
    if lag.window != credits.window:
        credits.resize(lag.window)
    log.info(
        "lag control: target %g versions, window %d in [%d, %d], judged %d versions after a change",
        cfg.lag.target, lag.window, floor, ceiling, lag.settle,
    )  # fmt: skip
    return lag


def make_tracer(trace_dir: str | None):
    """The learner's timeline (off without --trace_dir, and on every process but the primary)."""
    return trace.install(trace.make_tracer(trace_dir if is_primary() else None, "learner"))


def make_telemetry(logdir: str | None, tracer, stats) -> LearnerTelemetry:
    writer = scalars.make_writer(logdir if is_primary() else None, "learner")
    status = Path(logdir) / "learner" / "status.json" if logdir and is_primary() else None
    if status is not None:
        status.parent.mkdir(parents=True, exist_ok=True)
    return LearnerTelemetry(writer, tracer, stats.started, status_path=status)
