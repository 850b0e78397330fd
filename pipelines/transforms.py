"""The pipeline's DoFns and composite transforms, one role each."""

from __future__ import annotations

import json
import logging
import zlib
from typing import Any

import apache_beam as beam
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.metrics import Metrics
from apache_beam.transforms.async_dofn import AsyncWrapper
from apache_beam.utils.shared import Shared

import environments
from core.contracts import records
from core.contracts.rollout_request import HEARTBEAT_ATTRIBUTE, RequestError, RolloutRequest
from pipelines.metrics import NAMESPACE
from rollout.engine_config import EngineConfig
from rollout.episodes import run_group
from rollout.telemetry import current as telemetry
from rollout.worker import RolloutWorker

log = logging.getLogger(__name__)
DEAD_LETTER = "dead_letter"
NS = NAMESPACE


def _dead_letter(data: bytes, error: str) -> PubsubMessage:
    return PubsubMessage(data=data, attributes={"error": error[:1000]})


class ParseRequestFn(beam.DoFn):
    """PubsubMessage -> RolloutRequest; heartbeats are dropped, bad requests dead-lettered."""

    def __init__(self):
        self.heartbeats = Metrics.counter(NS, "heartbeats")
        self.bad = Metrics.counter(NS, "bad_requests")

    def process(self, msg: PubsubMessage):
        if HEARTBEAT_ATTRIBUTE in (msg.attributes or {}):
            self.heartbeats.inc()
            return
        try:
            yield RolloutRequest.from_bytes(msg.data)
        except RequestError as e:
            self.bad.inc()
            telemetry().count("bad_requests")
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, _dead_letter(msg.data, str(e)))


class EpisodeGroupFn(beam.DoFn):
    """(shard, RolloutRequest) -> [the request's group of G trajectories], asynchronously.

    `process` is a coroutine: Beam's AsyncWrapper runs many of them at once on one event
    loop, all sharing the process's inference engine, so one request waiting on tools
    never holds up the others. A request that cannot run is dead-lettered."""

    def __init__(self, cfg: EngineConfig, policy_root: str | None, max_tokens: int):
        self.cfg, self.policy_root, self.max_tokens = cfg, policy_root, max_tokens
        self._shared = Shared()

    def setup(self):
        self.worker = self._shared.acquire(lambda: RolloutWorker(self.cfg, self.policy_root, self.max_tokens))

    async def process(self, kv):
        req, w = kv[1], self.worker
        w.groups_queued += 1  # one event loop runs every process(): no lock needed
        waiting = True
        try:
            async with w.group_slots:
                w.groups_queued, waiting = w.groups_queued - 1, False
                return await self._run(req, w)
        finally:
            if waiting:  # cancelled while queued
                w.groups_queued -= 1

    async def _run(self, req, w):
        w.groups_in_flight += 1
        w.episodes_in_flight += req.group_size
        try:
            if req.group_size > w.sampler.slots:
                raise RequestError(f"group_size {req.group_size} > engine slots {w.sampler.slots}")
            task = environments.Task.from_json_dict(req.task)
            envs = [environments.make(req.env, **req.env_config) for _ in range(req.group_size)]
            with w.tracer.span("wait for policy", "requests", version=req.min_policy_version):
                await w.wait_for_version(req.min_policy_version)
            group = await run_group(
                w.engine, envs, task, req.request_id, w.limits, w.cfg.advantage_estimator, w.tracer, w.telemetry.lanes
            )
            w.telemetry.on_group(group)
            return [group]
        except Exception as e:
            log.warning("request %s dead-lettered: %s: %s", req.request_id, type(e).__name__, e)
            w.telemetry.count("dead_letters")
            return [beam.pvalue.TaggedOutput(DEAD_LETTER, _dead_letter(req.to_bytes(), f"{type(e).__name__}: {e}"))]
        finally:
            w.groups_in_flight -= 1
            w.episodes_in_flight -= req.group_size


class CountEpisodesFn(beam.DoFn):
    """Episode metrics, counted here because AsyncWrapper emits from a timer callback and
    BundleBasedDirectRunner does not report metrics updated there."""

    def __init__(self):
        self.episodes = {s.value: Metrics.counter(NS, f"episodes_{s.value}") for s in environments.EpisodeStatus}
        self.generated = Metrics.counter(NS, "generated_tokens")
        self.env_latency = Metrics.distribution(NS, "env_latency_ms")

    def process(self, group):
        for t in group:
            self.episodes[t.status].inc()
            self.generated.inc(int(t.loss_mask.sum()))
            self.env_latency.update(int(t.env_latency_s * 1000))
        yield group


class RunEpisodes(beam.PTransform):
    """Rollout requests -> trajectory groups (main output) and dead letters. policy_root:
    the job's policy store; max_tokens: the record layout's trajectory length (an episode
    fits one record row)."""

    def __init__(self, cfg: EngineConfig, policy_root: str | None, max_tokens: int):
        super().__init__()
        self.cfg, self.policy_root, self.max_tokens = cfg, policy_root, max_tokens

    def expand(self, requests):
        eng = self.cfg
        shards = eng.request_shards
        # The wrapper holds running *and* queued requests: with room to spare, Beam's thread
        # rarely blocks on a full buffer (it sleeps in up-to-max_wait_time naps there, and
        # fires no timers, so no finished group is committed meanwhile). The semaphore in
        # EpisodeGroupFn bounds what runs.
        run = AsyncWrapper(
            EpisodeGroupFn(eng, self.policy_root, self.max_tokens),
            max_items_to_buffer=eng.max_concurrent_groups + eng.queued_groups,
            max_wait_time=eng.admit_poll_s,
            callback_frequency=eng.commit_interval_s,
            id_fn=lambda r: r.request_id,
            use_asyncio=True,
        )
        out = (
            requests
            | "KeyByShard"
            >> beam.Map(lambda r: (zlib.crc32(r.request_id.encode()) % shards, r)).with_output_types(tuple[int, Any])
            | "RunGroupsAsync" >> beam.ParDo(run).with_outputs(DEAD_LETTER, main="groups")
        )
        return {"groups": out.groups | "CountEpisodes" >> beam.ParDo(CountEpisodesFn()), DEAD_LETTER: out[DEAD_LETTER]}


def to_pubsub_message(rec: records.PackedRecord) -> PubsubMessage:
    return PubsubMessage(data=records.encode(rec), attributes=records.attributes(rec))


def drop_notice_message(notice) -> PubsubMessage:
    """An attributes-first message the consumer recognises by `kind`; the ids are JSON."""
    return PubsubMessage(
        data=json.dumps({"trajectory_ids": list(notice.trajectory_ids)}).encode(),
        attributes={
            records.KIND_ATTRIBUTE: records.KIND_DROPPED,
            "reason": notice.reason,
            "trajectories": str(len(notice.trajectory_ids)),
        },
    )
