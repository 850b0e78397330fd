"""The contract every registered environment keeps, plugins included.

Each check runs on every name in the registry at collection time plus a plugin found
through its entry point (tests/_plugin_env.py, installed in-process), so a new environment
is held to it without a line here. What an environment does beyond it (the calculator's
arithmetic, the code sandbox, the guessing game's feedback) is in its own test file.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import environments
from environments import Environment, EpisodeStatus, StepResult, Task, datasets
from tests import _plugin_env

ENVS = sorted({*environments.names(), _plugin_env.NAME})
# Every environment's reward is a success score (docs/ENVIRONMENTS.md): 1 for a solved
# task, a fraction for a partly solved one. Each step's reward and the episode's sum lie here.
REWARD_RANGE = (0.0, 1.0)
MAX_STEPS = 64  # an episode still running after this many turns never ends
ENDED_BY_ENV = {EpisodeStatus.FINISHED, EpisodeStatus.TRUNCATED}  # timeout, env_error: the driver's
TAGGED = re.compile(r"<(result|error)>.*</\1>", re.S)
UNKNOWN = "<call no_such_tool>1</call>"
MALFORMED = ["", "hello", "<call", "<call >1</call>", "<call 9x>1</call>", "<answer>1", "<call x>1", UNKNOWN]

pytestmark = pytest.mark.parametrize("name", ENVS)


@pytest.fixture(scope="module", autouse=True)
def plugin(tmp_path_factory):
    with _plugin_env.installed(tmp_path_factory.mktemp("plugin")) as loaded:
        assert loaded == [_plugin_env.NAME]
        yield


def check_result(r) -> StepResult:
    """The types the episode loop (rollout/episodes.py) relies on, and the reward's range."""
    assert isinstance(r, StepResult), type(r)
    assert isinstance(r.observation, str) and isinstance(r.info, dict)
    assert isinstance(r.done, bool)
    assert type(r.reward) is float and math.isfinite(r.reward), r.reward
    assert REWARD_RANGE[0] <= r.reward <= REWARD_RANGE[1], r.reward
    assert r.observation == "" or TAGGED.fullmatch(r.observation), r.observation
    if r.done:
        assert r.info.get("status") in ENDED_BY_ENV, r.info
    return r


async def _episode(env: Environment, task: Task, policy) -> tuple[float, list[StepResult]]:
    prompt = await env.reset(task)
    assert isinstance(prompt, str) and task.prompt in prompt
    observations, results = [prompt], []
    for _ in range(MAX_STEPS):
        results.append(check_result(await env.step(policy(task, observations))))
        observations.append(results[-1].observation)
        if results[-1].done:
            total = sum(r.reward for r in results)
            assert REWARD_RANGE[0] <= total <= REWARD_RANGE[1], total
            return total, results
    raise AssertionError(f"no end after {MAX_STEPS} steps")


def episode(name: str, task: Task, policy) -> tuple[float, list[StepResult]]:
    return asyncio.run(_episode(environments.make(name), task, policy))


def test_make_gives_an_environment(name):
    assert isinstance(environments.make(name), Environment)


def test_tasks_are_deterministic_for_a_seed_and_the_splits_disjoint(name):
    train = environments.make_tasks(name, 7, 50, "train")
    assert train == environments.make_tasks(name, 7, 50, "train")
    assert train != environments.make_tasks(name, 8, 50, "train")
    test = environments.make_tasks(name, 7, 20, "test")
    assert len({t.task_id for t in train + test}) == 70
    # Disjoint as tasks (guess's prompts repeat across splits; its secrets do not).
    assert not {(t.prompt, t.target) for t in train} & {(t.prompt, t.target) for t in test}
    for t in train + test:
        assert isinstance(t, Task) and t.prompt
        assert Task.from_json_dict(json.loads(json.dumps(t.to_json_dict()))) == t
    with pytest.raises(ValueError):
        environments.make_tasks(name, 0, 1, "validation")


@pytest.mark.filterwarnings("ignore:label\\(\\) is deprecated:DeprecationWarning")
def test_the_dataset_builds_and_reads_back_the_generators_tasks(name, tmp_path):
    datasets.build(name, tmp_path, train_size=12, test_size=6, seed=3)
    for split, n in (("train", 12), ("test", 6)):
        assert list(datasets.load_tasks(name, split, tmp_path)) == environments.make_tasks(name, 3, n, split)


def test_malformed_calls_are_error_observations_not_exceptions(name):
    task = environments.make_tasks(name, 0, 1, "test")[0]
    for action in MALFORMED:
        env = environments.make(name)
        asyncio.run(env.reset(task))
        r = check_result(asyncio.run(env.step(action)))
        assert r.observation.startswith("<error>") and r.reward == 0.0 and not r.done, (action, r)
        if "malformed_calls" in r.info:  # an environment that counts them tells the two apart
            unknown = action == UNKNOWN
            assert (r.info["malformed_calls"], r.info["unknown_tool_calls"]) == (int(not unknown), int(unknown))


@settings(max_examples=30, deadline=None)
@given(actions=st.lists(st.text(max_size=40), min_size=1, max_size=8))
def test_any_text_is_an_observation_never_an_exception(name, actions):
    task = environments.make_tasks(name, 0, 1, "train")[0]
    episode(name, task, lambda t, observations: actions[min(len(observations) - 1, len(actions) - 1)])


def test_a_garbage_policy_ends_every_episode_truncated_with_no_reward(name):
    rng = random.Random(0)

    def garbage(task, observations):
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40)))

    totals = []
    for task in environments.make_tasks(name, 2, 20, "train"):
        total, results = episode(name, task, garbage)
        last = results[-1]
        assert last.info["status"] == EpisodeStatus.TRUNCATED, last.info
        if "malformed_calls" in last.info:  # an environment that counts them counts each
            assert last.info["malformed_calls"] == len(results)
        totals.append(total)
    assert sum(totals) / len(totals) < 0.1


def test_the_oracle_solves_test_tasks(name):
    try:
        oracle = environments.oracle(name)
    except KeyError:
        pytest.skip(f"{name} registers no oracle")
    for task in environments.make_tasks(name, 1, 5, "test"):
        total, results = episode(name, task, oracle)
        assert total == 1.0 and results[-1].info["status"] == EpisodeStatus.FINISHED, (task, results[-1])
