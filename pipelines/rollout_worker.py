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
from pipelines.engine_config import EngineConfig
from pipelines.policy import PolicyHandle
from trainer.contracts.store import PolicyStore
from trainer.policy.config import model_config
from trainer.policy.sampling import Sampler

log = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, cfg: EngineConfig):
        environments.load_entry_points()  # environments from installed plugin packages
        self.cfg, self.limits = cfg, cfg.limits
        self.sampler = Sampler(model_config(cfg.model_config), slots=cfg.slots, length=cfg.max_tokens)
        self.policy = PolicyHandle(PolicyStore(cfg.policy_root), self.sampler.abstract_params, cfg.policy_poll_s)
        self.policy.wait_for_first(cfg.policy_wait_s)
        self.sampler.warmup(self.policy.params)  # compile before the first episode
        self.policy.start_polling()
        self.engine = InferenceEngine(self.sampler, lambda: self.policy.current, cfg.max_tokens)
        log.info("rollout worker ready: %d slots, policy version %d", cfg.slots, self.policy.version)

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
