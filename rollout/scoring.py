"""Held-out evaluation of one policy version, through the rollout side's own code.

One episode per test-split task, all concurrently on a Sampler's slots, with the same
InferenceEngine and run_episode the rollout pipeline uses. Nothing here produces a
trajectory or a record: evaluation episodes never reach the learner.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import Callable

import numpy as np

import environments
from core.policy.sampling.sampler import Sampler
from core.rl.pass_at_k import pass_at_ks, standard_error
from rollout.engine import InferenceEngine
from rollout.episodes import EpisodeLimits, run_episode

MODES = ("sampled", "greedy")  # temperature 1 (what RL trains on; judge by this), and argmax
# Why an episode failed, first match wins (docs/RESULTS.md reports these per recipe).
FAILURES = ("timeout", "env_error", "sandbox_error", "truncated", "bad_call", "no_call", "wrong_answer")


def failure_class(outcome, succeeded: bool) -> str:
    """ "success", or the first of FAILURES that describes the episode: ran out of time, the
    environment raised, the sandbox did not run the submission, out of turns or tokens, a
    malformed or unknown tool call, an answer without any tool call, or a wrong answer."""
    if succeeded:
        return "success"
    info = outcome.info
    if outcome.status in ("timeout", "env_error"):
        return outcome.status
    if info.get("sandbox_status", "ok") != "ok":
        return "sandbox_error"
    if outcome.status == "truncated":
        return "truncated"
    if info.get("malformed_calls", 0) or info.get("unknown_tool_calls", 0):
        return "bad_call"
    return "no_call" if not info.get("tool_calls", 0) else "wrong_answer"


def summarize(outcomes, success=None) -> dict:
    """Success (the environment's criterion, `success(reward, info)`; default reward > 0),
    turns, tool use, episode statuses and failure classes of a list of episode outcomes."""
    n = len(outcomes)
    rewards = np.array([o.reward for o in outcomes], np.float64)
    success = success or (lambda reward, info: reward > 0)
    wins = [bool(success(o.reward, o.info)) for o in outcomes]
    info = collections.Counter()
    for o in outcomes:
        for key in ("tool_calls", "tool_errors", "malformed_calls", "unknown_tool_calls"):
            info[key] += int(o.info.get(key, 0))
    turns = sum(o.turns for o in outcomes)
    return {
        "n": n,
        "success": float(np.mean(wins)) if n else 0.0,
        "mean_reward": float(rewards.mean()) if n else 0.0,
        "mean_turns": turns / max(n, 1),
        "tool_calls_per_episode": info["tool_calls"] / max(n, 1),
        # The tool refused the call's arguments, per call; malformed or unknown calls, per turn.
        "tool_error_rate": info["tool_errors"] / max(info["tool_calls"], 1),
        "malformed_rate": (info["malformed_calls"] + info["unknown_tool_calls"]) / max(turns, 1),
        "status": dict(collections.Counter(o.status for o in outcomes)),
        "outcomes": dict(collections.Counter(failure_class(o, w) for o, w in zip(outcomes, wins))),
        # Seconds of sandbox runs (code's tool and grader) per episode: the environment's cost.
        "sandbox_s": sum(o.info.get("sandbox_s", 0.0) for o in outcomes) / max(n, 1),
    }


class Superseded(Exception):
    """An evaluation given up part-way: the version it scores is no longer wanted."""


async def _episodes(engine, envs, tasks, limits: EpisodeLimits, superseded=None, poll_s: float = 1.0):
    episodes = asyncio.gather(*(run_episode(engine, env, t, limits) for env, t in zip(envs, tasks)))
    while superseded is not None and not episodes.done():
        if superseded():
            episodes.cancel()
            await asyncio.gather(episodes, return_exceptions=True)  # the episodes' own clean-up runs
            raise Superseded
        await asyncio.wait({episodes}, timeout=poll_s)
    return await episodes


def evaluate(
    params,
    sampler: Sampler,
    env_name: str,
    tasks,
    limits: EpisodeLimits,
    env_config: dict | None = None,
    chat_format=None,
    examples: int = 0,
    superseded: Callable[[], bool] | None = None,
    samples: int = 1,
) -> dict:
    """The summary of `samples` episodes per task under `params` (sampler.temperature picks
    the mode: 0 is greedy), in the model's chat format (default: the byte format): success
    is the mean over every episode (pass@1), with its standard error over tasks; with
    samples > 1 also pass@k for k = 1, 2, 4 .. samples ("pass_at", "pass_at_se", keyed by
    k as a string). With `examples`, "examples" holds up to that many transcripts of each
    failure class. Raises Superseded, its episodes cancelled, once `superseded()` is true
    (asked at the start, then every second)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    # A task's samples side by side: they start from one prompt, which the engine prefills
    # once and copies (share_prompts), as it does for a GRPO group.
    tasks = [t for t in tasks for _ in range(samples)]
    # The engine holds its loop task, whose coroutine holds the engine: a reference cycle
    # that lives until the next full gc pass. Through a holder emptied here, it no longer
    # pins the params: at SmolLM2's size it kept a whole version's 0.5 GB beside the next
    # one in the evaluator.
    holder = [params]
    engine = InferenceEngine(sampler, lambda: (holder[0], 0), limits.max_tokens, chat_format)
    t0 = time.monotonic()
    envs = [environments.make(env_name, **dict(env_config or {})) for _ in tasks]
    try:
        outcomes = asyncio.run(_episodes(engine, envs, tasks, limits, superseded))
    except Superseded:
        outcomes = None
    finally:
        holder.clear()
    if outcomes is None:
        # The cancelled episodes, their engine and the exception's frames form cycles that
        # held this version's params until a full gc pass: with the next version loaded,
        # two copies (0.5 GB more at SmolLM2's size, run 17). Freed here, and the exception
        # raised afresh, from a frame that no longer holds them.
        del params, engine, envs
        gc.collect()
        raise Superseded
    success = envs[0].success if envs else None  # the environment's own criterion, not a shaped reward
    row = {**summarize(outcomes, success), "eval_s": round(time.monotonic() - t0, 2), "samples": samples}
    row.update(pass_at_row(outcomes, success, samples))
    if examples:
        row["examples"] = failure_examples(outcomes, tasks, success, engine.chat_format.tokenizer, examples)
    return row


def pass_at_row(outcomes, success, samples: int) -> dict:
    """The row's figures per task: "tasks", success's standard error over tasks, and with
    samples > 1 pass@k and its standard error (core/rl/pass_at_k.py). `outcomes` hold each
    task's samples side by side."""
    success = success or (lambda reward, info: reward > 0)
    wins = np.array([bool(success(o.reward, o.info)) for o in outcomes], np.float64).reshape(-1, samples)
    out = {"tasks": len(wins), "success_se": standard_error(wins.mean(axis=1))}
    if samples > 1:
        means, errors = pass_at_ks([int(c) for c in wins.sum(axis=1)], samples)
        out["pass_at"] = {str(k): round(v, 4) for k, v in means.items()}
        out["pass_at_se"] = {str(k): round(v, 4) for k, v in errors.items()}
    return out


def failure_examples(outcomes, tasks, success, tokenizer, k: int) -> dict[str, list[dict]]:
    """Up to `k` episodes of each failure class: the task (its prompt and target) and the
    transcript after the prompt, the model's turns and the tool's replies, special tokens
    kept. Counts say how often a call is malformed; these say what it looks like."""
    success = success or (lambda reward, info: reward > 0)
    out: dict[str, list[dict]] = {}
    for o, task in zip(outcomes, tasks):
        kind = failure_class(o, bool(success(o.reward, o.info)))
        if kind == "success" or len(out.get(kind, ())) >= k:
            continue
        first = next((i for i, m in enumerate(o.seq.loss_mask) if m), len(o.seq.tokens))
        text = tokenizer.decode(o.seq.tokens[first:], skip_special_tokens=False)
        out.setdefault(kind, []).append({"prompt": task.prompt, "target": task.target, "text": text})
    return out
