"""One rollout worker per process: the sampler, the policy poller and the engine.

Held through `apache_beam.utils.shared.Shared`, so every DoFn instance and harness
thread of a process shares one KV cache, one copy of the parameters and one engine.
"""
from __future__ import annotations

import asyncio
import logging
import time

import environments
from pipelines.engine import InferenceEngine
from pipelines.episodes import EpisodeLimits
from pipelines.options import EngineOptions, RolloutOptions, packing_config
from pipelines.policy import PolicyHandle
from trainer.config import model_config
from trainer.sampling import Sampler
from trainer.store import PolicyStore

log = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, options):
        opts, engine_opts = options.view_as(RolloutOptions), options.view_as(EngineOptions)
        environments.load_entry_points()  # environments from installed plugin packages
        cfg = model_config(opts.model_config)
        longest = packing_config(opts).max_seq_len  # an episode must fit the largest bucket
        self.limits = EpisodeLimits(max_new_tokens_per_turn=opts.max_new_tokens_per_turn, max_tokens=longest)
        self.sampler = Sampler(cfg, slots=engine_opts.engine_slots, length=longest)
        self.policy = PolicyHandle(PolicyStore(opts.policy_root), self.sampler.abstract_params,
                                   opts.policy_poll_s)
        self.policy.wait_for_first(opts.policy_wait_s)
        self.sampler.warmup(self.policy.params)  # compile before the first episode
        self.policy.start_polling()
        self.engine = InferenceEngine(self.sampler, lambda: self.policy.current, self.limits.max_tokens)
        self.version_wait_s = opts.policy_wait_s
        self.advantage_estimator = opts.advantage_estimator
        log.info("rollout worker ready: %d slots, policy version %d", engine_opts.engine_slots, self.policy.version)

    async def wait_for_version(self, version: int) -> bool:
        """Waits (without blocking other episodes) until the background poller has loaded
        at least `version`, the request's staleness bound. False after the timeout: the
        request then runs anyway and the learner's staleness filter has the last word."""
        deadline = time.monotonic() + self.version_wait_s
        while self.policy.version < version:
            if time.monotonic() > deadline:
                log.warning("policy version %d not reached (have %d); running anyway", version, self.policy.version)
                return False
            await asyncio.sleep(0.05)
        return True
