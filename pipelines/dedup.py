"""Deduplication by a key (trajectory id, content hash) with bounded state.

Beam's `DeduplicatePerKey` keys its state and expiry timer by the element's own key,
i.e. one key per trajectory. The local runner keeps every key it has ever seen and scans
all of them for due timers after every bundle: profiled on the demo's rollout job, that
scan grew with every trajectory seen and slowed the learner's steps several-fold within a
run (docs/BENCHMARKS.md). Here the keys are spread over a fixed number of
shards instead; each shard's state is one map {key: first seen}, insertion-ordered, and
entries older than `window_s` are expired on access. State stays bounded by
arrival rate x window on every runner, and the runner sees `num_shards` keys only.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.coders import Coder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from core.contracts.trajectory import Trajectory
from pipelines.metrics import NAMESPACE
from rollout.telemetry import current as telemetry

NS = NAMESPACE
Clock = Callable[[], float]


class SeenKeysCoder(Coder):
    """{key: first seen (s)} as JSON pairs, in insertion order (oldest first)."""

    def encode(self, value: dict[str, float]) -> bytes:
        return json.dumps(list(value.items())).encode()

    def decode(self, encoded: bytes) -> dict[str, float]:
        return {str(k): float(t) for k, t in json.loads(encoded)}

    def is_deterministic(self) -> bool:
        return True


def expire(seen: dict[str, float], now: float, window_s: float) -> dict[str, float]:
    """Drops the entries first seen more than window_s ago; the map is oldest first."""
    horizon = now - window_s
    if not seen or next(iter(seen.values())) >= horizon:
        return seen
    return {k: t for k, t in seen.items() if t >= horizon}


DUPLICATES = "duplicates"  # tagged output of DedupBy(report_duplicates=True): dropped ids


class DedupFn(beam.DoFn):
    """(shard, (key, trajectory)) -> trajectory, the first per key within window_s; with
    report_duplicates, each dropped trajectory's id on the DUPLICATES output."""

    SEEN = ReadModifyWriteStateSpec("seen", SeenKeysCoder())

    def __init__(self, name: str, window_s: float, clock: Clock = time.time, report_duplicates: bool = False):
        self.name, self.window_s, self.clock = name, window_s, clock
        self.report_duplicates = report_duplicates
        self.count_in = Metrics.counter(NS, f"{name}_in")
        self.count_out = Metrics.counter(NS, f"{name}_out")
        self.dropped = Metrics.counter(NS, f"{name}_dropped")
        self.expired = Metrics.counter(NS, f"{name}_expired")
        self.state_keys = Metrics.distribution(NS, f"{name}_state_keys")  # per shard, after the element

    def process(self, kv, seen_state=beam.DoFn.StateParam(SEEN)):
        key, t = kv[1]
        self.count_in.inc()
        now = self.clock()
        before = seen_state.read() or {}
        seen = expire(before, now, self.window_s)
        self.expired.inc(len(before) - len(seen))
        duplicate = key in seen
        if not duplicate:
            seen[key] = now
        if not duplicate or seen is not before:
            seen_state.write(seen)
        self.state_keys.update(len(seen))
        if duplicate:
            self.dropped.inc()
            telemetry().count(f"trajectories_{self.name}_dropped")
            if self.report_duplicates:
                yield beam.pvalue.TaggedOutput(DUPLICATES, t.trajectory_id)
            return
        self.count_out.inc()
        yield t


class DedupBy(beam.PTransform):
    """Keeps the first trajectory per key for `window_s` of processing time. Counters
    `<name>_in`, `<name>_out` and `<name>_dropped` (in = out + dropped), `<name>_expired`,
    and the distribution `<name>_state_keys` (keys remembered per shard)."""

    def __init__(
        self,
        name: str,
        key_fn: Callable[[Trajectory], str],
        window_s: float,
        num_shards: int = 16,
        clock: Clock = time.time,
        report_duplicates: bool = False,
    ):
        super().__init__()
        self.name, self.key_fn, self.window_s = name, key_fn, window_s
        self.num_shards, self.clock, self.report_duplicates = num_shards, clock, report_duplicates

    def expand(self, trajectories):
        key_fn, shards = self.key_fn, self.num_shards

        def keyed(t):
            key = key_fn(t)
            return zlib.crc32(key.encode()) % shards, (key, t)

        keyed_trajectories = trajectories | "KeyByShard" >> beam.Map(keyed).with_output_types(tuple[int, Any])
        dedup = beam.ParDo(DedupFn(self.name, self.window_s, self.clock, self.report_duplicates))
        if self.report_duplicates:  # {"kept": trajectories, DUPLICATES: their dropped copies' ids}
            return keyed_trajectories | "Deduplicate" >> dedup.with_outputs(DUPLICATES, main="kept")
        return keyed_trajectories | "Deduplicate" >> dedup
