"""Environments for agentic RL: the protocol, the tool-call format, concrete environments.

Pure Python: must not import apache_beam, jax, flax or optax.
"""

from environments.base import Environment, EpisodeStatus, StepResult, Task
from environments.calculator import (
    CalcError,
    CalculatorConfig,
    CalculatorEnv,
    ChainedCalculatorEnv,
    generate_tasks,
    safe_eval,
)
from environments.code import CodeConfig, CodeEnv
from environments.guess import GuessConfig, GuessEnv
from environments.latency import LatencyModel, LatencySampler
from environments.registry import load_entry_points, make, make_tasks, names, oracle, register
from environments.tool_calls import (
    TURN_STOP_STRINGS,
    Action,
    FinalAnswer,
    Malformed,
    ToolCall,
    format_error,
    format_result,
    parse_action,
)

__all__ = [
    "TURN_STOP_STRINGS",
    "Action",
    "CalcError",
    "CalculatorConfig",
    "CalculatorEnv",
    "ChainedCalculatorEnv",
    "CodeConfig",
    "CodeEnv",
    "Environment",
    "EpisodeStatus",
    "FinalAnswer",
    "GuessConfig",
    "GuessEnv",
    "LatencyModel",
    "LatencySampler",
    "Malformed",
    "StepResult",
    "Task",
    "ToolCall",
    "format_error",
    "format_result",
    "generate_tasks",
    "load_entry_points",
    "make",
    "make_tasks",
    "names",
    "oracle",
    "parse_action",
    "register",
    "safe_eval",
]
