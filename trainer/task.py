"""Learner entry point (local process or Vertex AI custom job): `python -m trainer.task`.

Publishes policy v0, starts the feeder, then trains on packed records from Pub/Sub and
publishes a new policy version every `publish_every` steps.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from trainer.builder import build_job
from trainer.distributed import maybe_initialize_distributed, read_vertex_env

log = logging.getLogger("trainer")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests_topic", required=True)
    p.add_argument("--records_subscription", required=True)
    p.add_argument("--dead_letter_topic", default=None)
    # On Vertex AI the job's model dir is a natural default (gs://…/model/).
    p.add_argument("--policy_root", default=os.environ.get("AIP_MODEL_DIR"),
                   required=os.environ.get("AIP_MODEL_DIR") is None)
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
    p.add_argument("--max_batches_ahead", type=int, default=1, help="feeder credits, in batches")
    p.add_argument("--max_staleness", type=int, default=2,
                   help="drop records older than this many versions (0 + --max_batches_ahead 0: synchronous)")
    p.add_argument("--max_mean_staleness", type=float, default=None,
                   help="wait for fresher data while the ready data is staler than this on average")
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--loss", default="ppo", choices=["ppo", "gspo_token", "decoupled_ppo"])
    p.add_argument("--eps_low", type=float, default=0.2)
    p.add_argument("--eps_high", type=float, default=0.28)
    p.add_argument("--aggregation", default="token-mean",
                   choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
    p.add_argument("--tis_cap", type=float, default=None, help="truncated importance sampling cap (off)")
    p.add_argument("--kl_coef", type=float, default=0.0, help="KL to the reference (the v0 policy)")
    p.add_argument("--kl_estimator", default="k3", choices=["k1", "k2", "k3"])
    p.add_argument("--env", default="calculator")
    p.add_argument("--env_config", type=json.loads, default={}, help='JSON, e.g. {"tool_latency": "fixed:0.1"}')
    p.add_argument("--task_seed", type=int, default=0)
    p.add_argument("--data_dir", default=None,
                   help="read prompts from the environment's TFDS dataset here (built locally if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmstart_steps", type=int, default=0,
                   help="behaviour-cloning steps on oracle episodes before policy v0 (0 = random init)")
    p.add_argument("--peak_tflops", type=float, default=None,
                   help="the accelerator's peak, for model-FLOPs utilisation (e.g. 197 per v5e chip)")
    p.add_argument("--publish_bf16", action="store_true", help="publish policy versions in bfloat16")
    p.add_argument("--keep_versions", type=int, default=5, help="policy versions kept in the store")
    p.add_argument("--checkpoint_dir", default=os.environ.get("AIP_CHECKPOINT_DIR"),
                   help="learner checkpoints (a dir or gs://…), saved at every policy publish; "
                        "a restarted learner resumes from the newest")
    p.add_argument("--summary_path", default=None, help="also write the run summary here as JSON")
    return p.parse_args(argv)


def run(args) -> dict:
    job = build_job(args)
    learner, staleness, stats = job.learner, job.staleness, job.stats
    job.feeder.start()
    deadline = time.monotonic() + args.timeout_s
    try:
        while learner.steps < args.max_steps:
            if time.monotonic() > deadline or job.feeder.error:
                raise RuntimeError(f"learner stopped at step {learner.steps}: "
                                   f"{job.feeder.error or f'timeout after {args.timeout_s}s'}")
            for rec in job.consumer.poll(max_messages=100, timeout_s=1.0):
                job.credits.release(len(rec.trajectories))  # received: its credits are back
                stats.on_record(rec)
                if staleness.admit(rec, job.version):
                    job.buffers[rec.shape].append(rec)  # one shape per batch: one compile per bucket
            job.credits.release(job.consumer.take_dropped())
            while learner.steps < args.max_steps and (batch := job.take_batch()):
                metrics = stats.on_step(learner, batch)
                if learner.steps % learner.cfg.publish_every == 0:
                    job.publish_and_checkpoint()
                log.info("step %d version %d loss %.4f reward %.3f", learner.steps, job.version,
                         metrics["losses/policy_loss"], stats.mean_reward())
    finally:
        job.feeder.stop()
        job.consumer.close()
        if job.checkpointer is not None:
            job.checkpointer.close()  # waits for the last save
    return stats.summary(job)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
