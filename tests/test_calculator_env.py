"""CalculatorEnv end to end with real policies, the safe evaluator, latency, tasks, registry."""

import asyncio
import re
import time

import pytest

import environments as E
from environments import (
    CalculatorConfig,
    CalculatorEnv,
    EpisodeStatus,
    LatencyModel,
    StepResult,
    Task,
    generate_tasks,
    make,
)


def oracle_policy(task: Task, history: list[str]) -> str:
    """The registered oracle: one calc call per operation, then the answer."""
    return E.oracle("calculator")(task, history)


async def run_episode(env, task, policy) -> tuple[float, StepResult]:
    await env.reset(task)
    history, total = [], 0.0
    while True:
        result = await env.step(policy(task, history))
        total += result.reward
        history.append(result.observation)
        if result.done:
            return total, result


def test_oracle_policy_solves_test_tasks():
    tasks = generate_tasks(seed=1, n=50, split="test")
    env = CalculatorEnv()
    for task in tasks:
        reward, last = asyncio.run(run_episode(env, task, oracle_policy))
        assert reward == 1.0, task
        assert last.info["status"] == EpisodeStatus.FINISHED
        n_ops = sum(task.meta["expression"][1:].count(op) for op in "+-*")
        assert last.info["tool_calls"] == n_ops and last.info["turns"] == n_ops + 1


def test_tasks_need_several_tool_calls():
    """With one operation per call, a two-operator task cannot be done in one call."""
    tasks = [t for t in generate_tasks(3, 200, "train") if "(" not in t.meta["expression"]]
    two_ops = [t for t in tasks if sum(t.meta["expression"][1:].count(op) for op in "+-*") == 2]
    assert len(two_ops) > 50
    [r] = _steps(CalculatorEnv(), two_ops[0], [f"<call calc>{two_ops[0].meta['expression']}</call>"])
    assert r.observation == "<error>at most 1 operation per call</error>"
    assert r.info["tool_errors"] == 1
    reward, last = asyncio.run(run_episode(CalculatorEnv(), two_ops[0], oracle_policy))
    assert reward == 1.0 and last.info["tool_calls"] == 2


def test_wrong_or_non_integer_answer_gets_zero():
    task = Task("t", "Compute 2+2. ", "4")
    env = CalculatorEnv()
    for answer, expected in [
        ("4", 1.0),
        (" +4\n", 1.0),
        ("004", 1.0),
        ("5", 0.0),
        ("4.0", 0.0),
        ("four", 0.0),
        ("４", 0.0),
        ("", 0.0),
    ]:
        asyncio.run(env.reset(task))
        result = asyncio.run(env.step(f"<answer>{answer}</answer>"))
        assert (result.reward, result.done) == (expected, True), answer


def _steps(env, task, actions):
    async def go():
        await env.reset(task)
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


@pytest.mark.parametrize(
    "expr, result",
    [
        ("12*(3+4)", "<result>84</result>"),
        (" -3 - -4 ", "<result>1</result>"),
        ("17//5", "<result>3</result>"),
        ("17%5", "<result>2</result>"),
        ("1//0", "<error>division by zero</error>"),
        ("5%(2-2)", "<error>division by zero</error>"),
    ],
)
def test_calc_tool(expr, result):
    env = CalculatorEnv(CalculatorConfig(max_ops_per_call=3))
    [r] = _steps(env, Task("t", "p", "0"), [f"<call calc>{expr}</call>"])
    assert r.observation == result


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "2**999999",
        "9" * 60,
        "99999999*99999999*99999999",
        "1" * 10_000,
        "x",
        "os.name",
        "(1).real",
        "[1][0]",
        "'a'*3",
        "1.5+1",
        "True+1",
        "7/2",
        "lambda: 1",
        "(" * 40 + "1" + ")" * 40,
        "-" * 70 + "1",
        "1 if 1 else 2",
        "f'{1}'",
        "",
        "1;2",
        "a:=1",
    ],
)
def test_hostile_expressions_are_refused(expr):
    env = CalculatorEnv()
    [r] = _steps(env, Task("t", "p", "0"), [f"<call calc>{expr}</call>"])
    assert r.observation.startswith("<error>") and not r.done
    assert r.info["tool_errors"] == 1 and r.info["tool_calls"] == 1
    with pytest.raises(E.CalcError):
        E.safe_eval(expr, max_chars=64)


def test_deep_nesting_is_refused_even_without_length_cap():
    assert E.safe_eval("-" * 60 + "1") == 1  # within the cap, legal
    for expr in ["-" * 100_000 + "1", "(" * 10_000 + "1" + ")" * 10_000]:
        with pytest.raises(E.CalcError):
            E.safe_eval(expr, max_chars=10**6)


def test_max_turns_truncates():
    env = CalculatorEnv(CalculatorConfig(max_turns=3))
    results = _steps(env, Task("t", "p", "2"), ["<call calc>1+1</call>"] * 3)
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["status"] == EpisodeStatus.TRUNCATED == "truncated"
    assert results[-1].info["tool_calls"] == 3
    assert "status" not in results[0].info
    with pytest.raises(RuntimeError):  # stepping a finished episode is a caller bug
        asyncio.run(env.step("<answer>2</answer>"))


def test_injected_latency_is_awaited_and_overlaps():
    config = CalculatorConfig(tool_latency=LatencyModel.from_spec("fixed:0.2"))
    task = generate_tasks(0, 1)[0]

    t0 = time.perf_counter()
    [r] = _steps(CalculatorEnv(config), task, ["<call calc>1+1</call>"])
    assert time.perf_counter() - t0 >= 0.2
    assert r.info["tool_latency_s"] == pytest.approx(0.2)

    async def many():
        envs = [CalculatorEnv(config) for _ in range(10)]
        return await asyncio.gather(*(run_episode(e, task, oracle_policy) for e in envs))

    calls = len(E.calculator._evaluation_plan(task.meta["expression"]))
    t0 = time.perf_counter()
    results = asyncio.run(many())
    elapsed = time.perf_counter() - t0
    assert all(reward == 1.0 for reward, _ in results)
    assert elapsed < 0.5 * 10 * calls * 0.2, elapsed  # serial would be >= 10 * calls * 0.2 s


def test_tasks_are_short_expressions_with_their_values_and_splits_never_share_one():
    # Determinism, unique ids, JSON and split names: tests/test_environment_contract.py.
    a = generate_tasks(7, 300, "train")
    train = {t.meta["expression"] for s in range(3) for t in generate_tasks(s, 300, "train")}
    test = {t.meta["expression"] for s in range(3) for t in generate_tasks(s, 300, "test")}
    assert train and test and not train & test
    for t in a:
        assert len(t.prompt) <= 24 and t.prompt.startswith("Compute ")
        assert t.target == str(E.safe_eval(t.meta["expression"]))
    n_ops = {len(re.findall(r"[+\-*]", t.meta["expression"])) for t in a}
    assert n_ops == {1, 2}


def test_task_json_validation():
    assert Task.from_json_dict({"task_id": "a", "prompt": "p", "target": "1"}).meta == {}
    bad = [
        None,
        [],
        {"prompt": "p", "target": "1"},
        {"task_id": 1, "prompt": "p", "target": "1"},
        {"task_id": "a", "prompt": "p", "target": 1},
        {"task_id": "", "prompt": "p", "target": "1"},
        {"task_id": "a", "prompt": "p", "target": "1", "meta": []},
        {"task_id": "a", "prompt": "p", "target": "1", "extra": 1},
    ]
    for d in bad:
        with pytest.raises(ValueError):
            Task.from_json_dict(d)
    with pytest.raises(ValueError, match="JSON"):
        Task("a", "p", "1", meta={"x": object()}).to_json_dict()


def test_config_validation():
    assert CalculatorConfig(tool_latency="fixed:0.5").tool_latency.seconds == 0.5
    for kwargs in [
        {"max_turns": 0},
        {"max_turns": 1.5},
        {"max_expression_chars": 0},
        {"tool_latency": 0.5},
        {"tool_latency": "fixed:-1"},
    ]:
        with pytest.raises(ValueError):
            CalculatorConfig(**kwargs)


def test_registry():
    assert "calculator" in E.names()
    env = make("calculator", max_turns=2, tool_latency="none")
    assert isinstance(env, CalculatorEnv) and env.config.max_turns == 2
    assert E.make_tasks("calculator", 0, 3, "test") == generate_tasks(0, 3, "test")
    with pytest.raises(KeyError, match="calculator"):
        make("no-such-env")
    with pytest.raises(ValueError):
        E.register("calculator", lambda **kw: CalculatorEnv())
    assert E.load_entry_points() == []  # no plugins installed here


def test_the_whole_expression_oracle_wins_every_task_in_one_call_where_the_tool_allows_it():
    """The checkpoint recipe's demonstrations (`--warmstart_oracle=whole`): one call with the
    task's whole expression, then its result; with one operation per call the tool refuses
    the two-operation tasks, and an unknown style is refused by name."""
    whole = E.oracle("calculator", "whole")
    for ops in (2, 1):
        env_tasks = E.make_tasks("calculator", 4, 40, "test", {"max_ops_per_call": ops})
        wins = 0
        for task in env_tasks:
            env = E.make("calculator", max_ops_per_call=ops)
            asyncio.run(env.reset(task))
            first = asyncio.run(env.step(whole(task, [])))
            second = asyncio.run(env.step(whole(task, [first.observation])))
            wins += second.reward == 1.0
        if ops == 2:
            assert wins == len(env_tasks)
        else:
            assert 0 < wins < len(env_tasks)  # the one-operation tasks only
    with pytest.raises(KeyError, match=r"no oracle style 'nope'.*whole"):
        E.oracle("calculator", "nope")
