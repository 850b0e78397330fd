"""`calculator_chained`: one operation per `calc` call and 2-3 operations per task, so the
model must chain calls, each result fed into the next. The real environment, no mocks."""

from __future__ import annotations

import asyncio
import re

import pytest

import environments as E
from environments import ChainedCalculatorEnv, EpisodeStatus, Task
from environments.calculator import CalculatorConfig, generate_tasks

NAME = "calculator_chained"


def n_ops(task: Task) -> int:
    # Binary operators only: a leading "-" never occurs (operands are 0..20).
    return len(re.findall(r"[+\-*]", task.meta["expression"]))


async def _drive(env, task: Task, policy) -> tuple[float, list]:
    await env.reset(task)
    observations, results = [], []
    while not (results and results[-1].done):
        results.append(await env.step(policy(task, observations)))
        observations.append(results[-1].observation)
    return sum(r.reward for r in results), results


def drive(env, task: Task, policy) -> tuple[float, list]:
    return asyncio.run(_drive(env, task, policy))


def scripted(*actions: str):
    return lambda task, observations: actions[len(observations)]


# --- Tasks -----------------------------------------------------------------------------


def test_tasks_have_two_or_three_operations_both_occurring_distinct_and_deterministic():
    train = E.make_tasks(NAME, 0, 200, "train")
    assert train == E.make_tasks(NAME, 0, 200, "train")  # deterministic per (seed, split)
    assert train != E.make_tasks(NAME, 1, 200, "train")
    assert {n_ops(t) for t in train} == {2, 3}
    assert len({t.meta["expression"] for t in train}) == len({t.task_id for t in train}) == 200
    for t in train:
        assert t.task_id.startswith(f"{NAME}-train-") and t.prompt == f"Compute {t.meta['expression']}. "
        assert t.target == str(E.safe_eval(t.meta["expression"]))


def test_train_and_test_never_share_an_expression():
    train = {t.meta["expression"] for s in range(3) for t in E.make_tasks(NAME, s, 300, "train")}
    test = {t.meta["expression"] for s in range(3) for t in E.make_tasks(NAME, s, 100, "test")}
    assert train and test and not train & test


def test_the_default_calculator_tasks_are_unchanged():
    """Pinned before min_ops/max_ops existed: old datasets and runs keep their tasks."""
    train = generate_tasks(0, 5, "train")
    assert [t.meta["expression"] for t in train] == ["9-16+17", "0+1", "18-5", "19+20*8", "2*14"]
    assert [t.task_id for t in train[:2]] == ["calculator-train-0a63e2a26a84", "calculator-train-a56311c62d6c"]
    assert [t.meta["expression"] for t in generate_tasks(0, 5, "test")] == ["10-15", "6-5", "0*12*8", "8*17+8", "20*13"]
    assert generate_tasks(0, 50, "train", min_ops=1, max_ops=2) == E.make_tasks("calculator", 0, 50, "train")
    assert E.registry.task_settings("calculator", {"max_turns": 3}) == {}  # old datasets still match


@pytest.mark.parametrize("lo, hi", [(0, 2), (1, 5), (3, 2), (True, 2), (1, 2.0)])
def test_a_bad_operation_range_is_refused(lo, hi):
    with pytest.raises(ValueError, match=r"min_ops|max_ops"):
        generate_tasks(0, 1, "train", min_ops=lo, max_ops=hi)


def test_one_operation_count_when_min_equals_max():
    assert {n_ops(t) for t in generate_tasks(4, 60, "train", min_ops=3, max_ops=3)} == {3}


# --- Episodes --------------------------------------------------------------------------


def test_the_oracle_wins_every_task_with_one_call_per_operation():
    oracle = E.oracle(NAME)
    tasks = E.make_tasks(NAME, 1, 40, "test")
    assert {n_ops(t) for t in tasks} == {2, 3}
    for task in tasks:
        total, results = drive(E.make(NAME), task, oracle)
        last = results[-1]
        assert total == 1.0 and last.reward == 1.0, (task, results)
        assert last.info["status"] == EpisodeStatus.FINISHED
        assert last.info["tool_calls"] == n_ops(task) and last.info["tool_errors"] == 0
        assert last.info["turns"] == n_ops(task) + 1


def test_each_call_feeds_the_previous_result_forward():
    task = Task("t", "Compute 3+4*5-2. ", "21", meta={"expression": "3+4*5-2"})
    oracle = E.oracle(NAME)
    total, results = drive(E.make(NAME), task, oracle)
    assert [r.observation for r in results] == ["<result>20</result>", "<result>23</result>", "<result>21</result>", ""]
    assert total == 1.0
    observations = [r.observation for r in results]
    assert [oracle(task, observations[:k]) for k in range(4)] == [
        "<call calc>4*5</call>",
        "<call calc>3+20</call>",
        "<call calc>23-2</call>",
        "<answer>21</answer>",
    ]


def test_the_whole_expression_in_one_call_is_an_error_observation_then_play_goes_on():
    task = next(t for t in E.make_tasks(NAME, 2, 20, "train") if n_ops(t) == 2)
    env = E.make(NAME)
    total, results = drive(
        env, task, scripted(f"<call calc>{task.meta['expression']}</call>", f"<answer>{task.target}</answer>")
    )
    first = results[0]
    assert first.observation == "<error>at most 1 operation per call</error>"
    assert (first.reward, first.done) == (0.0, False)
    assert first.info["tool_errors"] == 1 and first.info["tool_calls"] == 1
    assert total == 1.0  # the answer is scored by its value alone


def test_an_answer_without_calls_scores_by_its_value():
    """As in the plain calculator: the env does not require calls; the right value wins."""
    task = next(t for t in E.make_tasks(NAME, 2, 20, "train") if n_ops(t) == 2)
    for answer, reward in ((task.target, 1.0), (str(int(task.target) + 1), 0.0)):
        total, [r] = drive(E.make(NAME), task, scripted(f"<answer>{answer}</answer>"))
        assert total == r.reward == reward and r.info["tool_calls"] == 0
        assert r.info["status"] == EpisodeStatus.FINISHED
    _, [plain] = drive(E.make("calculator"), task, scripted(f"<answer>{task.target}</answer>"))
    assert plain.reward == 1.0


def test_a_refused_call_can_be_retried_at_three_operations():
    """max_turns leaves one turn spare: a refused call, three calls and the answer fit."""
    task = next(t for t in E.make_tasks(NAME, 3, 40, "train") if n_ops(t) == 3)
    oracle = E.oracle(NAME)
    env = E.make(NAME)
    assert env.config.max_turns == 5

    def stumbles_once(task, observations):
        return "<call calc>1+1+1</call>" if not observations else oracle(task, observations[1:])

    total, results = drive(env, task, stumbles_once)
    assert total == 1.0 and results[-1].info["tool_errors"] == 1 and len(results) == 5


def test_the_system_prompt_says_one_operation_per_call():
    [tool] = E.make(NAME).tools()
    assert tool["function"]["name"] == "calc"
    assert "ONE" in tool["function"]["description"] and "result" in tool["function"]["description"]
    assert isinstance(E.make(NAME), ChainedCalculatorEnv) and E.make(NAME).name == NAME
    assert "ONE" not in E.make("calculator").tools()[0]["function"]["description"]


# --- Settings --------------------------------------------------------------------------


def test_defaults_and_env_config_overrides():
    c = E.make(NAME).config
    assert (c.max_ops_per_call, c.min_ops, c.max_ops, c.max_turns) == (1, 2, 3, 5)
    assert ChainedCalculatorEnv().config == c
    c = E.make(NAME, max_ops=4, max_turns=9, tool_latency="none").config
    assert (c.min_ops, c.max_ops, c.max_turns) == (2, 4, 9)
    assert E.make(NAME, max_ops=4).config.max_turns == 6  # derived when not given
    assert E.make(NAME, max_ops_per_call=2).config.max_ops_per_call == 2


def test_a_wider_range_from_env_config_shapes_tasks_and_the_oracle_still_wins():
    settings = {"max_ops": 4}
    assert E.registry.task_settings(NAME, {**settings, "max_turns": 6}) == settings
    tasks = E.make_tasks(NAME, 5, 60, "test", settings)
    assert {n_ops(t) for t in tasks} == {2, 3, 4}
    for task in tasks[:15]:
        total, results = drive(E.make(NAME, **settings), task, E.oracle(NAME))
        assert total == 1.0 and results[-1].info["tool_calls"] == n_ops(task)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"min_ops": 3, "max_ops": 2}, r"min_ops \(3\) must be <= max_ops \(2\)"),
        ({"min_ops": 4}, r"min_ops \(4\) must be <= max_ops \(3\)"),
        ({"max_ops": 5}, r"max_ops must be an int in \[1, 4\]"),
        ({"min_ops": 0}, r"min_ops must be an int in \[1, 4\]"),
        ({"max_ops": "3"}, r"max_ops must be an int in \[1, 4\]"),
    ],
)
def test_a_bad_config_is_a_clear_value_error(kwargs, says):
    with pytest.raises(ValueError, match=says):
        E.make(NAME, **kwargs)
    if "min_ops" in kwargs and "max_ops" in kwargs:
        with pytest.raises(ValueError, match=says):
            CalculatorConfig(**kwargs)
        with pytest.raises(ValueError, match=says):
            E.make_tasks(NAME, 0, 1, "train", kwargs)


def test_no_whole_expression_style_is_registered():
    with pytest.raises(KeyError, match="no oracle style 'whole'"):
        E.oracle(NAME, "whole")
    assert E.oracle("calculator", "whole")  # the plain game keeps it
