"""One rollout worker per process: the sampler, the policy poller and the engine.

Held through `apache_beam.utils.shared.Shared`, so every DoFn instance and harness
thread of a process shares one KV cache, one copy of the parameters and one engine.
"""

from __future__ import annotations

import asyncio
import logging
import time

import environments
from core.contracts.store import PolicyStore
from core.policy.sources import policy_spec
from core.policy.text.chat_format import chat_format_for
from core.policy.versions import VersionLoader, base_params
from core.telemetry import trace
from rollout.engine import InferenceEngine
from rollout.engine_config import EngineConfig
from rollout.policy_poller import PolicyHandle
from rollout.telemetry import install, make_telemetry

log = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, cfg: EngineConfig, policy_root: str | None, max_tokens: int):
        """policy_root: the job's policy store; max_tokens: the record layout's trajectory
        length (an episode, prompt included, fits one record row)."""
        if not policy_root:
            raise ValueError("policy_root must name the policy store (the rollout job's --policy_root is unset)")
        environments.load_entry_points()  # environments from installed plugin packages
        self.cfg, self.limits = cfg, cfg.limits(max_tokens)
        # The process's telemetry and tracer, found by the DoFns through current().
        self.telemetry = install(make_telemetry(cfg.telemetry.logdir, cfg.telemetry.trace_dir, cfg.telemetry_every_s))
        self.tracer = trace.install(self.telemetry.tracer)
        self.groups_in_flight = self.episodes_in_flight = self.groups_queued = 0
        self._group_slots: asyncio.Semaphore | None = None  # made on the episodes' event loop
        spec = policy_spec(cfg.model.checkpoint, cfg.model.builtin)  # the learner's --model: same config and tokenizer
        self.sampler, dtype = cfg.make_sampler(spec.cfg, max_tokens)  # dtype: each version's as loaded
        store = PolicyStore(policy_root)
        loader = VersionLoader(store, spec.cfg, self.sampler.abstract_params, base_params(spec.checkpoint))
        self.policy = PolicyHandle(
            store, self.sampler.abstract_params, cfg.policy_poll_s, self.tracer, loader, dtype=dtype
        )
        self.policy.wait_for_first(cfg.policy_wait_s)
        with self.tracer.span("compile", "worker"):
            self.sampler.warmup(self.policy.params)  # compile before the first episode
        self.policy.start_polling()
        self.engine = InferenceEngine(
            self.sampler,
            lambda: self.policy.current,
            max_tokens,
            chat_format_for(spec.tokenizer),
            share_prompts=not cfg.separate_prompts,
        )
        self.telemetry.source = self.gauges
        self.telemetry.start()
        log.info(
            "rollout worker ready: %d slots, %s, %d decode steps a call, policy version %d",
            *(cfg.slots, dtype.name, self.sampler.decode_steps, self.policy.version),
        )

    def gauges(self) -> dict:
        """What the telemetry row reads of the worker now (the engine's busy time is
        cumulative; the row turns it into a fraction of its interval)."""
        return {
            "policy_version": self.policy.version,
            "policy_reloads": self.policy.reloads,
            "policy_reload_failures": self.policy.failed_loads,
            "policy_checksum_failures": self.policy.checksum_failures,
            **{f"policy_reload_{k}": round(v, 4) for k, v in self.policy.reload_totals.items()},
            "groups_in_flight": self.groups_in_flight,
            "groups_queued": self.groups_queued,
            "episodes_in_flight": self.episodes_in_flight,
            "engine_busy_s": self.engine.stats["busy_s"],
            # Cumulative: tokens per decode call, and what overshooting turn ends costs.
            "engine_decode_calls": self.engine.stats["decode_calls"],
            "engine_decode_tokens": self.engine.stats["decode_tokens"],
            "engine_surplus_tokens": self.engine.stats["surplus_tokens"],
            "compiled_variants": self.engine.sampler.compiled_variants(),
        }

    @property
    def group_slots(self) -> asyncio.Semaphore:
        """At most max_concurrent_groups requests run episodes at once; the rest wait here, on
        the event loop, and start the moment one ends (not when Beam's thread next looks)."""
        if self._group_slots is None:
            self._group_slots = asyncio.Semaphore(self.cfg.max_concurrent_groups)
        return self._group_slots

    async def wait_for_version(self, version: int) -> bool:
        """Waits (without blocking other episodes) until the background poller has loaded
        at least `version`, the request's staleness bound. False after the timeout: the
        request then runs anyway and the learner's staleness filter has the last word."""
        deadline = time.monotonic() + self.cfg.policy_wait_s
        while self.policy.version < version:
            if time.monotonic() > deadline:
                log.warning("policy version %d not reached (have %d); running anyway", version, self.policy.version)
                return False
            await asyncio.sleep(0.05)
        return True
