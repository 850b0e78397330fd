"""GuessEnv end to end: the binary-search oracle, a random policy, feedback, errors,
truncation, latency overlap, and task splits."""

import asyncio
import math
import random
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from environments.base import EpisodeStatus, Task
from environments.guess import (
    MIN_WIDTH,
    GuessConfig,
    GuessEnv,
    generate_tasks,
    guesses_needed,
    oracle_action,
    task_range,
)
from environments.latency import LatencyModel


async def run_episode(env, task, policy):
    """policy(task, observations) -> action; returns (total reward, last StepResult)."""
    await env.reset(task)
    observations, total = [], 0.0
    while True:
        result = await env.step(policy(task, observations))
        total += result.reward
        observations.append(result.observation)
        if result.done:
            return total, result


def _steps(env, task, actions):
    async def go():
        await env.reset(task)
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


SECRET_42 = Task("t42", "Guess my number in 1..100. ", "42")  # Bare: the config's range.


def test_oracle_wins_every_test_task_within_binary_search_bound():
    env = GuessEnv()
    for task in generate_tasks(seed=1, n=50, split="test"):
        reward, last = asyncio.run(run_episode(env, task, oracle_action))
        low, high = task_range(task)
        assert reward == 1.0, task
        assert last.info["status"] == EpisodeStatus.FINISHED
        assert last.info["turns"] <= guesses_needed(high - low + 1) <= 7
        assert last.info["tool_errors"] == last.info["malformed_calls"] == 0
    assert guesses_needed(100) == 7 < GuessConfig().max_turns  # one turn of slack


def _random_policy(seed):
    rng = random.Random(seed)

    def policy(task, observations):
        low, high = task_range(task)
        return f"<call guess>{rng.randint(low, high)}</call>"

    return policy


def test_random_policy_mostly_loses():
    # Uniform guesses (with replacement) in a range of width w win within 8 turns with
    # probability 1 - (1 - 1/w)**8: 0.077 on 1..100. n=300 gives sigma ~0.015.
    env = GuessEnv()
    rng = random.Random(0)
    full = [Task(f"r{i}", "Guess my number in 1..100. ", str(rng.randint(1, 100))) for i in range(300)]
    results = [asyncio.run(run_episode(env, t, _random_policy(i))) for i, t in enumerate(full)]
    mean = sum(r for r, _ in results) / len(results)
    assert 1 - 0.99**8 == pytest.approx(0.0773, abs=1e-4)
    assert mean < 0.15, mean  # expectation + >4 sigma
    assert {last.info["status"] for r, last in results if r == 0} == {EpisodeStatus.TRUNCATED}

    # Generated tasks have narrower windows (>= MIN_WIDTH), so luck helps more, still < 0.3.
    tasks = generate_tasks(seed=2, n=300, split="test")
    widths = [task_range(t)[1] - task_range(t)[0] + 1 for t in tasks]
    expected = sum(1 - (1 - 1 / w) ** 8 for w in widths) / len(widths)
    results = [asyncio.run(run_episode(env, t, _random_policy(i))) for i, t in enumerate(tasks)]
    mean = sum(r for r, _ in results) / len(results)
    assert expected < 0.2 and abs(mean - expected) < 0.1 and mean < 0.3, (mean, expected)


def test_higher_lower_and_correct():
    results = _steps(GuessEnv(), SECRET_42, [f"<call guess>{g}</call>" for g in (1, 100, 41, 43, " 10 ", "+90", "042")])
    assert [r.observation for r in results] == [
        "<result>higher</result>",
        "<result>lower</result>",
        "<result>higher</result>",
        "<result>lower</result>",
        "<result>higher</result>",
        "<result>lower</result>",
        "<result>correct</result>",
    ]
    assert [r.reward for r in results] == [0.0] * 6 + [1.0]
    assert [r.done for r in results] == [False] * 6 + [True]
    assert results[-1].info["status"] == EpisodeStatus.FINISHED
    assert results[-1].info["tool_calls"] == 7 and results[-1].info["tool_errors"] == 0


def test_reply_window_names_the_numbers_still_possible():
    """The easier game: a wrong guess is answered with the window the replies so far leave
    (a guess outside it leaves it as it was), as long a reply as higher/lower."""
    env = GuessEnv(GuessConfig(reply_window=True))
    results = _steps(env, SECRET_42, [f"<call guess>{g}</call>" for g in (50, 25, 60, 41, 43, 42)])
    assert [r.observation for r in results] == [
        "<result>1..49</result>",
        "<result>26..49</result>",
        "<result>26..49</result>",
        "<result>42..49</result>",
        "<result>42..42</result>",
        "<result>correct</result>",
    ]
    assert [r.reward for r in results] == [0.0] * 5 + [1.0] and results[-1].info["found"]
    assert "lo..hi" in env.tool_description and "higher" in GuessEnv().tool_description
    for task in generate_tasks(seed=1, n=50, split="test", high=31):  # the oracle reads windows
        reward, last = asyncio.run(run_episode(env, task, oracle_action))
        assert reward == 1.0 and last.info["turns"] <= guesses_needed(31), task


@pytest.mark.parametrize(
    "answer, reward", [("42", 1.0), (" 42\n", 1.0), ("41", 0.0), ("forty-two", 0.0), ("４２", 0.0), ("", 0.0)]
)
def test_answer_is_a_final_guess(answer, reward):
    [r] = _steps(GuessEnv(), SECRET_42, [f"<answer>{answer}</answer>"])
    assert (r.reward, r.done, r.info["status"]) == (reward, True, EpisodeStatus.FINISHED)
    assert r.observation == ""


def test_out_of_range_and_non_integer_guesses_are_counted_tool_errors():
    # Malformed and unknown calls in general: tests/test_environment_contract.py.
    actions = [
        "<call guess>0</call>",
        "<call guess>101</call>",
        "<call guess>4.5</call>",
        "<call guess>４２</call>",
        "<call guess></call>",
        "<call guess>1_0</call>",
        "<answer>42</answer>",
    ]
    results = _steps(GuessEnv(GuessConfig(max_turns=20)), SECRET_42, actions)
    for r in results[:-1]:
        assert r.observation.startswith("<error>") and r.observation.endswith("</error>")
        assert r.reward == 0.0 and not r.done
    assert "1..100" in results[0].observation and "in range" in results[1].observation
    last = results[-1]
    assert last.reward == 1.0 and last.done
    assert (
        last.info["malformed_calls"],
        last.info["unknown_tool_calls"],
        last.info["tool_errors"],
        last.info["tool_calls"],
    ) == (0, 0, 6, 6)


def test_out_of_turns_truncates_with_zero_reward():
    env = GuessEnv(GuessConfig(max_turns=3))
    results = _steps(env, SECRET_42, ["<call guess>1</call>"] * 3)
    assert [r.done for r in results] == [False, False, True]
    assert sum(r.reward for r in results) == 0.0
    assert results[-1].info["status"] == EpisodeStatus.TRUNCATED == "truncated"
    assert "status" not in results[0].info
    with pytest.raises(RuntimeError):  # stepping a finished episode is a caller bug
        asyncio.run(env.step("<answer>42</answer>"))
    # A correct guess on the last turn is a win, not a truncation.
    last = _steps(env, SECRET_42, ["<call guess>1</call>"] * 2 + ["<call guess>42</call>"])[-1]
    assert (last.reward, last.info["status"]) == (1.0, EpisodeStatus.FINISHED)


def test_latency_is_awaited_and_overlaps_across_episodes():
    config = GuessConfig(tool_latency="fixed:0.1")
    tasks = generate_tasks(seed=3, n=10, split="test")

    async def many():
        envs = [GuessEnv(config) for _ in tasks]
        return await asyncio.gather(*(run_episode(e, t, oracle_action) for e, t in zip(envs, tasks)))

    t0 = time.perf_counter()
    results = asyncio.run(many())
    elapsed = time.perf_counter() - t0
    turns = [last.info["turns"] for _, last in results]
    assert all(r == 1.0 for r, _ in results)
    assert all(last.info["tool_latency_s"] == pytest.approx(0.1 * n) for n, (_, last) in zip(turns, results))
    serial = 0.1 * sum(turns)  # what one-after-another would sleep, >= 10 x one episode
    assert 0.1 * max(turns) <= elapsed < 0.3 * serial, (elapsed, serial)


def test_tasks_carry_their_range_and_secret_and_splits_never_share_one():
    # Determinism, unique ids, JSON and split names: tests/test_environment_contract.py.
    def keys(split):
        return {
            (t.meta["low"], t.meta["high"], t.meta["secret"]) for s in range(3) for t in generate_tasks(s, 500, split)
        }

    train, test = keys("train"), keys("test")
    assert train and test and not train & test
    for split in ("train", "test"):
        for t in generate_tasks(0, 200, split):
            low, high, secret = t.meta["low"], t.meta["high"], t.meta["secret"]
            assert t.task_id.startswith(f"guess-{split}-")
            assert 1 <= low <= secret <= high <= 100 and high - low + 1 >= MIN_WIDTH
            assert t.prompt == f"Guess my number in {low}..{high}. " and t.target == str(secret)
            assert len(t.prompt) <= 28
    assert len(generate_tasks(0, 1000, "train")) == 1000  # what the trainer asks for
    small = generate_tasks(0, 5, "test", low=1000, high=1200)
    assert all(re.fullmatch(r"Guess my number in \d{4}\.\.\d{4}\. ", t.prompt) for t in small)
    for bad in [dict(n=-1), dict(low=5, high=4)]:
        with pytest.raises(ValueError):
            generate_tasks(**{"seed": 0, "n": 1, **bad})


def test_config_and_task_validation():
    assert GuessConfig(tool_latency="fixed:0.5").tool_latency == LatencyModel("fixed", 0.5)
    for kwargs in [
        {"max_turns": 0},
        {"max_turns": 1.5},
        {"low": 5, "high": 4},
        {"low": True},
        {"tool_latency": "slow"},
        {"tool_latency": 3},
        {"shaping": 1.0},
        {"shaping": -0.1},
        {"shaping": True},
        {"shaping": "0.5"},
        {"reply_window": 1},
        {"reply_window": "yes"},
    ]:
        with pytest.raises(ValueError):
            GuessConfig(**kwargs)
    env = GuessEnv(GuessConfig(low=1, high=50))
    for task in [
        Task("a", "p", "60"),
        Task("b", "p", "x"),
        Task("c", "p", "5", meta={"low": 1, "high": 80}),
        Task("d", "p", "5", meta={"low": "1", "high": 8}),
    ]:
        with pytest.raises(ValueError):
            asyncio.run(env.reset(task))
    with pytest.raises(RuntimeError):
        asyncio.run(GuessEnv().step("<call guess>1</call>"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds("<call guess>{}</call>".format, st.text(max_size=8)), min_size=1, max_size=8))
def test_any_guess_is_an_observation_never_an_exception(actions):
    # Any text at all, in every environment: tests/test_environment_contract.py.
    async def go():
        env = GuessEnv()
        await env.reset(SECRET_42)
        for a in actions:
            r = await env.step(a)
            assert r.observation == "" or re.fullmatch(r"<(result|error)>.*</\1>", r.observation, re.S)
            if r.done:
                return

    asyncio.run(go())


SHAPED = GuessEnv(GuessConfig(shaping=0.5))
SECRET_5_IN_16 = Task("s5", "Guess my number in 1..16. ", "5", meta={"low": 1, "high": 16})  # 4 bits


def test_shaping_pays_the_bits_a_guess_rules_out_and_a_win_sums_to_one():
    results = _steps(SHAPED, SECRET_5_IN_16, [f"<call guess>{g}</call>" for g in (8, 8, 20, 4, 6, 5)])
    # 8 leaves 1..7 (log2(16/7) of the range's 4 bits); 8 again and 20 (an error) rule out
    # nothing; 4 leaves 5..7 (log2(7/3)); 6 leaves 5..5 (log2(3)); 5 wins: the sum is 1.0.
    want = [0.5 * math.log2(b) / 4 for b in (16 / 7, 1, 1, 7 / 3, 3)]
    assert [r.reward for r in results[:5]] == pytest.approx(want)
    assert sum(r.reward for r in results) == pytest.approx(1.0)
    assert results[-1].info["found"] and SHAPED.success(sum(r.reward for r in results), results[-1].info)


def test_shaping_off_by_default_and_success_is_finding_the_number_not_the_reward():
    lost = _steps(SHAPED, SECRET_5_IN_16, [f"<call guess>{g}</call>" for g in (8, 4, 7, 7, 7, 7, 7, 7)])
    total = sum(r.reward for r in lost)
    assert lost[-1].info["status"] == EpisodeStatus.TRUNCATED and total == pytest.approx(0.5 * 3 / 4)  # 1..16 -> 5..6
    assert not SHAPED.success(total, lost[-1].info)  # held-out success ignores the shaping
    plain = _steps(GuessEnv(), SECRET_5_IN_16, [f"<call guess>{g}</call>" for g in (8, 4, 7, 7, 7, 7, 7, 7)])
    assert [r.reward for r in plain] == [0.0] * 8
    [blind] = _steps(SHAPED, SECRET_5_IN_16, ["<answer>5</answer>"])
    assert blind.reward == 1.0 and SHAPED.success(blind.reward, blind.info)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_shaped_rewards_rank_wins_above_every_loss(data):
    # Any sequence of guesses: each step's reward >= 0; a lost game sums below `shaping`
    # (and so below any win); a won game sums to exactly 1.0.
    low = data.draw(st.integers(1, 40))
    high = data.draw(st.integers(low, 60))
    secret = data.draw(st.integers(low, high))
    shaping = data.draw(st.floats(0.0, 0.99))
    guesses = data.draw(st.lists(st.integers(low - 3, high + 3), min_size=1, max_size=8))
    env = GuessEnv(GuessConfig(low=1, high=60, shaping=shaping))
    task = Task("p", "Guess. ", str(secret), meta={"low": low, "high": high})

    async def play():
        await env.reset(task)
        out = []
        for g in guesses:
            out.append(await env.step(f"<call guess>{g}</call>"))
            if out[-1].done:
                return out
        return out

    results = asyncio.run(play())
    total = sum(r.reward for r in results)
    assert all(r.reward >= 0 for r in results)
    if results[-1].info["found"]:
        assert total == pytest.approx(1.0)
    else:
        assert total <= shaping + 1e-9
