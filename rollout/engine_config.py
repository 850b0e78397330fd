"""EngineConfig: every setting of a rollout worker's engine and episodes, checked once.

A section of the rollout job's config tree (pipelines/config.py): built from its flags on
the launcher, so a bad setting is refused before the job starts, and handed to each worker
as a plain frozen dataclass.
"""

from __future__ import annotations

from core.config import configclass, knob, section
from core.policy.sampling.sampler import ACCELERATOR_DECODE_STEPS, DTYPES
from core.rl.advantages import ADVANTAGE_ESTIMATORS
from core.sections import ModelChoice, TelemetryDirs, TurnBudget
from rollout.episodes import EpisodeLimits


@configclass
class EngineConfig:
    """Each field is a flag of the rollout job (`--engine_slots` for `slots`). The policy
    store and the trajectory cap are the job's (its I/O and record layout sections),
    handed to the worker beside this section (RolloutWorker)."""

    model: ModelChoice = section(ModelChoice, help="the policy model (the learner's)")
    slots: int = knob(64, "KV-cache slots of the per-process inference engine", flag="engine_slots", ge=1)
    prefill: int = knob(
        16,
        "tokens each slot is fed per catch-up step (prompts, observations); a chat template's long "
        "prompts go faster with more (two widths compile: 1 and this)",
        flag="engine_prefill",
        ge=1,
    )
    prefill_slots: int = knob(
        8,
        "slots fed a catch-up chunk per engine step; the others with input wait a step (a chunk for "
        "every slot would cost every slot the chunk's width whenever one episode has input)",
        flag="engine_prefill_slots",
        ge=1,
    )
    decode_steps: int = knob(
        0,
        "decode steps one engine call runs on the device per slot, fed back without the host; it "
        "returns early once a turn ends, and bounds how long a new episode waits to be admitted "
        "(0: auto, 1 on a CPU, where the device loop is slower than one step a call, "
        f"{ACCELERATOR_DECODE_STEPS} on an accelerator, where a host round trip per token costs most of a step)",
        flag="engine_decode_steps",
        ge=0,
    )
    dtype: str = knob(
        "auto",
        "the served params' and KV cache's dtype (auto: bfloat16 on an accelerator, float32 on a CPU, "
        "whose bfloat16 matmuls are slower)",
        flag="engine_dtype",
        choices=DTYPES,
    )
    seed: int = knob(
        0,
        "the sampler's random seed: repeats of a run differ in their draws (benchmarks/staleness.py)",
        flag="engine_seed",
        ge=0,
    )
    # Default False because Beam drops False flags from a worker's options.
    separate_prompts: bool = knob(
        False,
        "every episode prefills its own prompt (default: a group's episodes prefill their shared "
        "prompt once, the first feeds it and the others copy its cache rows)",
        flag="engine_separate_prompts",
    )
    max_concurrent_groups: int = knob(16, "requests (groups of G episodes) in flight per worker process", ge=1)
    queued_groups: int = knob(
        16,
        "requests a worker holds ready beyond max_concurrent_groups, so one starts the moment another "
        "ends (0: Beam's thread admits each one when it next finds room)",
        ge=0,
    )
    admit_poll_s: float = knob(
        0.02, "the longest nap of Beam's thread while the worker's request buffer is full (Beam's default: 0.5)", gt=0
    )
    commit_interval_s: float = knob(0.2, "how often finished groups are committed downstream", gt=0)
    request_shards: int = knob(4, "keys that requests are spread over (state and timers are per key)", ge=1)
    turn: TurnBudget = section(TurnBudget, help="tokens one model turn may generate")
    step_timeout_s: float = knob(
        30.0, "an environment step (tool call) longer than this ends its episode as timeout", gt=0
    )
    episode_timeout_s: float = knob(120.0, "a whole episode longer than this ends as timeout", gt=0)
    policy_poll_s: float = knob(1.0, "how often a worker looks for a new policy version", gt=0)
    policy_wait_s: float = knob(
        300.0,
        "how long a worker waits for the first policy version, and for a request's minimum version "
        "(after that the request runs anyway and the learner's staleness filter decides)",
        gt=0,
    )
    advantage_estimator: str = knob(
        "grpo", "group-relative advantages, computed once a group is complete", choices=sorted(ADVANTAGE_ESTIMATORS)
    )
    telemetry: TelemetryDirs = section(TelemetryDirs, help="each worker's rollout/... scalars and spans")
    telemetry_every_s: float = knob(2.0, "telemetry row interval", gt=0)

    def check_fits(self, max_tokens: int) -> None:
        """Refuses a turn that leaves no room for the prompt in a `max_tokens` trajectory."""
        if self.turn.max_new_tokens_per_turn >= max_tokens:
            raise ValueError(
                f"max_new_tokens_per_turn ({self.turn.max_new_tokens_per_turn}) must be below max_tokens "
                f"({max_tokens}): a turn must leave room for the prompt"
            )

    def make_sampler(self, model_cfg, max_tokens: int):
        """The worker's sampler for `model_cfg` over trajectories of `max_tokens`, in this
        config's serving dtype; (sampler, that dtype)."""
        from core.policy.sampling.sampler import Sampler, serving_dtype

        dtype = serving_dtype(self.dtype)  # the KV cache's, and each version's as served
        sampler = Sampler(
            model_cfg,
            self.slots,
            max_tokens,
            prefill=self.prefill,
            prefill_slots=self.prefill_slots,
            seed=self.seed,
            dtype=dtype,
            decode_steps=self.decode_steps,
        )
        return sampler, dtype

    def limits(self, max_tokens: int) -> EpisodeLimits:
        """An episode's limits in a trajectory of at most `max_tokens` (the layout's)."""
        return EpisodeLimits(
            max_new_tokens_per_turn=self.turn.max_new_tokens_per_turn,
            max_tokens=max_tokens,
            step_timeout_s=self.step_timeout_s,
            episode_timeout_s=self.episode_timeout_s,
        )
