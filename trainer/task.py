"""Learner entry point (local process or Vertex AI custom job): `python -m trainer.task`.

Publishes policy v0, starts the feeder, then trains on packed records from Pub/Sub and
publishes a new policy version every `publish_every` steps.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import environments
from trainer.config import RecordShape, model_config
from trainer.consumer import RecordConsumer
from trainer.feeder import CreditConfig, Feeder, TrajectoryCredits
from trainer.learner import Learner, LearnerConfig
from trainer.run_stats import RunStats
from trainer.store import PolicyStore
from trainer.warmstart import warm_start

log = logging.getLogger("trainer")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests_topic", required=True)
    p.add_argument("--records_subscription", required=True)
    p.add_argument("--dead_letter_topic", default=None)
    p.add_argument("--policy_root", required=True)
    p.add_argument("--model_config", default="tiny")
    p.add_argument("--max_steps", type=int, default=20)
    p.add_argument("--timeout_s", type=float, default=600.0, help="give up (exit 1) after this long")
    p.add_argument("--batch_records", type=int, default=2)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--buckets", default=None, help="record lengths, e.g. 128,256 (default: --seq_len)")
    p.add_argument("--max_segments_per_row", type=int, default=2)
    p.add_argument("--group_size", type=int, default=4)
    p.add_argument("--publish_every", type=int, default=5)
    p.add_argument("--max_batches_ahead", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--env", default="calculator")
    p.add_argument("--env_config", type=json.loads, default={}, help='JSON, e.g. {"tool_latency": "fixed:0.1"}')
    p.add_argument("--task_seed", type=int, default=0)
    p.add_argument("--data_dir", default=None,
                   help="read prompts from the environment's TFDS dataset here (built locally if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmstart_steps", type=int, default=0,
                   help="behaviour-cloning steps on oracle episodes before policy v0 (0 = random init)")
    p.add_argument("--summary_path", default=None, help="also write the run summary here as JSON")
    return p.parse_args(argv)


def load_prompts(args):
    """Training prompts: the environment's TFDS dataset when --data_dir is given (built
    there from the local generator on first use; nothing is downloaded), else generated."""
    environments.load_entry_points()  # environments from installed plugin packages
    if not args.data_dir:
        return environments.make_tasks(args.env, args.task_seed, 1000, "train")
    from environments import datasets

    datasets.build(args.env, args.data_dir, seed=args.task_seed)
    return list(datasets.load_tasks(args.env, "train", args.data_dir))


def take_batch(buffers: dict, batch_records: int) -> list | None:
    """batch_records records of one shape (one compiled step per bucket), oldest first."""
    for buffer in buffers.values():
        if len(buffer) >= batch_records:
            batch = buffer[:batch_records]
            del buffer[:batch_records]
            return batch
    return None


def run(args) -> dict:
    buckets = sorted({int(b) for b in args.buckets.split(",")}) if args.buckets else [args.seq_len]
    shapes = [RecordShape(args.rows, b, args.max_segments_per_row) for b in buckets]
    shape = shapes[-1]  # same rows and segments per row in every bucket: one credit rule
    cfg = LearnerConfig(batch_records=args.batch_records, learning_rate=args.learning_rate,
                        publish_every=args.publish_every, seed=args.seed)
    credits_cfg = CreditConfig(args.max_batches_ahead, args.batch_records, shape, args.group_size)
    mcfg = model_config(args.model_config)
    store, learner = PolicyStore(args.policy_root), Learner(mcfg, cfg)
    tasks = load_prompts(args)
    if args.warmstart_steps:
        learner.params, losses = warm_start(learner.graphdef, learner.params, args.env, tasks,
                                            args.warmstart_steps, seed=args.seed)
        log.info("warm start: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
    version = (store.latest_version() or -1) + 1  # never re-publish an existing version
    store.publish(version, learner.params_dict(), {"model_config": mcfg.to_dict(), "step": 0})
    credits = TrajectoryCredits(credits_cfg.window)
    feeder = Feeder(args.requests_topic, tasks, credits, args.group_size, args.env, args.env_config)
    consumer = RecordConsumer(args.records_subscription, {(s.rows, s.seq_len) for s in shapes},
                              args.dead_letter_topic)
    stats, buffers = RunStats(learner_version=version), {(s.rows, s.seq_len): [] for s in shapes}
    feeder.start()
    deadline = time.monotonic() + args.timeout_s
    try:
        while learner.steps < args.max_steps:
            if time.monotonic() > deadline or feeder.error:
                raise RuntimeError(f"learner stopped at step {learner.steps}: "
                                   f"{feeder.error or f'timeout after {args.timeout_s}s'}")
            for rec in consumer.poll(max_messages=10, timeout_s=1.0):
                credits.release(len(rec.trajectories))
                stats.on_record(rec, version)
                buffers[rec.shape].append(rec)  # a batch holds one shape: one compile per bucket
            credits.release(consumer.take_dropped())
            while learner.steps < args.max_steps and (batch := take_batch(buffers, cfg.batch_records)):
                metrics = stats.on_step(lambda: learner.train_step(batch))
                if learner.steps % cfg.publish_every == 0:
                    version += 1
                    store.publish(version, learner.params_dict(), {"model_config": mcfg.to_dict(), "step": learner.steps})
                    stats.versions_published.append(version)
                log.info("step %d version %d loss %.4f reward %.3f", learner.steps, version,
                         metrics["losses/policy_loss"], stats.mean_reward())
    finally:
        feeder.stop()
        consumer.close()
    return stats.summary(learner, consumer, feeder, shapes)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    summary = run(args)
    print(json.dumps(summary, indent=2))
    if args.summary_path:
        with open(args.summary_path, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
