"""CodeEnv end to end through the real sandbox: oracle, garbage, partial and hostile code."""

import asyncio
import json

import pytest

from environments import sandbox as S
from environments.base import EpisodeStatus, Task
from environments.code import CodeConfig, CodeEnv, generate_tasks, oracle_action, score_harness_output
from environments.sandbox import SandboxLimits

pytestmark = pytest.mark.skipif(S.BWRAP_PATH is None, reason="bubblewrap is not installed")
QUICK = CodeConfig(sandbox=SandboxLimits(cpu_seconds=1, wall_seconds=2))
# f(x) = x+1 on five fixed inputs: 3 positive, 2 negative.
ADD1 = Task(
    "add1",
    "Write f(x): return x+1. ",
    "def f(x): return x+1",
    meta={
        "func": "f",
        "reference": "def f(x): return x+1",
        "tests": [{"args": [a], "expected": a + 1} for a in (1, 2, 3, -1, -2)],
    },
)


async def episode(env, task, policy):
    await env.reset(task)
    observations, total = [], 0.0
    while True:
        result = await env.step(policy(task, observations))
        total += result.reward
        observations.append(result.observation)
        if result.done:
            return total, result, observations


def submit(code: str, config: CodeConfig = QUICK, task: Task = ADD1):
    total, last, _ = asyncio.run(episode(CodeEnv(config), task, lambda t, obs: f"<answer>{code}</answer>"))
    assert last.done and last.info["status"] == EpisodeStatus.FINISHED
    return total, last.info


def test_oracle_solves_every_test_task():
    tasks = generate_tasks(seed=3, n=20, split="test")

    async def main():
        return await asyncio.gather(*[episode(CodeEnv(), t, oracle_action) for t in tasks])

    for task, (reward, last, observations) in zip(tasks, asyncio.run(main())):
        assert reward == 1.0, (task, last.info)
        want = task.meta["tests"][0]["expected"]
        assert observations[0] == f"<result>{want}</result>"  # `run` showed the output
        assert last.info["sandbox_status"] == "ok" and last.info["tests_passed"] == 5
        assert (last.info["tool_calls"], last.info["turns"]) == (1, 2)


@pytest.mark.parametrize(
    "code, reward",
    [
        ("def f(x): return x+1", 1.0),
        ("def f(x): return x+1 if x > 0 else x", 0.6),
        ("def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return x+1", 0.6),
        ("def f(x): return [x+1][0] if x > 2 else str(x+1)", 0.2),  # '2' is not 2
        ("def f(x): return True if x == -2 else x+1", 0.8),  # True is not -1
        ("def f(x): return float(x+1)", 0.0),  # 2.0 is not 2
        ("def g(x): return x+1", 0.0),
        ("def f(x): return x+1\nprint('noise')\nimport os; os.write(1, b'more noise')", 1.0),
    ],
)
def test_reward_is_the_fraction_of_hidden_tests_passed(code, reward):
    total, info = submit(code)
    assert total == pytest.approx(reward) and info["tests_passed"] == round(5 * reward)
    assert info["tests_total"] == 5


FORGE_ALL = """
import __main__, json, os
for i in range(5):  # claim an output for every test, then stop the harness
    line = __main__.nonce + json.dumps({"i": i, "out": "PASSED"}) + "\\n"
    os.write(__main__.out, line.encode())
os.write(__main__.out, (__main__.nonce + json.dumps({"done": 5}) + "\\n").encode())
os._exit(0)
"""
FORGE_DUP = (
    'import __main__, os\nos.write(__main__.out, (__main__.nonce + \'{"i": 0, '
    '"out": 2}\\n\').encode())\ndef f(x): return x+1'
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "code, status, problem",
    [
        ("while True:\n    pass", "timeout", None),
        ("def f(x):\n    while True:\n        pass", "timeout", None),
        ("import time\ntime.sleep(100)", "timeout", None),
        ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "timeout", None),
        ("x = bytearray(10**10)", "ok", "load error MemoryError"),
        ("import ctypes\nctypes.string_at(0)", "killed", None),
        ("while True:\n    print('x' * 10000)", "output_limit", None),
        ('print(\'{"i": 0, "out": 2}\')\nprint("ALL TESTS PASSED")\ndef f(x): return -100', "ok", ""),
        (FORGE_ALL, "ok", ""),
        (FORGE_DUP, "ok", "forged or duplicate result"),
        ("import sys\nsys.exit(0)\ndef f(x): return x+1", "ok", "load error SystemExit"),
        ("import os\nos._exit(0)", "ok", "harness did not finish"),
        ("raise RuntimeError('boom')", "ok", "load error RuntimeError"),
        ("def f(x):\n    import sys\n    sys.exit(0)", "ok", ""),
        ("class A:\n    def __eq__(self, o): return True\ndef f(x): return A()", "ok", ""),
    ],
)
def test_hostile_submissions_get_no_credit_and_a_status(code, status, problem):
    total, info = submit(code)
    assert total == 0.0 and info["tests_passed"] == 0
    assert info["sandbox_status"] == status
    if problem is not None:
        assert info.get("harness_error", "") == problem


def test_run_shows_output_errors_and_sandbox_status():
    actions = [
        "<call run>print(2+3)</call>",
        "<call run>print(1)\n1/0</call>",
        "<call run>while True: pass</call>",
        "<answer>def f(x): return x+1</answer>",
    ]
    total, last, obs = asyncio.run(episode(CodeEnv(QUICK), ADD1, lambda t, o: actions[len(o)]))
    assert obs[:3] == [
        "<result>5</result>",
        "<result>1\nZeroDivisionError: division by zero</result>",
        "<error>timeout</error>",
    ]
    assert total == 1.0 and last.info["tool_calls"] == 3 and last.info["tool_errors"] == 1
    assert last.info["sandbox_s"] > 0


def test_oversized_code_is_a_counted_tool_error_and_a_rejected_answer():
    # Malformed and unknown calls in general: tests/test_environment_contract.py.
    cfg = CodeConfig(max_turns=2, max_code_chars=50)
    actions = ["<call run>" + "#" * 51 + "</call>", "<call run>" + "#" * 50 + "</call>"]
    total, last, obs = asyncio.run(episode(CodeEnv(cfg), ADD1, lambda t, o: actions[len(o)]))
    assert obs[0].startswith("<error>") and obs[1] == "<result></result>"
    assert total == 0.0 and last.info["status"] == EpisodeStatus.TRUNCATED
    assert (last.info["tool_calls"], last.info["tool_errors"]) == (2, 1)
    total, info = submit("#" * 51, cfg)
    assert total == 0.0 and info["sandbox_status"] == "rejected"


def test_scoring_trusts_only_tagged_lines_and_the_host_expectations():
    n = "N" * 32
    line = lambda obj: n + json.dumps(obj)
    ok = "\n".join([line({"i": 0, "out": 1}), line({"i": 1, "error": "X"}), line({"done": 2})])
    assert score_harness_output(ok, n, [1, 2]) == (1, "")
    assert score_harness_output("hi\n" + ok, n, [1, 2]) == (0, "untagged output")
    assert score_harness_output(ok + "\n" + line({"i": 0, "out": 1}), n, [1, 2])[0] == 0
    assert score_harness_output(line({"i": 0, "out": 1}), n, [1]) == (0, "harness did not finish")


def test_tasks_are_short_and_splits_never_share_a_prompt_across_seeds():
    # Determinism, unique ids, JSON and split names: tests/test_environment_contract.py.
    train = generate_tasks(seed=0, n=1000, split="train")
    test = generate_tasks(seed=0, n=50, split="test")
    assert not {t.prompt for t in train} & {t.prompt for t in generate_tasks(7, 200, "test")}
    assert max(len(t.prompt) for t in train + test) <= 48  # a tiny byte-level model reads it


def test_config_validates_and_accepts_specs():
    cfg = CodeConfig(tool_latency="fixed:0.01", sandbox={"wall_seconds": 1})
    assert cfg.tool_latency.seconds == 0.01 and cfg.sandbox.wall_seconds == 1
    for bad in [
        dict(max_turns=0),
        dict(max_code_chars=True),
        dict(sandbox=3),
        dict(tool_latency=1.0),
        dict(sandbox={"cpu_seconds": 0}),
        dict(max_code_chars=10**6),
    ]:
        with pytest.raises(ValueError):
            CodeConfig(**bad)
