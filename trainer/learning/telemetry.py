"""The learner's telemetry: one scalar row per train step (TensorBoard + JSONL, the
names below) and spans on its timeline (poll, wait for data, train step, publish,
checkpoint). Only the primary process of a multi-host learner writes.

Row names: `losses/*` (the step's own metrics), `perf/*` (step time, duty cycle and
trained tokens/s over the whole run and the last `recent_s` seconds), `policy/version`,
`staleness/{mean,max}` of the batch, `data/*` (fill, reward, records received, buffered,
dead-lettered, dropped stale), `feeder/*` (trajectories in flight, requests published),
and every 30 s the process's `mem/*` gauges (core/process_memory.py), as the
rollout workers' and the evaluator's rows carry them.
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

from core import process_memory


class LearnerTelemetry:
    def __init__(self, writer, tracer, started: float, recent_s: float = 30.0, clock=time.monotonic, status_path=None):
        self.writer, self.tracer, self.started, self.recent_s, self.clock = writer, tracer, started, recent_s, clock
        # What the learner is waiting for, when it starves (the live panel shows it): JSON.
        self.status_path, self._waiting = Path(status_path) if status_path else None, None
        self._steps = collections.deque()  # (end time, step seconds, tokens) of recent steps
        self._idle_since: int | None = time.perf_counter_ns()  # wait-for-data span start
        self._memory = process_memory.Periodic()

    def span(self, name: str, **args):
        return self.tracer.span(name, "learner", **args)

    def waiting(self, text: str | None) -> None:
        """Why no record comes (None: records come). Written only when it changes."""
        if self.status_path is None or text == self._waiting:
            return
        self._waiting = text
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"wall_time": time.time(), "waiting": text}))
        os.replace(tmp, self.status_path)  # the panel never reads half a file

    def polled(self, started_ns: int, records: int) -> None:
        """A poll span, when it brought records (an empty poll is part of waiting for data;
        on the emulator it returns at once, many times a second)."""
        if records:
            self.tracer.complete("poll", "learner", started_ns, time.perf_counter_ns(), records=records)

    def compiled(self, started_ns: int, min_ms: float = 10.0) -> None:
        """A compile span, when the step's cost lookup compiled (its first batch of a shape)."""
        now = time.perf_counter_ns()
        if now - started_ns > min_ms * 1e6:
            self.tracer.complete("compile", "learner", started_ns, now)

    def data_ready(self) -> None:
        """A batch is ready: the time since the last step ended was spent waiting for it."""
        if self._idle_since is not None:
            self.tracer.complete("wait for data", "learner", self._idle_since, time.perf_counter_ns())
            self._idle_since = None

    def recent(self, now: float) -> tuple[float, float]:
        """(duty cycle, trained tokens/s) over the last recent_s seconds (or the run so far)."""
        while self._steps and self._steps[0][0] < now - self.recent_s:
            self._steps.popleft()
        span = max(min(self.recent_s, now - self.started), 1e-9)
        # Only the part of a step inside the window counts: a step longer than the window
        # (minutes at a real model's size) would otherwise make the duty cycle exceed 1.
        busy = tokens = 0.0
        for end, s, t in self._steps:
            inside = min(s, end - (now - span)) / s if s > 0 else 1.0
            busy, tokens = busy + s * inside, tokens + t * inside
        return busy / span, tokens / span

    def on_step(
        self, step: int, version: int, stats, batch, metrics: dict, step_s: float, parts, trained_at=None
    ) -> dict:
        """One row after train step `step`; `parts` is the data plane (trainer/learning/
        data_plane.py): its staleness control, credits, consumer, batch buffer and feeder
        (None off the primary process). `version`: the newest published, after this step's
        publish if it made one; `trained_at`: the version the step trained on (default
        `version`), from which its records' staleness counts: a step that publishes would
        otherwise count each of its records one version staler than it was."""
        trained_at = version if trained_at is None else trained_at
        self._idle_since = time.perf_counter_ns()
        now = self.clock()
        self._steps.append((now, step_s, sum(r.num_tokens for r in batch)))
        duty_recent, tps_recent = self.recent(now)
        wall = max(now - self.started, 1e-9)
        stale = [parts.staleness.staleness(r, trained_at) for r in batch if r.trajectories]
        trajs = [t for r in batch for t in r.trajectories]
        row = {
            **metrics,
            "perf/step_s": round(step_s, 4),
            "perf/wall_s": round(wall, 2),
            "perf/duty_cycle": round(stats.step_time_s / wall, 4),
            "perf/duty_cycle_recent": round(duty_recent, 4),
            "perf/trained_tokens_per_s": round(stats.trained_tokens / wall, 1),
            "perf/trained_tokens_per_s_recent": round(tps_recent, 1),
            "policy/version": version,
            "staleness/mean": round(sum(stale) / len(stale), 3) if stale else 0.0,
            "staleness/max": max(stale, default=0),
            "data/fill": round(sum(r.num_tokens / r.tokens.size for r in batch) / len(batch), 4),
            "data/batch_reward": round(sum(t.reward for t in trajs) / len(trajs), 4) if trajs else 0.0,
            "data/batch_trajectories": len(trajs),
            "data/records_received": stats.records,
            "data/trajectories_received": stats.trajectories_received,
            "data/records_buffered": sum(len(q) for q in parts.batches.queues.values()),
            "data/records_dead_lettered": parts.consumer.rejected,
            "data/records_duplicate": parts.consumer.duplicates,
            "data/records_dropped_stale": parts.staleness.dropped_records,
            "data/records_held_unacked": len(parts.consumer.deliveries.held),
            "data/dedup_ids": len(parts.consumer.deliveries.consumed),
            "data/pubsub_errors": parts.consumer.pubsub_errors,
            "feeder/in_flight": parts.credits.outstanding,
            "feeder/window": parts.credits.window,  # the lag controller moves it
            "feeder/requests_published": parts.feeder.published if parts.feeder else 0,
            # The whole run's admitted records by versions behind (the live panel's distribution).
            **{f"staleness/records_{k}": n for k, n in sorted(parts.staleness.histogram.items())},
        }
        if getattr(parts, "lag", None) is not None:
            row["lag/target"] = parts.lag.cfg.target
            row["lag/changes"] = len(parts.lag.changes)
            if parts.lag.last_lag is not None:
                row["lag/measured"] = round(parts.lag.last_lag, 3)
        row.update(self._memory.row(now, getattr(self.writer, "local_dir", None)))
        self.writer.write(step, row)
        self.tracer.counter("learner", duty_recent=round(duty_recent, 3), in_flight=parts.credits.outstanding)
        return row

    def close(self) -> None:
        self.writer.close()
        self.tracer.close()
