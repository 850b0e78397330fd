"""Episodes as coroutines on the shared inference engine, and groups of them.

An episode alternates model turns (`engine.generate`) and environment steps; the G
episodes of a group run concurrently, and so do groups: while one waits on a tool the
engine decodes for the others. Group-relative advantages are computed once every
episode of the group has ended.

Token in, token out: the engine's chat format (core/policy/text/chat_format.py: the byte
format, or the checkpoint's chat template and tool-call syntax) turns the prompt and each
observation into tokens that are appended; the model's sampled tokens are kept as they
were sampled and only parsed, never re-tokenised, so the learner trains on exactly them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np

from core.config import configclass, derived
from core.contracts.record_shape import DEFAULT_MAX_TRAJECTORY_LEN
from core.contracts.trajectory import Trajectory, token_digest
from core.rl.advantages import ADVANTAGE_ESTIMATORS
from core.telemetry import trace
from environments import Environment, EpisodeStatus, StepResult, Task
from rollout.engine import InferenceEngine, Sequence


@configclass
class EpisodeLimits:
    max_new_tokens_per_turn: int = derived(32, "tokens one turn may generate", ge=1)
    # The whole trajectory, prompt included: it must fit one record row.
    max_tokens: int = derived(DEFAULT_MAX_TRAJECTORY_LEN, "tokens of the whole trajectory", ge=1)
    step_timeout_s: float = derived(30.0, "one environment step", gt=0)
    episode_timeout_s: float = derived(120.0, "the whole episode", gt=0)


@dataclasses.dataclass
class _Outcome:
    seq: Sequence
    reward: float = 0.0
    status: str = EpisodeStatus.FINISHED.value
    env_latency_s: float = 0.0
    turns: int = 0
    info: dict = dataclasses.field(default_factory=dict)  # the environment's last step info


async def run_episode(
    engine: InferenceEngine,
    env: Environment,
    task: Task,
    limits: EpisodeLimits,
    tracer=trace.NULL,
    lanes: trace.Lanes | None = None,
) -> _Outcome:
    """One episode; with a tracer, its span, model turns and tool calls go on one lane."""
    lane = lanes.take() if lanes and tracer.enabled else "episodes"
    with tracer.span("episode", lane, task=task.task_id) as span:
        try:
            out = await _run_episode(engine, env, task, limits, tracer, lane)
        finally:
            if lanes and tracer.enabled:
                lanes.give_back(lane)
        span.args.update(status=out.status, reward=out.reward, turns=out.turns, tokens=len(out.seq.tokens))
        return out


async def _reset(env, task, limits: EpisodeLimits) -> str:
    """The first observation. A reset that raises, hangs past the step timeout or returns no
    text fails the whole request (no episode began): its group is dead-lettered with the error."""
    try:
        text = await asyncio.wait_for(env.reset(task), timeout=limits.step_timeout_s)
    except TimeoutError:
        raise TimeoutError(f"env.reset took over the step timeout ({limits.step_timeout_s} s)") from None
    if not isinstance(text, str):
        raise TypeError(f"env.reset must return str, got {type(text).__name__}")
    return text


def _checked(result) -> StepResult:
    """What the episode loop may rely on; anything else from a (plugin) environment is its
    error, ended as env_error, never a crash further down (packing, counters)."""
    if not isinstance(result, StepResult):
        raise TypeError(f"env.step must return StepResult, got {type(result).__name__}")
    if not isinstance(result.observation, str) or not isinstance(result.info, dict):
        raise TypeError("StepResult.observation must be str and info a dict")
    if isinstance(result.reward, bool) or not isinstance(result.reward, (int, float, np.number)):
        raise TypeError(f"StepResult.reward must be a number, got {type(result.reward).__name__}")
    if not np.isfinite(result.reward):
        raise ValueError(f"StepResult.reward must be finite, got {result.reward}")
    if result.done:
        status = result.info.get("status") or EpisodeStatus.FINISHED
        if getattr(status, "value", status) not in _STATUSES:
            raise ValueError(f"info['status'] must be one of {sorted(_STATUSES)}, got {status!r}")
    return result


_STATUSES = {s.value for s in EpisodeStatus}


async def _run_episode(engine, env, task, limits, tracer, lane) -> _Outcome:
    deadline = time.monotonic() + limits.episode_timeout_s
    fmt, tools = engine.chat_format, env.tools()
    prompt = fmt.prompt_ids(await _reset(env, task, limits), tools)
    out = _Outcome(Sequence.start(prompt[: limits.max_tokens - 1]))  # room for one generated token
    seq = out.seq
    try:
        while True:
            turn_start = len(seq.tokens)
            with tracer.span("model turn", lane):
                await engine.generate(seq, limits.max_new_tokens_per_turn, fmt.is_turn_end)
            if len(seq.tokens) >= limits.max_tokens:
                out.status = EpisodeStatus.TRUNCATED.value
                return out
            action = fmt.env_action(seq.tokens[turn_start:], tools)
            if not tools and not isinstance(action, str):  # a text-only environment gets the turn's text
                action = fmt.tokenizer.decode(seq.tokens[turn_start:])
            with tracer.span("tool call", lane):
                result = await _env_step(env, action, out, limits, deadline)
            if result is None:
                return out  # timeout or environment error: status set
            out.reward += float(result.reward)
            out.info = result.info
            if result.done:
                status = result.info.get("status") or EpisodeStatus.FINISHED
                out.status = getattr(status, "value", str(status))
                return out
            obs = fmt.observation_ids(result.observation)
            room = limits.max_tokens - len(seq.tokens) - 1  # keep room for one generated token
            seq.extend_env(obs[: max(room, 0)])
            if len(obs) > room:
                out.status = EpisodeStatus.TRUNCATED.value
                return out
    finally:
        engine.release(seq)


async def _env_step(env, action, out: _Outcome, limits: EpisodeLimits, deadline: float):
    timeout = max(min(limits.step_timeout_s, deadline - time.monotonic()), 0.0)
    started = time.monotonic()
    try:
        return _checked(await asyncio.wait_for(env.step(action), timeout=timeout))
    except TimeoutError:
        out.status = EpisodeStatus.TIMEOUT.value
    except Exception:
        out.status = EpisodeStatus.ENV_ERROR.value
    finally:
        out.env_latency_s += time.monotonic() - started
        out.turns += 1
    return None


async def run_group(
    engine: InferenceEngine,
    envs: list[Environment],
    task: Task,
    request_id: str,
    limits: EpisodeLimits,
    advantage_estimator: str = "grpo",
    tracer=trace.NULL,
    lanes: trace.Lanes | None = None,
) -> list[Trajectory]:
    outcomes = await asyncio.gather(*(run_episode(engine, env, task, limits, tracer, lanes) for env in envs))
    advantages = ADVANTAGE_ESTIMATORS[advantage_estimator]([o.reward for o in outcomes])
    finished_at = time.time()
    return [
        _trajectory(o, f"{request_id}/{i}", request_id, task, float(advantages[i]), finished_at)
        for i, o in enumerate(outcomes)
    ]


def _trajectory(o: _Outcome, trajectory_id: str, request_id: str, task: Task, advantage: float, finished_at: float):
    tokens, mask = np.asarray(o.seq.tokens, np.int32), np.asarray(o.seq.loss_mask, np.uint8)
    return Trajectory(
        trajectory_id=trajectory_id,
        request_id=request_id,
        task_id=task.task_id,
        tokens=tokens,
        loss_mask=mask,
        behaviour_logprobs=np.asarray(o.seq.logprobs, np.float32),
        policy_versions=np.asarray(o.seq.versions, np.int32),
        reward=o.reward,
        status=o.status,
        advantage=advantage,
        env_latency_s=o.env_latency_s,
        tool_wait_s=float(o.info.get("tool_latency_s", 0.0)),
        num_turns=o.turns,
        finished_at=finished_at,
        sampled_digest=token_digest(tokens, mask),
    )
