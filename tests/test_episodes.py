"""Episode limits and outcomes in run_group: every episode ends with a recorded status."""

import asyncio
import time

import numpy as np
import pytest

import environments
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sampling.sampler import Sampler
from core.policy.text import tokenizer
from environments import Environment, EpisodeStatus, StepResult, Task
from rollout.engine import InferenceEngine
from rollout.episodes import EpisodeLimits, run_group

CFG = ModelConfig(max_seq_len=128)
TASK = Task("t-1", "Compute 1+2. ", "3", {"expression": "1+2"})


class SlowEnv(Environment):
    """A tool that takes `delay` seconds to answer."""

    def __init__(self, delay: float):
        self.delay = delay

    async def reset(self, task):
        return task.prompt

    async def step(self, action_text):
        await asyncio.sleep(self.delay)
        return StepResult("<result>ok</result>", 0.0, False, {})


class BrokenEnv(SlowEnv):
    async def step(self, action_text):
        raise RuntimeError("environment bug")


@pytest.fixture(scope="module")
def sampler_and_params():
    sampler = Sampler(CFG, slots=4, length=128)
    params = split_params(init_model(CFG, seed=0))[1]
    sampler.warmup(params)
    return sampler, params


def _run(sampler_and_params, envs, limits, rid="r"):
    sampler, params = sampler_and_params
    engine = InferenceEngine(sampler, lambda: (params, 7), max_tokens=limits.max_tokens)
    return asyncio.run(run_group(engine, envs, TASK, rid, limits))


def test_step_timeout_ends_episode_with_timeout_status(sampler_and_params):
    limits = EpisodeLimits(max_new_tokens_per_turn=4, max_tokens=128, step_timeout_s=0.2)
    t0 = time.monotonic()
    trajs = _run(sampler_and_params, [SlowEnv(5.0), SlowEnv(5.0)], limits)
    assert time.monotonic() - t0 < 3.0
    assert [t.status for t in trajs] == [EpisodeStatus.TIMEOUT.value] * 2
    assert all(t.reward == 0.0 and t.advantage == 0.0 for t in trajs)


def test_episode_timeout_bounds_the_whole_episode(sampler_and_params):
    limits = EpisodeLimits(max_new_tokens_per_turn=2, max_tokens=128, step_timeout_s=10, episode_timeout_s=0.5)
    t0 = time.monotonic()
    trajs = _run(sampler_and_params, [SlowEnv(0.2)], limits)
    assert time.monotonic() - t0 < 3.0
    assert trajs[0].status == EpisodeStatus.TIMEOUT.value and trajs[0].num_turns >= 2


def test_env_exception_is_env_error_not_a_crash(sampler_and_params):
    limits = EpisodeLimits(max_new_tokens_per_turn=4, max_tokens=128)
    trajs = _run(sampler_and_params, [BrokenEnv(0), SlowEnv(0)], limits)
    assert trajs[0].status == EpisodeStatus.ENV_ERROR.value
    assert trajs[1].status != EpisodeStatus.ENV_ERROR.value


def test_token_budget_truncates_and_trajectory_is_consistent(sampler_and_params):
    limits = EpisodeLimits(max_new_tokens_per_turn=8, max_tokens=40)
    envs = [environments.make("calculator", max_turns=20) for _ in range(4)]
    for t in _run(sampler_and_params, envs, limits):
        assert len(t) <= 40
        assert t.status == EpisodeStatus.TRUNCATED.value
        assert t.tokens[0] == tokenizer.BOS and t.loss_mask[0] == 0
        gen = t.loss_mask == 1
        assert np.all(t.policy_versions[gen] == 7) and np.all(t.policy_versions[~gen] == -1)
        assert np.all(t.behaviour_logprobs[gen] < 0) and np.all(t.behaviour_logprobs[~gen] == 0)
        assert t.trajectory_id.startswith("r/")


def test_group_advantages_follow_rewards(sampler_and_params):
    """An oracle-scripted env mix: the advantage sign follows the reward within the group."""

    class Scripted(SlowEnv):
        def __init__(self, reward):
            super().__init__(0)
            self.reward = reward

        async def step(self, action_text):
            return StepResult("", self.reward, True, {"status": EpisodeStatus.FINISHED})

    limits = EpisodeLimits(max_new_tokens_per_turn=3, max_tokens=128)
    trajs = _run(sampler_and_params, [Scripted(1.0), Scripted(0.0), Scripted(0.0), Scripted(1.0)], limits)
    assert [t.reward for t in trajs] == [1.0, 0.0, 0.0, 1.0]
    np.testing.assert_allclose([t.advantage for t in trajs], [1, -1, -1, 1], atol=1e-4)
    assert all(t.status == "finished" for t in trajs)
