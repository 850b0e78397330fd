"""Wires the learner job from its flags: shapes, learner, store, warm start, feeder,
consumer, credits and staleness control (Acme-style builder: roles stay visible)."""
from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp

import environments
from trainer.checkpoint import LearnerCheckpointer
from trainer.config import ModelConfig, RecordShape, model_config
from trainer.consumer import RecordConsumer
from trainer.feeder import CreditConfig, Feeder, TrajectoryCredits
from trainer.learner import Learner, LearnerConfig
from trainer.losses import LossConfig
from trainer.run_stats import RunStats
from trainer.staleness import StalenessConfig, StalenessControl
from trainer.store import PolicyStore
from trainer.warmstart import warm_start

log = logging.getLogger("trainer")


@dataclasses.dataclass
class LearnerJob:
    model_cfg: ModelConfig
    shapes: list[RecordShape]
    learner: Learner
    store: PolicyStore
    feeder: Feeder
    consumer: RecordConsumer
    credits: TrajectoryCredits
    staleness: StalenessControl
    stats: RunStats
    buffers: dict  # (rows, seq_len) -> records ready to train, oldest first
    version: int  # the newest published policy version
    peak_flops: float | None = None  # the devices' peak FLOP/s, for utilisation
    checkpointer: LearnerCheckpointer | None = None
    resumed_from_step: int | None = None
    publish_dtype: object = None  # e.g. jnp.bfloat16: workers get half the bytes
    keep_versions: int = 5  # policy versions kept in the store (the current one always)

    def publish_and_checkpoint(self) -> None:
        """A new policy version for the workers, then a learner checkpoint that knows it:
        a restarted learner resumes at exactly this version, feeder position and dedup set."""
        self.version += 1
        self.store.publish(self.version, self.learner.params_dict(), self.policy_metadata(), dtype=self.publish_dtype)
        self.stats.versions_published.append(self.version)
        self.store.gc(self.keep_versions)
        if self.checkpointer is not None:
            self.checkpointer.save(self.learner.steps, self.learner_state(), {
                "learner_version": self.version, "feeder_position": self.feeder.published,
                "consumed_ids": self.consumer.seen_ids})

    def learner_state(self) -> dict:
        return learner_state_of(self.learner)  # ref_params included: the store's v0 may be gc'ed

    def policy_metadata(self) -> dict:
        return {"model_config": self.model_cfg.to_dict(), "step": self.learner.steps}

    def take_batch(self) -> list | None:
        """batch_records records of one shape, oldest first, once they are fresh enough.
        Records that went stale while buffered (the version moved on) are dropped here."""
        n = self.learner.cfg.batch_records
        for shape, buffer in self.buffers.items():
            buffer[:] = [r for r in buffer if self.staleness.admit_again(r, self.version)]
            if len(buffer) >= n and not self.staleness.should_wait(buffer[:n], self.version):
                batch = buffer[:n]
                del buffer[:n]
                return batch
        return None


def load_prompts(args):
    """Training prompts: the environment's TFDS dataset when --data_dir is given (built
    there from the local generator on first use; nothing is downloaded), else generated."""
    environments.load_entry_points()  # environments from installed plugin packages
    if not args.data_dir:
        return environments.make_tasks(args.env, args.task_seed, 1000, "train")
    from environments import datasets

    datasets.build(args.env, args.data_dir, seed=args.task_seed)
    return list(datasets.load_tasks(args.env, "train", args.data_dir))


def build_job(args) -> LearnerJob:
    buckets = sorted({int(b) for b in args.buckets.split(",")}) if args.buckets else [args.seq_len]
    shapes = [RecordShape(args.rows, b, args.max_segments_per_row) for b in buckets]
    loss = LossConfig(algorithm=args.loss, eps_low=args.eps_low, eps_high=args.eps_high,
                      aggregation=args.aggregation, max_segments=args.max_segments_per_row,
                      tis_cap=args.tis_cap, kl_coef=args.kl_coef, kl_estimator=args.kl_estimator)
    cfg = LearnerConfig(batch_records=args.batch_records, learning_rate=args.learning_rate,
                        publish_every=args.publish_every, seed=args.seed, loss=loss)
    # Same rows and segments per row in every bucket, so one credit rule covers them all.
    credits_cfg = CreditConfig(args.max_batches_ahead, args.batch_records, shapes[-1], args.group_size)
    staleness = StalenessControl(StalenessConfig(args.max_staleness, args.max_mean_staleness))
    mcfg = model_config(args.model_config)
    store, learner = PolicyStore(args.policy_root), Learner(mcfg, cfg)
    tasks = load_prompts(args)
    ckpt = LearnerCheckpointer(args.checkpoint_dir) if args.checkpoint_dir else None
    if loss.kl_coef > 0:
        learner.set_reference(learner.params)  # placeholder with the right shapes until set below
    restored = ckpt.restore_latest(_abstract(learner_state_of(learner))) if ckpt else None
    latest = store.latest_version()
    if restored:
        step, state, meta = restored
        learner.params, learner.opt_state, learner.steps = state["params"], state["opt_state"], step
        if "ref_params" in state:
            learner.ref_params = state["ref_params"]
        version = meta["learner_version"]
    else:
        if args.warmstart_steps:
            learner.params, losses = warm_start(learner.graphdef, learner.params, args.env, tasks,
                                                args.warmstart_steps, seed=args.seed)
            log.info("warm start: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
        if loss.kl_coef > 0:
            learner.set_reference(learner.params)  # the policy RL starts from, loaded once
        version = -1
    job = LearnerJob(mcfg, shapes, learner, store, feeder=None, consumer=None,
                     credits=TrajectoryCredits(credits_cfg.window), staleness=staleness,
                     stats=None, buffers={(s.rows, s.seq_len): [] for s in shapes}, version=version,
                     peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
                     checkpointer=ckpt, resumed_from_step=restored[0] if restored else None,
                     publish_dtype=jnp.bfloat16 if args.publish_bf16 else None, keep_versions=args.keep_versions)
    if not restored or (latest is not None and latest > version):
        # A fresh start, or a crash after a publish but before its checkpoint: the workers
        # must get these params under a version number above everything in the store.
        job.version = max(version, -1 if latest is None else latest) + 1
        store.publish(job.version, learner.params_dict(), job.policy_metadata(), dtype=job.publish_dtype)
    job.stats = RunStats(learner_version=job.version)
    job.feeder = Feeder(args.requests_topic, tasks, job.credits, args.group_size, args.env, args.env_config,
                        min_version=lambda: staleness.cfg.min_request_version(job.version),
                        start=restored[2]["feeder_position"] if restored else 0)
    job.consumer = RecordConsumer(args.records_subscription, {(s.rows, s.seq_len) for s in shapes},
                                  args.dead_letter_topic)
    if restored:
        job.consumer.seen_ids = set(restored[2]["consumed_ids"])  # never train a record twice
    return job


def learner_state_of(learner: Learner) -> dict:
    state = {"params": learner.params, "opt_state": learner.opt_state}
    if learner.ref_params is not None:
        state["ref_params"] = learner.ref_params
    return state


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
