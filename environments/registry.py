"""Environments by name: `make("calculator", max_turns=4)`.

A factory is any callable `factory(**config_kwargs) -> Environment`. An optional task
generator `tasks(seed, n, split) -> list[Task]` can be registered with it, so a prompt
feeder can ask for tasks by environment name. Third-party environments plug in through
the `agentic_rl.environments` entry-point group (see `load_entry_points`).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import warnings
from collections.abc import Callable

from environments.base import Environment, Task

ENTRY_POINT_GROUP = "agentic_rl.environments"

EnvFactory = Callable[..., Environment]
TaskGenerator = Callable[[int, int, str], "list[Task]"]
# oracle(task, observations so far) -> next action text: a scripted expert, used to test
# that rewards are reachable and to warm-start a policy by behaviour cloning.
Oracle = Callable[[Task, "list[str]"], str]

_FACTORIES: dict[str, EnvFactory] = {}
_TASKS: dict[str, TaskGenerator] = {}
_ORACLES: dict[str, Oracle] = {}
_ORACLE_STYLES: dict[str, dict[str, Oracle]] = {}  # other demonstration styles, by name
DEFAULT_STYLE = "default"


def register(
    name: str,
    factory: EnvFactory,
    *,
    tasks: TaskGenerator | None = None,
    oracle: Oracle | None = None,
    oracle_styles: dict[str, Oracle] | None = None,
    overwrite: bool = False,
) -> None:
    """oracle_styles: other ways the expert may solve a task, by name (a warm start picks one
    with `--warmstart_oracle`), each winning every task as the default oracle does."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"environment name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory for {name!r} must be callable")
    # Re-registering the same factory is harmless (module re-import); a different one is
    # almost certainly a name clash between plugins.
    if name in _FACTORIES and _FACTORIES[name] is not factory and not overwrite:
        raise ValueError(f"environment {name!r} is already registered")
    _FACTORIES[name] = factory
    if tasks is not None:
        _TASKS[name] = tasks
    if oracle is not None:
        _ORACLES[name] = oracle
    if oracle_styles:
        _ORACLE_STYLES[name] = dict(oracle_styles)


def names() -> list[str]:
    return sorted(_FACTORIES)


def make(name: str, **config_kwargs) -> Environment:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {names()}") from None
    return factory(**config_kwargs)


def _generator(name: str) -> TaskGenerator:
    try:
        return _TASKS[name]
    except KeyError:
        raise KeyError(f"no task generator for {name!r}; have: {sorted(_TASKS)}") from None


def task_settings(name: str, env_config: dict | None) -> dict:
    """The part of an environment's settings that shapes its tasks: the entries of
    `env_config` its generator takes as keyword-only parameters (guess: low, high)."""
    params = inspect.signature(_generator(name)).parameters
    accepted = {k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return {k: v for k, v in (env_config or {}).items() if k in accepted}


def make_tasks(name: str, seed: int, n: int, split: str = "train", env_config: dict | None = None) -> list[Task]:
    """`n` tasks of `split`, drawn for the environment as `env_config` sets it up (a guess
    game of 1..32 draws its windows from 1..32)."""
    return _generator(name)(seed, n, split, **task_settings(name, env_config))


def oracle(name: str, style: str = DEFAULT_STYLE) -> Oracle:
    try:
        found = _ORACLES[name]
    except KeyError:
        raise KeyError(f"no oracle for {name!r}; have: {sorted(_ORACLES)}") from None
    if style == DEFAULT_STYLE:
        return found
    styles = _ORACLE_STYLES.get(name, {})
    if style not in styles:
        raise KeyError(f"{name!r} has no oracle style {style!r}; have: {[DEFAULT_STYLE, *sorted(styles)]}")
    return styles[style]


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Register environments advertised by installed packages; return their names.

    Each entry point loads to a factory (`name = "pkg.module:make_env"`). A broken plugin
    is reported as a warning and skipped so it cannot take down every rollout worker.
    """
    loaded = []
    for ep in importlib.metadata.entry_points(group=group):
        try:
            register(ep.name, ep.load())
        except Exception as e:
            warnings.warn(f"environment plugin {ep.name!r} ({ep.value}) failed: {e!r}", stacklevel=2)
            continue
        loaded.append(ep.name)
    return loaded


def _register_builtins() -> None:
    from environments.calculator import (
        CalculatorConfig,
        CalculatorEnv,
        ChainedCalculatorEnv,
        chained_config,
        generate_chained_tasks,
        generate_tasks,
        oracle_action,
        whole_expression_action,
    )

    def make_calculator(**kwargs) -> CalculatorEnv:
        return CalculatorEnv(CalculatorConfig(**kwargs))

    register(
        "calculator",
        make_calculator,
        tasks=generate_tasks,
        oracle=oracle_action,
        oracle_styles={"whole": whole_expression_action},
    )

    def make_calculator_chained(**kwargs) -> ChainedCalculatorEnv:
        return ChainedCalculatorEnv(chained_config(**kwargs))

    # No "whole" style: one operation per call refuses every whole-expression call here.
    register("calculator_chained", make_calculator_chained, tasks=generate_chained_tasks, oracle=oracle_action)

    from environments.guess import GuessConfig, GuessEnv
    from environments.guess import generate_tasks as guess_tasks
    from environments.guess import oracle_action as guess_oracle

    def make_guess(**kwargs) -> GuessEnv:
        return GuessEnv(GuessConfig(**kwargs))

    register("guess", make_guess, tasks=guess_tasks, oracle=guess_oracle)

    from environments.code import CodeConfig, CodeEnv
    from environments.code import generate_tasks as code_tasks
    from environments.code import oracle_action as code_oracle

    def make_code(**kwargs) -> CodeEnv:
        return CodeEnv(CodeConfig(**kwargs))

    register("code", make_code, tasks=code_tasks, oracle=code_oracle)


_register_builtins()
