"""The planner's rollout rate: whole groups of real episodes through a rollout worker's
engine (localstack/launch/plan_rollout.py), and the arithmetic of its window."""

import jax
import numpy as np
import pytest
from flax import nnx

from core import config
from core.contracts.record_shape import LayoutConfig
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sources import policy_spec
from core.sections import EnvChoice
from localstack.launch import plan_rollout
from localstack.launch.plan import synthetic_trajectory
from rollout.engine_config import EngineConfig

MAX_TOKENS = LayoutConfig().layout.trajectory_len


def _group(tag: str, n: int = 4):
    return [synthetic_trajectory(tag, i, 40) for i in range(n)]


def test_the_rate_counts_the_groups_that_end_after_the_first_over_the_time_since_it_ended():
    ends = [(0.0, []), (2.0, _group("a")), (3.0, _group("b")), (5.0, _group("c")), (6.0, None)]
    r = plan_rollout._summary(ends, group_size=4)
    # The first group's end opens the window (the engine is full from then): b and c, 8 in 4 s.
    assert r["trajectories_per_s"] == pytest.approx(8 / 4) and r["window_s"] == 4.0 and r["groups"] == 3
    assert r["turns_per_episode"] == 0 and r["tokens_per_episode"] == 40
    assert r["reward"] == pytest.approx(0.5)  # synthetic samples alternate 0 and 1


def test_with_fewer_than_two_groups_the_rate_is_over_the_whole_time():
    r = plan_rollout._summary([(1.0, []), (3.0, _group("a")), (5.0, None)], group_size=4)
    assert r["trajectories_per_s"] == pytest.approx(4 / 4) and r["groups"] == 1
    assert plan_rollout._summary([(1.0, []), (5.0, None)], 4)["trajectories_per_s"] == 0.0


def test_whole_groups_run_through_the_engine_with_the_real_environment_and_its_tool_latency(tmp_path):
    spec = policy_spec(None, "tiny")
    engine = config.build(EngineConfig, engine_slots=8, max_concurrent_groups=2)
    env = EnvChoice(tool_latency="fixed:0.05")
    r = plan_rollout.measure_rollout(spec, engine, env, group_size=4, max_tokens=MAX_TOKENS, measure_s=1.0)
    # It stops once measure_s has passed since the first group's end and two groups have ended.
    assert r["policy"].startswith("initial") and r["groups"] >= 2 and r["window_s"] >= 1.0
    assert r["trajectories_per_s"] > 0 and r["turns_per_episode"] >= 1
    # Each episode ran in the real environment: its turns were model turns, each at most the budget.
    assert 0 < r["generated_per_episode"] <= r["turns_per_episode"] * engine.turn.max_new_tokens_per_turn
    assert r["tokens_per_episode"] <= MAX_TOKENS


def test_the_episodes_serve_a_stores_newest_version_when_given(tmp_path):
    _, params = split_params(init_model(ModelConfig(), 3))
    PolicyStore(tmp_path / "store").publish(0, jax.tree.map(np.asarray, nnx.to_pure_dict(params)))
    spec = policy_spec(None, "tiny")
    engine = config.build(EngineConfig, engine_slots=8, max_concurrent_groups=2)
    r = plan_rollout.measure_rollout(
        spec,
        engine,
        EnvChoice(),
        group_size=4,
        max_tokens=MAX_TOKENS,
        measure_s=0.5,
        policy_root=str(tmp_path / "store"),
    )
    assert r["policy"].endswith("v0") and r["groups"] >= 1
    with pytest.raises(ValueError, match="no policy version"):
        plan_rollout.measure_rollout(spec, engine, EnvChoice(), 4, MAX_TOKENS, 0.5, policy_root=str(tmp_path / "empty"))
