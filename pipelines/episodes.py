"""Running one group of G episodes of the same task on a shared, fixed-shape sampler.

The G slots decode in lockstep, one token per slot per sampler call; a slot whose turn
ended waits while the others finish theirs, then every waiting slot steps its
environment concurrently (tool latencies overlap). Observations are teacher-forced
into the KV cache with loss mask 0. Continuous batching across groups comes later.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np

from environments import EpisodeStatus, Environment, Task
from environments.tool_calls import TURN_STOP_STRINGS
from pipelines.trajectory import Trajectory
from trainer import tokenizer
from trainer.losses import group_relative_advantages
from trainer.sampling import Sampler


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    max_new_tokens_per_turn: int = 32
    max_tokens: int = 256  # whole trajectory, prompt included: must fit one record row
    step_timeout_s: float = 30.0
    episode_timeout_s: float = 120.0

    def __post_init__(self):
        if min(self.max_new_tokens_per_turn, self.max_tokens) < 1:
            raise ValueError(f"episode token limits must be >= 1: {self}")
        if self.step_timeout_s <= 0 or self.episode_timeout_s <= 0:
            raise ValueError(f"episode timeouts must be positive: {self}")


@dataclasses.dataclass
class _Slot:
    env: Environment
    tokens: list
    mask: list
    logps: list
    versions: list
    fed: int = 0  # tokens already written into the KV cache
    turn_start: int = 0
    generating: bool = True
    done: bool = False
    reward: float = 0.0
    status: str = EpisodeStatus.FINISHED.value
    env_latency_s: float = 0.0
    turns: int = 0

    def extend(self, ids, generated: bool, logp: float = 0.0, version: int = -1):
        self.tokens.extend(ids)
        self.mask.extend([int(generated)] * len(ids))
        self.logps.extend([logp] * len(ids))
        self.versions.extend([version] * len(ids))

    def end_of_turn(self, limits: EpisodeLimits) -> bool:
        new = self.tokens[self.turn_start:]
        if new and new[-1] == tokenizer.EOS:
            return True
        text = tokenizer.decode(new[-16:])
        return any(text.endswith(s) for s in TURN_STOP_STRINGS) or len(new) >= limits.max_new_tokens_per_turn


async def run_group(sampler: Sampler, params, version: int, envs: list[Environment], task: Task,
                    request_id: str, limits: EpisodeLimits) -> list[Trajectory]:
    if len(envs) > sampler.slots:
        raise ValueError(f"group of {len(envs)} exceeds the sampler's {sampler.slots} slots")
    first = await asyncio.gather(*(env.reset(task) for env in envs))
    slots = [_Slot(env, [], [], [], []) for env in envs]
    for s, obs in zip(slots, first):
        s.extend([tokenizer.BOS] + tokenizer.encode(obs)[: limits.max_tokens - 2], generated=False)
        s.turn_start = len(s.tokens)
    deadline = time.monotonic() + limits.episode_timeout_s
    while not all(s.done for s in slots):
        while any(s.generating for s in slots):
            _decode_once(sampler, params, version, slots, limits)
        waiting = [s for s in slots if not s.done]
        await asyncio.gather(*(_env_step(s, limits, deadline) for s in waiting))
    rewards = [s.reward for s in slots]
    advantages = group_relative_advantages(rewards)
    return [
        Trajectory(
            trajectory_id=f"{request_id}/{i}", request_id=request_id, task_id=task.task_id,
            tokens=np.asarray(s.tokens, np.int32), loss_mask=np.asarray(s.mask, np.uint8),
            behaviour_logprobs=np.asarray(s.logps, np.float32),
            policy_versions=np.asarray(s.versions, np.int32), reward=s.reward, status=s.status,
            advantage=float(advantages[i]), env_latency_s=s.env_latency_s, num_turns=s.turns)
        for i, s in enumerate(slots)
    ]


def _decode_once(sampler: Sampler, params, version: int, slots: list[_Slot], limits: EpisodeLimits):
    n = sampler.slots
    feed = np.zeros(n, np.int32)
    index = np.zeros(n, np.int32)
    for b, s in enumerate(slots):
        index[b] = s.fed  # idle slots write junk at s.fed; the next real token overwrites it
        if s.generating:
            feed[b] = s.tokens[s.fed]
    nxt, logp = sampler.step(params, feed, index)
    for b, s in enumerate(slots):
        if not s.generating:
            continue
        s.fed += 1
        if s.fed < len(s.tokens):
            continue  # still teacher-forcing the prompt or an observation
        s.extend([int(nxt[b])], generated=True, logp=float(logp[b]), version=version)
        if len(s.tokens) >= limits.max_tokens:
            s.generating, s.done, s.status = False, True, EpisodeStatus.TRUNCATED.value
        elif s.end_of_turn(limits):
            s.generating = False


async def _env_step(s: _Slot, limits: EpisodeLimits, deadline: float):
    action = tokenizer.decode(s.tokens[s.turn_start:])
    timeout = min(limits.step_timeout_s, deadline - time.monotonic())
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(s.env.step(action), timeout=max(timeout, 0.0))
    except TimeoutError:
        s.done, s.status = True, EpisodeStatus.TIMEOUT.value
        return
    except Exception:  # noqa: BLE001 - an environment bug ends this episode, not the worker
        s.done, s.status = True, EpisodeStatus.ENV_ERROR.value
        return
    finally:
        s.env_latency_s += time.monotonic() - started
        s.turns += 1
    s.reward += float(result.reward)
    if result.done:
        s.done = True
        s.status = str(getattr(result.info.get("status"), "value", result.info.get("status") or EpisodeStatus.FINISHED.value))
        return
    room = limits.max_tokens - len(s.tokens) - 1  # keep room for at least one generated token
    obs = tokenizer.encode(result.observation)
    if len(obs) > room:
        s.extend(obs[:max(room, 0)], generated=False)
        s.done, s.status = True, EpisodeStatus.TRUNCATED.value
        return
    s.extend(obs, generated=False)
    s.turn_start = len(s.tokens)
    s.generating = True
