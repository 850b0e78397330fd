"""Held-out evaluation counts why episodes fail, and success is the environment's own
criterion (code: every hidden test passes), never a shaped or partial reward."""

import asyncio
import dataclasses

import pytest

import environments
from core.policy.text.tokenizer import BYTE_TOKENIZER
from environments import code, datasets, guess
from rollout.engine import Sequence
from rollout.scoring import FAILURES, failure_class, failure_examples, summarize


@dataclasses.dataclass
class Outcome:
    reward: float = 0.0
    status: str = "finished"
    turns: int = 1
    info: dict = dataclasses.field(default_factory=dict)


@pytest.mark.parametrize(
    "outcome, want",
    [
        (Outcome(status="timeout", info={"tool_calls": 1}), "timeout"),
        (Outcome(status="env_error"), "env_error"),
        (Outcome(info={"tool_calls": 1, "sandbox_status": "timeout"}), "sandbox_error"),
        (Outcome(status="truncated", info={"tool_calls": 4}), "truncated"),
        (Outcome(info={"tool_calls": 1, "malformed_calls": 1}), "bad_call"),
        (Outcome(info={"unknown_tool_calls": 1}), "bad_call"),
        (Outcome(info={"tool_calls": 0}), "no_call"),
        (Outcome(info={"tool_calls": 2}), "wrong_answer"),
    ],
)
def test_each_failure_has_one_class(outcome, want):
    assert want in FAILURES and failure_class(outcome, False) == want
    assert failure_class(outcome, True) == "success"


def test_summary_counts_every_episode_once_by_the_environments_criterion():
    outs = [Outcome(1.0), Outcome(0.6, info={"tool_calls": 1}), Outcome(status="truncated")]
    full_only = lambda reward, info: reward >= 1.0
    s = summarize(outs, full_only)
    assert s["success"] == pytest.approx(1 / 3) and s["mean_reward"] == pytest.approx(1.6 / 3)
    assert s["outcomes"] == {"success": 1, "wrong_answer": 1, "truncated": 1}
    assert summarize(outs)["success"] == pytest.approx(2 / 3)  # default: any reward


def _episode(prompt: str, written: str, **kw) -> Outcome:
    o = Outcome(**kw)
    o.seq = Sequence.start(BYTE_TOKENIZER.encode(prompt))
    o.seq.tokens += BYTE_TOKENIZER.encode(written)
    o.seq.loss_mask += [1] * len(written.encode())
    return o


def test_failure_examples_keep_what_the_model_wrote_up_to_k_a_class_and_no_success():
    outs = [
        _episode("Q1", "<call calc>2+</call>", info={"tool_calls": 1, "malformed_calls": 1}),
        _episode("Q2", "<call calc>((</call>", info={"tool_calls": 1, "malformed_calls": 1}),
        _episode("Q3", "<call calc>9*</call>", info={"tool_calls": 1, "malformed_calls": 1}),
        _episode("Q4", "it is 5", info={"tool_calls": 0}),
        _episode("Q5", "42", reward=1.0, info={"tool_calls": 1}),
    ]
    tasks = [environments.Task(f"t{i}", f"Q{i}", str(i)) for i in range(1, 6)]
    ex = failure_examples(outs, tasks, None, BYTE_TOKENIZER, 2)
    assert {k: [(e["prompt"], e["target"], e["text"]) for e in v] for k, v in ex.items()} == {
        "bad_call": [("Q1", "1", "<call calc>2+</call>"), ("Q2", "2", "<call calc>((</call>")],
        "no_call": [("Q4", "4", "it is 5")],
    }
    assert [e["text"] for e in failure_examples(outs, tasks, None, BYTE_TOKENIZER, 1)["bad_call"]] == [
        "<call calc>2+</call>"
    ]


TASK = code.generate_tasks(0, 1, "test")[0]


def _grade(submission: str) -> tuple[float, dict]:
    env = code.CodeEnv()

    async def run():
        await env.reset(TASK)
        result = await env.step(f"<answer>{submission}</answer>")
        return result.reward, result.info

    return asyncio.run(run())


def test_code_success_is_every_hidden_test_passing_not_partial_credit():
    reward, info = _grade(TASK.meta["reference"])
    assert reward == 1.0 and code.CodeEnv().success(reward, info)
    # a constant function passes the hidden tests that expect that constant only
    reward, info = _grade(f"def f(*a): return {TASK.meta['tests'][0]['expected']!r}")
    assert 0 < reward < 1 and not code.CodeEnv().success(reward, info), (reward, info, TASK)


def test_tasks_are_drawn_as_the_environment_is_set_up():
    tasks = environments.make_tasks("guess", 0, 64, "test", {"high": 31, "max_turns": 5, "tool_latency": "none"})
    assert all(1 <= t.meta["low"] <= t.meta["high"] <= 31 for t in tasks)
    assert environments.make_tasks("guess", 0, 8, "test") == guess.generate_tasks(0, 8, "test")
    assert environments.registry.task_settings("guess", {"high": 31, "max_turns": 5}) == {"high": 31}
    assert environments.registry.task_settings("code", {"max_turns": 3}) == {}


def test_a_dataset_of_another_range_is_another_dataset(tmp_path):
    narrow = {"high": 31}
    datasets.build("guess", tmp_path, train_size=16, test_size=8, env_config=narrow)
    tasks = list(datasets.load_tasks("guess", "test", tmp_path))
    assert tasks == guess.generate_tasks(0, 8, "test", high=31)
    datasets.build("guess", tmp_path, train_size=16, test_size=8, env_config={**narrow, "max_turns": 5})  # same
    with pytest.raises(ValueError, match="different"):
        datasets.build("guess", tmp_path, train_size=16, test_size=8)  # 1..100: not what is there
