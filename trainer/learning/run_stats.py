"""What the learner saw and did, for logs and the end-of-run summary."""

from __future__ import annotations

import collections
import time

from core.contracts.records import digest_matches
from core.contracts.run_summary import DedupIds, RunSummary


class RunStats:
    def __init__(self, peak_flops: float | None = None):
        self.started = time.monotonic()
        self.peak_flops = peak_flops  # the devices' peak FLOP/s, for utilisation
        self.step_time_s = 0.0
        self.records = 0
        self.tokens = 0
        self.loss_tokens = 0
        self.trajectories_received = 0
        self.reward_sum = 0.0  # a sum, not a list: the learner runs for hours
        self.statuses = collections.Counter()
        self.record_shapes = collections.Counter()
        self.record_versions = collections.Counter()  # max policy version in each record
        self.last_metrics: dict[str, float] = {}
        self.trained_tokens = 0
        self.flops = 0.0
        self.trained_ids: set[str] = set()
        self.trained_trajectories = 0
        self.tokens_verified = 0  # trained trajectories whose tokens equal what was sampled
        # Steady state: from the end of the first step (start-up and its compile excluded).
        self.first_step_end: float | None = None
        self.first_step_s = 0.0
        self.first_step_tokens = 0

    def on_record(self, rec) -> None:
        self.records += 1
        self.tokens += rec.num_tokens
        self.loss_tokens += rec.num_loss_tokens
        self.record_shapes[f"{rec.shape[0]}x{rec.shape[1]}"] += 1
        self.record_versions[rec.max_policy_version] += 1
        for t in rec.trajectories:
            self.trajectories_received += 1
            self.reward_sum += t.reward
            self.statuses[t.status] += 1

    def on_step(self, batch, metrics: dict[str, float], step_s: float, flops: float) -> None:
        """One train step on `batch` that took `step_s` seconds and `flops` FLOPs."""
        self.last_metrics = metrics
        self.step_time_s += step_s
        self.flops += flops
        self.trained_tokens += sum(r.num_tokens for r in batch)
        self.trained_ids.update(r.record_id for r in batch if r.trajectories)  # not the sync baseline's padding
        self.trained_trajectories += sum(len(r.trajectories) for r in batch)
        # Again at training (decode checked it already): what was trained is what was sampled.
        for r in batch:
            arrays = r.arrays()
            self.tokens_verified += sum(1 for t in r.trajectories if t.digest and digest_matches(arrays, t))
        if self.first_step_end is None:
            self.first_step_end, self.first_step_s, self.first_step_tokens = (
                time.monotonic(),
                step_s,
                self.trained_tokens,
            )

    def mean_reward(self) -> float:
        return self.reward_sum / self.trajectories_received if self.trajectories_received else 0.0

    def steady(self, now: float) -> dict:
        """Duty cycle and trained tokens/s after the first step: what the benchmarks compare
        (the first step carries the compile and the wait for the rollout side to start)."""
        if self.first_step_end is None or now <= self.first_step_end:
            return {}
        wall = now - self.first_step_end
        return {
            "steady_duty_cycle": round((self.step_time_s - self.first_step_s) / wall, 4),
            "steady_trained_tokens_per_s": round((self.trained_tokens - self.first_step_tokens) / wall, 1),
            "steady_wall_s": round(wall, 2),
            "first_step_s": round(self.first_step_s, 3),
        }

    def summary(self, learner, start, publisher, consumer, feeder, staleness, layout, **rest) -> RunSummary:
        """The run's summary from these parts' counters; `rest`: the schedule's and the
        accounting's fields."""
        now = time.monotonic()
        wall = now - self.started
        step_s = self.step_time_s
        deliveries = consumer.deliveries
        return RunSummary(
            **self.steady(now),
            steps=learner.steps,
            mesh=dict(learner.mesh.shape) if learner.mesh is not None else None,
            resumed_from_step=start.resumed_from_step,
            warmstart_s=start.warmstart_s,
            trained_record_ids=sorted(self.trained_ids),
            policy_versions_published=list(publisher.published),
            policy_version_writes=list(publisher.writes),
            records_consumed=self.records,
            records_rejected=consumer.rejected,
            records_duplicate=consumer.duplicates,
            records_redelivered_while_held=deliveries.redelivered,
            dedup_ids=DedupIds(len(deliveries.consumed), deliveries.peak_consumed, deliveries.expired),
            pubsub_errors=consumer.pubsub_errors,
            trajectories_dropped_by_pipeline=dict(consumer.dropped_trajectories),
            tokens_consumed=self.tokens,
            loss_tokens_consumed=self.loss_tokens,
            trajectories=self.trajectories_received,
            trajectories_tokens_verified=self.tokens_verified,
            mean_reward=round(self.mean_reward(), 4),
            episode_status=dict(self.statuses),
            declared_record_shapes=[f"{s.rows}x{s.seq_len}" for s in layout.shapes],
            record_shapes=dict(self.record_shapes),
            records_by_max_policy_version={str(k): v for k, v in sorted(self.record_versions.items())},
            staleness_histogram={str(k): v for k, v in sorted(staleness.histogram.items())},
            records_dropped_stale=staleness.dropped_records,
            trajectories_dropped_stale=staleness.dropped_trajectories,
            staleness_waits=staleness.waits,
            requests_published=feeder.published if feeder else None,
            requests_redone=feeder.redone if feeder else None,
            request_publish_errors=feeder.publish_errors if feeder else None,
            compiled_train_steps=learner.compiled_variants(),
            wall_s=round(wall, 2),
            learner_duty_cycle=round(step_s / wall, 4) if wall else 0.0,
            trained_tokens_per_s=round(self.trained_tokens / wall, 1) if wall else 0.0,
            trained_tokens_per_step_s=round(self.trained_tokens / step_s, 1) if step_s else 0.0,
            step_tflops_per_s=round(self.flops / step_s / 1e12, 6) if step_s else 0.0,
            mfu=round(self.flops / step_s / self.peak_flops, 6) if step_s and self.peak_flops else None,
            last_metrics={k: round(float(v), 5) for k, v in self.last_metrics.items()},
            **rest,
        )
