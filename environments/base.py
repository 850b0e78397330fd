"""The environment protocol: tasks, step results, episode status, the async base class.

Pure Python (no Beam, no JAX): the rollout pipeline drives environments, the learner never
sees them. Tasks travel as JSON inside Pub/Sub rollout requests, so `Task` validates on read.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any, ClassVar


class EpisodeStatus(str, enum.Enum):
    """How an episode ended. A str Enum so it serialises as its value.

    FINISHED and TRUNCATED are decided by the environment itself; TIMEOUT (wall-clock limit)
    and ENV_ERROR (the environment raised) are assigned by whoever drives the episode.
    """

    FINISHED = "finished"
    TRUNCATED = "truncated"
    TIMEOUT = "timeout"
    ENV_ERROR = "env_error"


_TASK_FIELDS = {"task_id": str, "prompt": str, "target": str}


@dataclasses.dataclass(frozen=True)
class Task:
    """One prompt with what is needed to score it. `meta` must be JSON-serialisable."""

    task_id: str
    prompt: str
    target: str
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.meta is None:
            object.__setattr__(self, "meta", {})
        _validate_task_fields(self.__dict__)

    def to_json_dict(self) -> dict[str, Any]:
        d = {"task_id": self.task_id, "prompt": self.prompt, "target": self.target, "meta": dict(self.meta)}
        try:  # Fail here, at the producer, rather than in a worker far away.
            json.dumps(d)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Task {self.task_id!r}: meta is not JSON-serialisable: {e}") from e
        return d

    @classmethod
    def from_json_dict(cls, d: Any) -> Task:
        if not isinstance(d, Mapping):
            raise ValueError(f"Task JSON must be an object, got {type(d).__name__}")
        unknown = set(d) - set(_TASK_FIELDS) - {"meta"}
        if unknown:  # Strict on read: extra data belongs in `meta`.
            raise ValueError(f"Task JSON has unknown field(s) {sorted(unknown)}")
        _validate_task_fields(d)
        return cls(task_id=d["task_id"], prompt=d["prompt"], target=d["target"], meta=dict(d.get("meta") or {}))


def _validate_task_fields(d: Mapping[str, Any]) -> None:
    for name, typ in _TASK_FIELDS.items():
        if name not in d:
            raise ValueError(f"Task is missing required field {name!r}")
        if not isinstance(d[name], typ):
            raise ValueError(f"Task field {name!r} must be {typ.__name__}, got {type(d[name]).__name__}")
    if not d["task_id"]:
        raise ValueError("Task field 'task_id' must be non-empty")
    meta = d.get("meta", {})
    if meta is not None and not isinstance(meta, Mapping):
        raise ValueError(f"Task field 'meta' must be an object, got {type(meta).__name__}")


@dataclasses.dataclass
class StepResult:
    """What one model turn produced.

    `observation` is text to append to the context (empty when done with nothing to say);
    `info` holds cumulative per-episode counters plus `info["status"]` once `done`.
    """

    observation: str
    reward: float
    done: bool
    info: dict = dataclasses.field(default_factory=dict)


class Environment(abc.ABC):
    """An episodic, text-in/text-out environment driven from an asyncio event loop.

    One instance runs one episode at a time; the pipeline holds many instances to run
    episodes concurrently. Implementations must not block the loop: CPU-heavy or blocking
    work goes through `asyncio.to_thread`, and waiting (tool latency) uses `asyncio.sleep`,
    so the waits of many concurrent episodes overlap.

    Exceptions are for programming errors only (e.g. `step` before `reset`); anything the
    model writes, however broken, becomes an observation.
    """

    name: ClassVar[str] = "environment"

    @abc.abstractmethod
    async def reset(self, task: Task) -> str:
        """Start an episode on `task`; return the first observation (the prompt text)."""

    @abc.abstractmethod
    async def step(self, action_text: str) -> StepResult:
        """Apply one model turn and return its result. The turn is the raw generated text,
        or, when the model writes its own chat format's tool calls, the `Action` parsed
        from them (environments/tool_calls.py; `ToolEnvironment` takes both)."""

    def success(self, reward: float, info: dict) -> bool:
        """Whether an episode that earned `reward` (its last step's `info`) solved its task:
        what held-out evaluation counts. Any reward by default; an environment whose reward
        gives partial credit says what a full solution is."""
        return reward > 0

    def tools(self) -> list[dict]:
        """The environment's tools as JSON schemas in Hugging Face's `tools` format, for a
        chat template's tool block; none by default (text in, text out only)."""
        return []
