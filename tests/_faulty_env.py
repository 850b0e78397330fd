"""A test environment whose fault is chosen by the task: `task.meta["fault"]`.

Used by tests/test_rollout_faults_*.py (tests/_rollout_job.py) through a running rollout pipeline. The pipeline
subprocess finds it the way it finds any plugin environment: an `agentic_rl.environments`
entry point (`faulty = tests._faulty_env:make_env`) of a distribution on its sys.path.

Faults on the first `step`:
    ok            a well-behaved episode: done at once, reward 1.0, status finished
    hang          never answers (awaits forever): the pipeline's step timeout ends it
    raise         raises RuntimeError
and garbage a buggy environment can return through the StepResult interface:
    obs_bytes     a non-string observation (bytes), episode not done
    nan_reward    reward NaN, done
    str_reward    reward a non-numeric string, done
    not_a_result  a plain string instead of a StepResult
    none_result   None instead of a StepResult
    bad_status    done with info["status"] not an EpisodeStatus value
Faults in `reset`:
    reset_raise   raises RuntimeError
    reset_hang    never returns
    reset_not_str returns an int instead of the prompt text
"""

from __future__ import annotations

import asyncio

from environments import Environment, EpisodeStatus, StepResult, Task

NAME = "faulty"
STEP_FAULTS = ("hang", "raise", "obs_bytes", "nan_reward", "str_reward", "not_a_result", "none_result", "bad_status")
RESET_FAULTS = ("reset_raise", "reset_hang", "reset_not_str")
FAULTS = ("ok", *STEP_FAULTS, *RESET_FAULTS)
BAD_STATUS = "exploded"


class FaultyEnv(Environment):
    name = NAME

    def __init__(self, max_turns: int = 1):
        self.max_turns = max_turns
        self._fault = None

    async def reset(self, task: Task) -> str:
        fault = task.meta.get("fault", "ok")
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        self._fault = fault
        if fault == "reset_raise":
            raise RuntimeError("faulty environment: reset raised on purpose")
        if fault == "reset_hang":
            await asyncio.sleep(3600)
            raise AssertionError("a hung reset was not cancelled")
        if fault == "reset_not_str":
            return 12345
        return task.prompt

    async def step(self, action_text: str) -> StepResult:
        fault = self._fault
        if fault == "ok":
            return StepResult("", 1.0, True, {"status": EpisodeStatus.FINISHED})
        if fault == "hang":
            await asyncio.sleep(3600)  # far past any step timeout; cancellable, as the protocol asks
            raise AssertionError("a hung step was not cancelled")
        if fault == "raise":
            raise RuntimeError("faulty environment: step raised on purpose")
        if fault == "obs_bytes":
            return StepResult(b"\x00\xffnot a str", 0.0, False, {})
        if fault == "nan_reward":
            return StepResult("", float("nan"), True, {"status": EpisodeStatus.FINISHED})
        if fault == "str_reward":
            return StepResult("", "lots", True, {"status": EpisodeStatus.FINISHED})
        if fault == "not_a_result":
            return "<result>garbage</result>"
        if fault == "none_result":
            return None
        if fault == "bad_status":
            return StepResult("", 0.0, True, {"status": BAD_STATUS})
        raise AssertionError(f"step before reset (fault {fault!r})")


def make_env(**config) -> FaultyEnv:
    return FaultyEnv(**config)


def task(fault: str, i: int = 0) -> Task:
    """A task that makes the environment commit `fault`."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}")
    return Task(f"{fault}-{i}", f"Compute {i}+1. ", str(i + 1), {"fault": fault})
