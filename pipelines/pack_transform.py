"""Trajectory groups -> fixed-shape packed records, per length bucket, windowed.

    groups ─ FilterZeroSignalGroups ─ FlattenGroups ─ DedupById ─ [DedupByContent]
      ─ FitToBuckets ─ TimestampByFinish ─ WindowIntoFixed ─ KeyByBucketShard
      ─ PackRecords (state + timers) ─ CountRecords ─ GlobalWindow ─> PackedRecord

A record leaves the packer when it is full, when the watermark passes its window's end,
or `max_wait_s` (processing time) after the first trajectory entered an empty buffer,
whichever comes first. The packer emits FlushedRecords (record, reason, latency) and
every record-level metric is updated downstream, in CountRecordsFn.process: one place for
all three flush reasons, two of which happen in @on_timer. (On BundleBasedDirectRunner
that alone does not make them visible: it reports only each step's first bundle of
metric updates, timers included; see tests/test_pack_windows.py.)
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.coders import BooleanCoder, PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import FixedWindows, GlobalWindows, TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from core.contracts.record_shape import RecordLayout, RecordShape
from core.contracts.records import PackedRecord
from core.contracts.trajectory import Trajectory
from core.telemetry import trace
from pipelines import bucketing
from pipelines.dedup import DUPLICATES, DedupBy
from pipelines.metrics import NAMESPACE
from pipelines.packing import pack, take_full_records
from pipelines.packing_config import PackingConfig, check_records_fit_messages
from rollout.telemetry import current as telemetry

NS = NAMESPACE
FULL, WINDOW_END, MAX_WAIT = "full", "window_end", "max_wait"
FLUSH_REASONS = (FULL, WINDOW_END, MAX_WAIT)
Clock = Callable[[], float]


DROPPED = "dropped"


@dataclasses.dataclass(frozen=True)
class DropNotice:
    """Trajectories deliberately not packed. Sent on to the learner, whose feeder credits
    count trajectories: without the notice, filtered trajectories would never return their
    credits and the feeder would slowly starve."""

    reason: str
    trajectory_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FlushedRecord:
    """What the packer emits: the record plus why and how late it left."""

    record: PackedRecord
    seq_len: int  # the bucket
    reason: str  # FULL | WINDOW_END | MAX_WAIT
    latency_ms: int | None  # emit time - oldest finished_at in the record; None if unknown


class FilterZeroSignalGroupsFn(beam.DoFn):
    """Drops (when enabled) groups whose advantages are all 0: every reward was equal, so
    no token of the group moves the policy. every estimator in core.rl.advantages returns exact zeros."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.zero_groups = Metrics.counter(NS, "zero_signal_groups")
        self.dropped_groups = Metrics.counter(NS, "zero_signal_groups_dropped")
        self.dropped_trajs = Metrics.counter(NS, "zero_signal_trajectories_dropped")
        self.empty = Metrics.counter(NS, "empty_groups")

    def process(self, group: list[Trajectory]):
        if not group:
            self.empty.inc()
            return
        # Every group's mean reward, in quarters, and how many had no signal: on the local
        # runner too (telemetry rows), so a recipe whose groups all score alike shows it.
        mean = min(max(sum(t.reward for t in group) / len(group), 0.0), 1.0)
        telemetry().count("groups")
        telemetry().count(f"groups_mean_reward_{25 * round(4 * mean)}pct")
        if all(t.advantage == 0.0 for t in group):
            self.zero_groups.inc()
            telemetry().count("groups_zero_signal")
            if self.enabled:
                self.dropped_groups.inc()
                self.dropped_trajs.inc(len(group))
                telemetry().count("trajectories_dropped_zero_signal", len(group))
                yield beam.pvalue.TaggedOutput(
                    DROPPED, DropNotice("zero_signal", tuple(t.trajectory_id for t in group))
                )
                return
        yield group


class FitToBucketsFn(beam.DoFn):
    """Trajectory -> (bucket index, trajectory), truncating or dropping the overlong."""

    def __init__(self, seq_lens: tuple[int, ...], overlong: str):
        self.seq_lens, self.overlong = seq_lens, overlong
        self.outcomes = {
            bucketing.TRUNCATED: Metrics.counter(NS, "overlong_truncated"),
            bucketing.DROPPED_OVERLONG: Metrics.counter(NS, "overlong_dropped"),
            bucketing.DROPPED_EMPTY: Metrics.counter(NS, "empty_dropped"),
        }

    def process(self, t: Trajectory):
        fit = bucketing.fit_to_buckets(t, self.seq_lens, self.overlong)
        if fit.outcome in self.outcomes:
            self.outcomes[fit.outcome].inc()
            telemetry().count(f"trajectories_{fit.outcome}")
        if fit.trajectory is not None:
            yield fit.bucket, fit.trajectory
        else:
            yield beam.pvalue.TaggedOutput(DROPPED, DropNotice(fit.outcome, (t.trajectory_id,)))


def timestamp_by_finish(kv, clock: Clock):
    """Event time := when the episode finished. The upstream episode step may emit from
    timers or from other requests' calls, so the timestamp a trajectory arrives with says
    little about it (a processing-time timer stamps its output with processing time).
    finished_at is the trajectory's own, stable answer; unset (0) falls back to the clock.
    Moving a timestamp back can put it behind the watermark: allowed lateness on the
    window and the packer's immediate end-of-window flush keep such elements."""
    finished = kv[1].finished_at
    return TimestampedValue(kv, finished if finished > 0 else clock())


def shard_of(trajectory_id: str, num_shards: int) -> int:
    return zlib.crc32(trajectory_id.encode()) % num_shards  # stable across workers and restarts


class PackRecordsFn(beam.DoFn):
    """Stateful first-fit-decreasing packer, one buffer per ((bucket, shard), window)."""

    BUFFER = BagStateSpec("buffer", PickleCoder())
    ARRIVALS = BagStateSpec("arrivals", PickleCoder())  # (trajectory_id, clock time it arrived)
    ARMED = ReadModifyWriteStateSpec("armed", BooleanCoder())  # the max-wait timer is set
    MAX_WAIT_TIMER = TimerSpec("max_wait", beam.TimeDomain.REAL_TIME)
    WINDOW_END_TIMER = TimerSpec("window_end", beam.TimeDomain.WATERMARK)

    def __init__(self, shapes: tuple[RecordShape, ...], max_wait_s: float, clock: Clock = time.time):
        self.shapes, self.max_wait_s, self.clock = shapes, max_wait_s, clock

    def process(
        self,
        kv,
        window=beam.DoFn.WindowParam,
        buffer=beam.DoFn.StateParam(BUFFER),
        arrivals=beam.DoFn.StateParam(ARRIVALS),
        armed=beam.DoFn.StateParam(ARMED),
        max_wait=beam.DoFn.TimerParam(MAX_WAIT_TIMER),
        window_end=beam.DoFn.TimerParam(WINDOW_END_TIMER),
    ):
        (bucket, _), t = kv
        buffer.add(t)
        arrivals.add((t.trajectory_id, self.clock()))
        items = list(buffer.read())
        ready, rest = take_full_records(items, self.shapes[bucket])
        if ready:
            buffer.clear()
            for r in rest:
                buffer.add(r)
            kept = {r.trajectory_id for r in rest}
            left = [(i, at) for i, at in arrivals.read() if i in kept]
            arrivals.clear()
            for a in left:
                arrivals.add(a)
            if left and armed.read():
                # The timer was set for trajectories that just left in full records: re-arm
                # it for the oldest one still waiting, or it would flush them half-full early.
                max_wait.set(Timestamp.of(min(at for _, at in left)) + Duration.of(self.max_wait_s))
        if not rest:
            armed.clear()  # a stale timer may still fire: it finds an empty buffer
        elif not armed.read():
            max_wait.set(Timestamp.of(self.clock()) + Duration.of(self.max_wait_s))
            # Behind the watermark already (late data)? Then this fires at once.
            window_end.set(window.max_timestamp())
            armed.write(True)
        yield from self._flushed(ready, items, bucket, FULL)

    @on_timer(MAX_WAIT_TIMER)
    def on_max_wait(
        self,
        key=beam.DoFn.KeyParam,
        buffer=beam.DoFn.StateParam(BUFFER),
        arrivals=beam.DoFn.StateParam(ARRIVALS),
        armed=beam.DoFn.StateParam(ARMED),
        window_end=beam.DoFn.TimerParam(WINDOW_END_TIMER),
    ):
        window_end.clear()
        arrivals.clear()
        yield from self._flush_all(key[0], buffer, armed, MAX_WAIT)

    @on_timer(WINDOW_END_TIMER)
    def on_window_end(
        self,
        key=beam.DoFn.KeyParam,
        buffer=beam.DoFn.StateParam(BUFFER),
        arrivals=beam.DoFn.StateParam(ARRIVALS),
        armed=beam.DoFn.StateParam(ARMED),
        max_wait=beam.DoFn.TimerParam(MAX_WAIT_TIMER),
    ):
        max_wait.clear()
        arrivals.clear()
        yield from self._flush_all(key[0], buffer, armed, WINDOW_END)

    def _flush_all(self, bucket, buffer, armed, reason):
        items = list(buffer.read())
        buffer.clear()
        armed.clear()
        yield from self._flushed(pack(items, self.shapes[bucket]) if items else [], items, bucket, reason)

    def _flushed(self, recs, items, bucket, reason):
        finished = {t.trajectory_id: t.finished_at for t in items}
        now = self.clock()
        for rec in recs:
            known = [finished[i.trajectory_id] for i in rec.trajectories if finished[i.trajectory_id] > 0]
            latency = max(0, round((now - min(known)) * 1000)) if known else None
            yield FlushedRecord(rec, self.shapes[bucket].seq_len, reason, latency)


class CountRecordsFn(beam.DoFn):
    """FlushedRecord -> PackedRecord (or the FlushedRecord itself), updating every
    record-level metric in one ordinary process() call, whichever way the record left."""

    def __init__(self, seq_lens: tuple[int, ...], rows: int, keep_flush_info: bool = False):
        self.rows, self.keep_flush_info = rows, keep_flush_info
        self.records = Metrics.counter(NS, "records")
        self.per_bucket = {s: Metrics.counter(NS, f"records_bucket_{s}") for s in seq_lens}
        self.reasons = {r: Metrics.counter(NS, f"flush_{r}") for r in FLUSH_REASONS}
        self.fill = Metrics.distribution(NS, "record_fill_permille")
        self.latency = Metrics.distribution(NS, "flush_latency_ms")

    def process(self, f: FlushedRecord):
        self.records.inc()
        self.per_bucket[f.seq_len].inc()
        self.reasons[f.reason].inc()
        self.fill.update(f.record.num_tokens * 1000 // (self.rows * f.seq_len))
        if f.latency_ms is not None:
            self.latency.update(f.latency_ms)
        fill = f.record.num_tokens / (self.rows * f.seq_len)
        telemetry().on_record(fill, f.latency_ms, f.reason, len(f.record.trajectories))
        trace.current().instant(
            "record flush",
            f"packer {f.seq_len}",
            reason=f.reason,
            fill=round(fill, 3),
            trajectories=len(f.record.trajectories),
            waited_ms=f.latency_ms,
        )
        yield f if self.keep_flush_info else f.record


class PackTrajectoryGroups(beam.PTransform):
    """PCollection[list[Trajectory]] (the G samples of one request, advantages set) ->
    PCollection[PackedRecord] in the global window, of shape [rows, b] for bucket b.

    `clock` (seconds) sets the max-wait timers and measures flush latency; tests inject
    one that matches TestStream's processing time. keep_flush_info=True outputs
    FlushedRecord instead (for tests and diagnostics). drop_notices=True returns
    {"records": ..., "dropped": PCollection[DropNotice]} (zero-signal groups, overlong and
    empty trajectories, content duplicates; duplicates by id need none: their first copy
    is packed)."""

    def __init__(
        self,
        config: PackingConfig,
        layout: RecordLayout,
        clock: Clock = time.time,
        keep_flush_info: bool = False,
        drop_notices: bool = False,
    ):
        super().__init__()
        check_records_fit_messages(layout)
        self.config, self.layout, self.clock, self.keep_flush_info = config, layout, clock, keep_flush_info
        self.drop_notices = drop_notices

    def expand(self, groups):
        cfg, layout, clock = self.config, self.layout, self.clock
        kept = (
            groups
            | "GlobalWindowForDedup" >> beam.WindowInto(GlobalWindows())
            | "FilterZeroSignalGroups"
            >> beam.ParDo(FilterZeroSignalGroupsFn(cfg.filter_zero_signal)).with_outputs(DROPPED, main="groups")
        )
        trajs = (
            kept.groups
            | "FlattenGroups" >> beam.FlatMap(lambda g: g)
            | "DedupById" >> DedupBy("dedup", lambda t: t.trajectory_id, cfg.dedup_window_s, clock=clock)
        )
        notices = [kept[DROPPED]]
        if cfg.content_dedup:
            content = trajs | "DedupByContent" >> DedupBy(
                "content_dedup", bucketing.content_hash, cfg.dedup_window_s, clock=clock, report_duplicates=True
            )
            trajs = content.kept
            # A content duplicate has its own id, whose credit the learner holds: it is told.
            notices.append(
                content[DUPLICATES] | "ContentDuplicateNotices" >> beam.Map(lambda i: DropNotice("content_dedup", (i,)))
            )
        num_shards = cfg.num_shards
        fitted = trajs | "FitToBuckets" >> beam.ParDo(FitToBucketsFn(layout.buckets, cfg.overlong)).with_outputs(
            DROPPED, main="fitted"
        )
        records = (
            fitted.fitted
            | "TimestampByFinish" >> beam.Map(timestamp_by_finish, clock)
            | "WindowIntoFixed"
            >> beam.WindowInto(FixedWindows(cfg.window_s), allowed_lateness=Duration.of(cfg.allowed_lateness_s))
            | "KeyByBucketShard"
            >> beam.Map(lambda kv: ((kv[0], shard_of(kv[1].trajectory_id, num_shards)), kv[1])).with_output_types(
                tuple[tuple[int, int], Any]
            )
            | "PackRecords" >> beam.ParDo(PackRecordsFn(layout.shapes, cfg.max_wait_s, clock))
            | "CountRecords" >> beam.ParDo(CountRecordsFn(layout.buckets, layout.rows, self.keep_flush_info))
            # Records leave in the global window: nothing downstream groups them by
            # the packing window.
            | "GlobalWindow" >> beam.WindowInto(GlobalWindows())
        )
        if not self.drop_notices:
            return records
        dropped = (*notices, fitted[DROPPED]) | "AllDropNotices" >> beam.Flatten()
        return {"records": records, DROPPED: dropped}
