"""Which environment a run's episodes play: the learner's prompts and requests, the
evaluator's test split, the planner's measurement."""

from __future__ import annotations

import json

from core.config import configclass, knob


@configclass
class EnvChoice:
    """The environment, its settings, and the simulated latency of its tool calls."""

    name: str = knob("calculator", "the environment (any registered name)", flag="env")
    config: dict = knob(
        {}, "the environment's settings besides tool latency, JSON (turn limit, ranges)", flag="env_config"
    )
    tool_latency: str | None = knob(
        None,
        "per tool call: none, fixed:S, uniform:A:B, lognormal:M:S, or file:PATH (the spec in that file, "
        "read again each second) (unset: --env_config's, else none)",
    )

    def __post_init__(self):
        import environments  # pure Python; imported here so a config module stays light

        if self.name in environments.names():  # a plugin's is checked once it is loaded
            try:
                environments.make(self.name, **self.settings)
            except (TypeError, ValueError) as e:  # the environment's own words, then the flags
                raise ValueError(f"{e} (--env {self.name!r}, --env_config {json.dumps(self.settings)})") from None

    @property
    def settings(self) -> dict:
        """The environment's constructor arguments: --env_config with --tool_latency."""
        return {**self.config, "tool_latency": self.tool_latency} if self.tool_latency else dict(self.config)
