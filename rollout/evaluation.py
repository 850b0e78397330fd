"""Held-out evaluation of one policy version, through the rollout side's own code.

One episode per test-split task, all concurrently on a Sampler's slots, with the same
InferenceEngine and run_episode the rollout pipeline uses. Nothing here produces a
trajectory or a record: evaluation episodes never reach the learner.
"""

from __future__ import annotations

import asyncio
import collections
import time

import numpy as np

import environments
from core.policy.sampling import Sampler
from rollout.engine import InferenceEngine
from rollout.episodes import EpisodeLimits, run_episode

MODES = ("sampled", "greedy")  # temperature 1 (what RL trains on; judge by this), and argmax


def summarize(outcomes) -> dict:
    """Success, turns, tool use and episode statuses of a list of episode outcomes."""
    n = len(outcomes)
    rewards = np.array([o.reward for o in outcomes], np.float64)
    info = collections.Counter()
    for o in outcomes:
        for key in ("tool_calls", "tool_errors", "malformed_calls", "unknown_tool_calls"):
            info[key] += int(o.info.get(key, 0))
    turns = sum(o.turns for o in outcomes)
    return {
        "n": n,
        "success": float(np.mean(rewards > 0)) if n else 0.0,
        "mean_reward": float(rewards.mean()) if n else 0.0,
        "mean_turns": turns / max(n, 1),
        "tool_calls_per_episode": info["tool_calls"] / max(n, 1),
        # The tool refused the call's arguments, per call; malformed or unknown calls, per turn.
        "tool_error_rate": info["tool_errors"] / max(info["tool_calls"], 1),
        "malformed_rate": (info["malformed_calls"] + info["unknown_tool_calls"]) / max(turns, 1),
        "status": dict(collections.Counter(o.status for o in outcomes)),
    }


async def _episodes(engine, env_name: str, env_config: dict, tasks, limits: EpisodeLimits):
    envs = [environments.make(env_name, **env_config) for _ in tasks]
    return await asyncio.gather(*(run_episode(engine, env, t, limits) for env, t in zip(envs, tasks)))


def evaluate(
    params,
    sampler: Sampler,
    env_name: str,
    tasks,
    limits: EpisodeLimits,
    env_config: dict | None = None,
    chat_format=None,
) -> dict:
    """The summary of one episode per task under `params` (sampler.greedy picks the mode),
    in the model's chat format (default: the byte format)."""
    engine = InferenceEngine(sampler, lambda: (params, 0), limits.max_tokens, chat_format)
    t0 = time.monotonic()
    outcomes = asyncio.run(_episodes(engine, env_name, dict(env_config or {}), tasks, limits))
    return {**summarize(outcomes), "eval_s": round(time.monotonic() - t0, 2)}
