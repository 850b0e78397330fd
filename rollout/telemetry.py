"""The rollout side's live numbers, per process: what its episodes, packer and policy
poller did, written every `every_s` seconds as one `rollout/...` row (TensorBoard and
JSONL, core.telemetry.scalars) and as spans on the process's trace.

Why not Beam Metrics alone: BundleBasedDirectRunner reports only the first bundle's
metric updates of a running job (docs/ARCHITECTURE.md), so a local run's counters would read near
zero. Beam Metrics stay as they are (Dataflow shows them); this is the same counting,
kept in the process and flushed to files. One instance per worker process, installed by
the RolloutWorker; DoFns find it with `current()` (they are pickled, so they cannot hold it).
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time

import numpy as np

from core import process_memory
from core.telemetry import scalars, trace

# Per-episode environment latency buckets (upper edges, ms): the report's distribution.
LATENCY_EDGES_MS = (10, 50, 100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000)


class RolloutTelemetry:
    def __init__(self, writer, tracer, every_s: float = 2.0, clock=time.monotonic):
        self.writer, self.tracer, self.every_s, self.clock = writer, tracer, every_s, clock
        self.lanes = trace.Lanes("episode")
        self._lock = threading.Lock()
        self.started = clock()
        self.totals = collections.Counter()  # cumulative counts, keyed by metric name
        self.latency_hist = [0] * (len(LATENCY_EDGES_MS) + 1)
        self._window: dict[str, list[float]] = collections.defaultdict(list)
        self._last = (self.started, collections.Counter(), 0.0)  # time, totals, engine busy_s then
        self.source = None  # () -> dict of gauges (policy version, engine stats, groups in flight)
        self._stop = threading.Event()
        self._thread = None
        self._memory = process_memory.Periodic()  # mem/... gauges, a long run's growth told apart by kind
        process_memory.start_tracing()

    # -- counting (called from DoFns, any thread) ------------------------------------------
    def on_group(self, group) -> None:
        with self._lock:
            for t in group:
                self.totals[f"episodes_{t.status}"] += 1
                self.totals["episodes"] += 1
                self.totals["generated_tokens"] += int(t.loss_mask.sum())
                ms = t.env_latency_s * 1000
                self._window["env_latency_ms"].append(ms)
                self.latency_hist[int(np.searchsorted(LATENCY_EDGES_MS, ms, side="right"))] += 1
                if t.tool_wait_s > 0:  # episodes that called a tool: what the tools made them wait
                    self._window["tool_wait_ms"].append(t.tool_wait_s * 1000)
                self._window["reward"].append(t.reward)

    def on_record(self, fill: float, latency_ms: int | None, reason: str, trajectories: int = 0) -> None:
        with self._lock:
            self.totals["records"] += 1
            self.totals["trajectories_packed"] += trajectories
            self.totals[f"flush_{reason}"] += 1
            self._window["fill"].append(fill)
            if latency_ms is not None:
                self._window["flush_latency_ms"].append(latency_ms)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.totals[name] += n

    # -- reporting -------------------------------------------------------------------------
    def row(self) -> dict:
        """The row for the time since the last one: rates, window stats, cumulative counts."""
        now = self.clock()
        gauges = self.source() if self.source else {}
        with self._lock:
            window, self._window = self._window, collections.defaultdict(list)
            totals = dict(self.totals)
            hist = list(self.latency_hist)
        then, last_totals, last_busy = self._last
        dt = max(now - then, 1e-9)
        busy = gauges.pop("engine_busy_s", last_busy)
        self._last = (now, collections.Counter(totals), busy)
        row = {f"rollout/{k}": v for k, v in totals.items()}
        row["rollout/episodes_per_s"] = round((totals.get("episodes", 0) - last_totals["episodes"]) / dt, 3)
        row["rollout/generated_tokens_per_s"] = round(
            (totals.get("generated_tokens", 0) - last_totals["generated_tokens"]) / dt, 1
        )
        row["rollout/engine_busy"] = round(min((busy - last_busy) / dt, 1.0), 4)
        for name, values in window.items():
            if values:
                row[f"rollout/{name}_mean"] = round(float(np.mean(values)), 4)
                if name.endswith("_ms"):
                    row[f"rollout/{name}_p50"] = round(float(np.percentile(values, 50)), 1)
                    row[f"rollout/{name}_p95"] = round(float(np.percentile(values, 95)), 1)
        row.update({f"rollout/{k}": v for k, v in gauges.items()})
        row["rollout/env_latency_hist"] = {"edges_ms": list(LATENCY_EDGES_MS), "counts": hist}
        row.update(self._memory.row(now, self.writer.local_dir))
        return row

    def write_row(self) -> None:
        row = self.row()
        self.writer.write(int(self.clock() - self.started), row)
        if "rollout/groups_in_flight" in row:
            self.tracer.counter("groups in flight", groups=row["rollout/groups_in_flight"])

    def start(self) -> None:
        def loop():
            while not self._stop.wait(self.every_s):
                try:
                    self.write_row()
                except Exception as e:  # telemetry must never take a worker down
                    self.count("telemetry_errors")
                    logging.getLogger(__name__).warning("rollout telemetry row failed: %s", e)

        self._thread = threading.Thread(target=loop, name="rollout-telemetry", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._stop.is_set():
            return  # closed already (a signal handler, then the interpreter's exit)
        self._stop.set()
        self.write_row()
        self.writer.close()
        self.tracer.close()


class _NullTelemetry(RolloutTelemetry):
    """No worker in this process (tests of single transforms): nothing is kept or written."""

    def __init__(self):
        super().__init__(scalars.NullWriter(), trace.NULL)

    def on_group(self, group) -> None:
        pass

    def on_record(self, fill: float, latency_ms: int | None, reason: str, trajectories: int = 0) -> None:
        pass

    def count(self, name: str, n: int = 1) -> None:
        pass


_current: RolloutTelemetry = _NullTelemetry()


def install(t: RolloutTelemetry) -> RolloutTelemetry:
    global _current
    _current = t
    return t


def current() -> RolloutTelemetry:
    return _current


def make_telemetry(logdir: str | None, trace_dir: str | None, every_s: float = 2.0) -> RolloutTelemetry:
    source = f"rollout-{socket.gethostname()}-{os.getpid()}"
    return RolloutTelemetry(scalars.make_writer(logdir, source), trace.make_tracer(trace_dir, "rollout"), every_s)
