"""EngineConfig: every setting of a rollout worker's engine and episodes, checked once.

Built from the pipeline options on the launcher (`engine_config`), so a bad setting is
refused before the job starts, and handed to each worker as a plain frozen dataclass.
"""

from __future__ import annotations

import dataclasses
import math

from core.contracts.record_shape import DEFAULT_MAX_TRAJECTORY_LEN
from core.policy.config import MODEL_CONFIGS
from core.rl.advantages import ADVANTAGE_ESTIMATORS
from rollout.episodes import EpisodeLimits


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    policy_root: str
    model_config: str = "tiny"
    slots: int = 64  # KV-cache slots of the per-process inference engine
    max_concurrent_groups: int = 16  # requests (groups of G episodes) in flight per process
    commit_interval_s: float = 0.2  # how often finished groups are committed downstream
    request_shards: int = 4  # keys requests are spread over (state and timers are per key)
    max_new_tokens_per_turn: int = 32
    max_tokens: int = DEFAULT_MAX_TRAJECTORY_LEN  # a whole trajectory, prompt included: fits one record row
    # An environment step (a tool call) past this ends its episode as `timeout`; so does a
    # whole episode past episode_timeout_s.
    step_timeout_s: float = 30.0
    episode_timeout_s: float = 120.0
    policy_poll_s: float = 1.0
    # How long a worker waits for the first policy version, and for a request's minimum one.
    policy_wait_s: float = 300.0
    advantage_estimator: str = "grpo"
    logdir: str | None = None  # rollout/... scalars (rollout/telemetry.py); None: not written
    trace_dir: str | None = None  # timeline spans; None: tracing off
    telemetry_every_s: float = 2.0

    def __post_init__(self):
        if not isinstance(self.policy_root, str) or not self.policy_root:
            raise ValueError("policy_root must name the policy store")
        if self.model_config not in MODEL_CONFIGS:
            raise ValueError(f"model_config must be one of {sorted(MODEL_CONFIGS)}, got {self.model_config!r}")
        for name in ("slots", "max_concurrent_groups", "request_shards", "max_new_tokens_per_turn", "max_tokens"):
            v = getattr(self, name)
            if type(v) is not int or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in (
            "commit_interval_s",
            "policy_poll_s",
            "policy_wait_s",
            "telemetry_every_s",
            "step_timeout_s",
            "episode_timeout_s",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive finite number of seconds, got {v!r}")
        if self.max_new_tokens_per_turn >= self.max_tokens:
            raise ValueError(
                f"max_new_tokens_per_turn ({self.max_new_tokens_per_turn}) must be below max_tokens "
                f"({self.max_tokens}): a turn must leave room for the prompt"
            )
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {sorted(ADVANTAGE_ESTIMATORS)}, got {self.advantage_estimator!r}"
            )

    @property
    def limits(self) -> EpisodeLimits:
        return EpisodeLimits(
            max_new_tokens_per_turn=self.max_new_tokens_per_turn,
            max_tokens=self.max_tokens,
            step_timeout_s=self.step_timeout_s,
            episode_timeout_s=self.episode_timeout_s,
        )
