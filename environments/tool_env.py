"""The shared turn bookkeeping of a multi-turn environment with one tool.

Each turn the model either calls the environment's tool (`<call NAME>ARGS</call>`) or
gives a final answer (`<answer>TEXT</answer>`). This base class parses the action, turns
malformed or unknown calls into counted error observations, waits out the injected tool
latency, counts turns and ends the episode as finished or truncated. A concrete
environment only says what its tool does (`call_tool`), how an answer scores
(`score_answer`), and describes its tool (`tool_description`, `tool_argument`,
`tool_argument_description`) for a chat template's tool block (`tools()`).

`step` takes the model's raw text, or an `Action` a chat format already parsed from the
model's native tool-call syntax (core/policy/text/chat_format.py): both count the same way.
"""

from __future__ import annotations

import asyncio

from environments.base import Environment, EpisodeStatus, StepResult, Task
from environments.tool_calls import Action, FinalAnswer, Malformed, ToolCall, format_error, parse_action


class ToolEnvironment(Environment):
    tool_name: str = ""
    tool_description: str = ""
    tool_argument: str = "input"  # the name of the tool's one (string) argument
    tool_argument_description: str = ""

    def __init__(self, config) -> None:
        self.config = config  # needs .max_turns and .tool_latency
        self._task: Task | None = None
        self._done = True

    def _start(self, task: Task, **extra_info) -> str:
        self._task, self._done, self._turns = task, False, 0
        # Per-task latency stream: deterministic, yet concurrent episodes differ.
        self._latency = self.config.tool_latency.sampler(stream=task.task_id)
        self._info = {
            "turns": 0,
            "tool_calls": 0,
            "malformed_calls": 0,
            "unknown_tool_calls": 0,
            "tool_errors": 0,
            "tool_latency_s": 0.0,
            **extra_info,
        }
        return task.prompt

    async def reset(self, task: Task) -> str:
        return self._start(task)

    async def call_tool(self, args: str) -> tuple[str, float, bool]:
        """Runs the tool on `args` (after the latency wait): (observation, reward, done)."""
        raise NotImplementedError

    async def score_answer(self, text: str) -> float:
        raise NotImplementedError

    def tools(self) -> list[dict]:
        argument = {"type": "string", "description": self.tool_argument_description}
        parameters = {"type": "object", "properties": {self.tool_argument: argument}, "required": [self.tool_argument]}
        function = {"name": self.tool_name, "description": self.tool_description, "parameters": parameters}
        return [{"type": "function", "function": function}]

    async def step(self, action_text: str | Action) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        self._turns += 1
        self._info["turns"] = self._turns
        parsed = isinstance(action_text, (ToolCall, FinalAnswer, Malformed))  # by a native chat format
        action = action_text if parsed else parse_action(action_text)
        reward, done, obs = 0.0, False, ""
        if isinstance(action, FinalAnswer):
            reward, done = await self.score_answer(action.text), True
        elif isinstance(action, ToolCall) and action.name == self.tool_name:
            await self._tool_wait()
            obs, reward, done = await self.call_tool(action.args)
        elif isinstance(action, ToolCall):
            self._info["unknown_tool_calls"] += 1
            obs = format_error(f"unknown tool {action.name}; tools: {self.tool_name}")
        else:
            assert isinstance(action, Malformed)
            self._info["malformed_calls"] += 1
            obs = format_error(action.reason)
        if done:
            self._info["status"] = EpisodeStatus.FINISHED
        elif self._turns >= self.config.max_turns:
            done = True
            self._info["status"] = EpisodeStatus.TRUNCATED
        self._done = done
        return StepResult(observation=obs, reward=reward, done=done, info=dict(self._info))

    async def _tool_wait(self) -> None:
        self._info["tool_calls"] += 1
        delay = self._latency.sample()
        if delay > 0:
            await asyncio.sleep(delay)  # the simulated tool wait: yields the loop to other episodes
        self._info["tool_latency_s"] += delay
