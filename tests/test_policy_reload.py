"""Rollout workers' policy reload against a real on-disk store."""

import asyncio

import jax
import numpy as np
import pytest
from flax import nnx

import environments
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sampling.sampler import Sampler
from rollout.engine import InferenceEngine
from rollout.episodes import EpisodeLimits, run_group
from rollout.policy_poller import PolicyHandle

CFG = ModelConfig(max_seq_len=128)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def params_dict(seed):
    return nnx.to_pure_dict(split_params(init_model(CFG, seed))[1])


def leaves_equal(state, pure):
    a, b = jax.tree.leaves(nnx.to_pure_dict(state)), jax.tree.leaves(pure)
    return len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


@pytest.fixture
def setup(tmp_path):
    store = PolicyStore(str(tmp_path / "store"))
    sampler = Sampler(CFG, slots=2, length=128)
    clock = Clock()
    handle = PolicyHandle(store, sampler.abstract_params, poll_interval_s=1.0, clock=clock)
    return store, sampler, handle, clock


def test_waits_for_first_version_then_loads_it(setup):
    store, _, handle, _ = setup
    with pytest.raises(TimeoutError, match="no policy version"):
        handle.wait_for_first(timeout_s=0.3, sleep_s=0.05)
    store.publish(0, params_dict(0))
    handle.wait_for_first(timeout_s=5)
    assert handle.version == 0 and leaves_equal(handle.params, params_dict(0))


def test_reload_respects_interval_and_skips_half_written(setup):
    store, _, handle, clock = setup
    store.publish(0, params_dict(0))
    handle.wait_for_first(timeout_s=5)
    store.publish(1, params_dict(1))
    clock.t += 0.5
    assert not handle.maybe_reload() and handle.version == 0  # polled too recently
    clock.t += 1.0
    assert handle.maybe_reload() and handle.version == 1 and leaves_equal(handle.params, params_dict(1))
    # A crash after writing version 2's data but before LATEST: never loaded.
    store._write_version(2, params_dict(2))
    clock.t += 5
    assert not handle.maybe_reload() and handle.version == 1
    assert leaves_equal(handle.params, params_dict(1))


def test_failed_load_keeps_current_version_and_is_counted(setup):
    store, _, handle, clock = setup
    store.publish(0, params_dict(0))
    handle.wait_for_first(timeout_s=5)
    store._write_pointer(3)  # LATEST names a version whose data never arrived
    clock.t += 5
    assert not handle.maybe_reload()
    assert handle.version == 0 and handle.failed_loads == 1
    assert leaves_equal(handle.params, params_dict(0))


def test_policy_swap_changes_version_on_new_tokens(setup):
    store, sampler, handle, clock = setup
    store.publish(0, params_dict(0))
    handle.wait_for_first(timeout_s=5)
    task = environments.generate_tasks(0, 1, "test")[0]
    limits = EpisodeLimits(max_new_tokens_per_turn=8, max_tokens=128)

    def group(rid):
        envs = [environments.make("calculator", max_turns=2) for _ in range(2)]
        engine = InferenceEngine(sampler, lambda: (handle.params, handle.version))
        return asyncio.run(run_group(engine, envs, task, rid, limits))

    before = group("r0")
    store.publish(1, params_dict(1))
    clock.t += 5
    assert handle.maybe_reload()
    after = group("r1")
    for traj, version in [(t, 0) for t in before] + [(t, 1) for t in after]:
        gen = traj.loss_mask == 1
        assert gen.any()
        assert set(traj.policy_versions[gen].tolist()) == {version}
        assert set(traj.policy_versions[~gen].tolist()) == {-1}
