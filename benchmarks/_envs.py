"""Benchmark-only environments and trajectory-length sources (no Beam here).

`ScriptedToolEnv`: every step waits a fixed tool latency (asyncio.sleep) and the episode
ends after a fixed number of steps, whatever the model writes, so an episode's shape
(turns, waits) is fixed and only the engine decides how long it takes.

`oracle_lengths`: token lengths of real oracle transcripts (calculator, code, guess),
tokenised exactly as the rollout side does, for the packing benchmark.
"""

from __future__ import annotations

import asyncio

import environments
from core.config import configclass, knob
from core.policy.text import tokenizer
from environments import Environment, EpisodeStatus, StepResult, Task


@configclass
class ScriptedConfig:
    tool_latency_s: float = knob(1.0, "the wait of every step, s", ge=0)
    steps: int = knob(3, "the episode is done after this many env steps (tool turns + a final answer)", ge=1)
    observation: str = knob("<result>42</result>", "what every step but the last returns")


class ScriptedToolEnv(Environment):
    """Every step waits `tool_latency_s`; done after `steps` steps (status finished)."""

    name = "scripted_tool"

    def __init__(self, config: ScriptedConfig | None = None):
        self.config = config or ScriptedConfig()
        self._steps = 0
        self.waited_s = 0.0

    async def reset(self, task: Task) -> str:
        self._steps = 0
        self.waited_s = 0.0
        return task.prompt

    async def step(self, action_text: str) -> StepResult:
        self._steps += 1
        if self.config.tool_latency_s > 0:
            await asyncio.sleep(self.config.tool_latency_s)
            self.waited_s += self.config.tool_latency_s
        done = self._steps >= self.config.steps
        info = {"turns": self._steps}
        if done:
            info["status"] = EpisodeStatus.FINISHED
        return StepResult(observation="" if done else self.config.observation, reward=float(done), done=done, info=info)


async def _transcript(env: Environment, oracle, task: Task, max_turns: int = 8) -> int:
    """Length in tokens of one oracle episode: BOS + prompt + actions + observations."""
    n = 1 + len(tokenizer.encode(await env.reset(task)))
    observations: list[str] = []
    for _ in range(max_turns):
        action = oracle(task, observations)
        n += len(tokenizer.encode(action))
        result = await env.step(action)
        if result.done:
            break
        n += len(tokenizer.encode(result.observation))
        observations.append(result.observation)
    return n


def oracle_lengths(env_name: str, n: int, seed: int = 0) -> list[int]:
    """Token lengths of `n` oracle transcripts of real tasks of `env_name`
    ("calculator", "guess" or "code"); code runs its real sandbox."""
    if env_name == "code":
        from environments import code

        tasks = code.generate_tasks(seed, n)

        def make():
            return code.CodeEnv(), code.oracle_action
    else:
        tasks = environments.make_tasks(env_name, seed, n)

        def make():
            return environments.make(env_name), environments.oracle(env_name)

    async def all_lengths():
        out = []
        for t in tasks:
            env, oracle = make()
            out.append(await _transcript(env, oracle, t))
        return out

    return asyncio.run(all_lengths())
