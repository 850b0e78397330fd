"""The capacity planner on this machine (real environment, engine, packer and learner, a
short run), starting RL from a published policy, and pinning children to cores."""

import os
import sys

import jax
import numpy as np
import pytest

from core import config
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from localstack.launch import plan
from localstack.launch.processes import ProcessGroup
from tests._learner_data import random_record
from trainer.config import LearnerJobConfig
from trainer.learning import builder
from trainer.learning.step.learner import Learner, LearnerConfig


def test_the_planner_measures_and_writes_settings_the_jobs_accept(tmp_path):
    cfg = config.build(
        plan.PlanConfig,
        tool_latency="fixed:0.05",
        episodes=8,
        learner_steps=1,
        batch_records=2,
        engine_slots=8,
        max_concurrent_groups=2,
        rollout_measure_s=1.0,
    )
    r = plan.run(cfg)
    env, m = r["measured"]["environment"], r["measurements"]
    assert env["tool_calls_per_episode"] >= 1  # the calculator oracle calls its tool
    assert m["episode_s"] >= 0.05 * env["tool_calls_per_episode"]  # at least the tool waits
    assert 1 <= m["trajectories_per_record"] <= 4 * 4 and 0 < r["measured"]["learner"]["fill"] <= 1  # rows x segments
    g = cfg.group_size  # whole groups, never below the floor (2 records x 4 rows x 4 segments + a group)
    assert r["plan"]["max_in_flight"] % g == 0 and r["plan"]["max_in_flight"] >= 2 * 4 * 4 + g
    # The rate planned with is whole groups of episodes, not the engine's tokens alone.
    assert r["rollout_rate_source"].startswith("episodes (initial")
    assert m["rollout_rate"] == r["measured"]["rollout"]["trajectories_per_s"] > 0
    assert r["engine_only_rate"] > 0
    # The flags parse in the jobs that take them.
    from pipelines.options import RolloutOptions
    from trainer.task import parse_config as learner_config

    base = ["--requests_topic=t", "--records_subscription=s", "--policy_root=/x"]
    # With the run-wide settings the plan was made for, as the demo gives them: a learner with
    # its default 4 records a step needs a bigger window than a plan for 2 provides.
    run_wide = [f"--batch_records={cfg.batch_records}", f"--group_size={cfg.group_size}"]
    learner = learner_config([*base, *run_wide, *r["learner_flags"]])
    assert learner.credits.max_in_flight == r["plan"]["max_in_flight"]
    assert learner.staleness.max_staleness == r["plan"]["max_staleness"]
    opts = RolloutOptions(r["pipeline_flags"])
    assert opts.max_concurrent_groups == r["plan"]["max_concurrent_groups"]
    assert any("bound by" in line for line in plan.describe(r))


def test_rl_starts_from_a_published_policy_instead_of_a_warm_start(tmp_path):
    src = Learner(ModelConfig(), LearnerConfig(batch_records=1, seed=7))
    PolicyStore(tmp_path / "store").publish(0, jax.tree.map(np.asarray, src.params_dict()))
    dst = Learner(ModelConfig(), LearnerConfig(batch_records=1, seed=0))
    job = dict(requests_topic="t", records_subscription="s", policy_root=str(tmp_path / "out"), env="calculator")
    cfg = config.build(LearnerJobConfig, **job, warmstart_steps=5, init_policy=str(tmp_path / "store"))
    start = builder.restore_or_initialise(dst, None, cfg)  # no warm start: --init_policy comes first
    assert start.warmstart_s < 5  # no warm start ran
    got, want = jax.tree.leaves(dst.params_dict()), jax.tree.leaves(src.params_dict())
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want))
    for seed in range(3):  # loaded params train like initial ones: one compile, not one per step
        dst.train_step([random_record(seed, rows=2, seq_len=64)])
    assert dst.compiled_variants() == 1
    with pytest.raises(ValueError, match="no complete policy"):
        builder.restore_or_initialise(dst, None, config.replace(cfg, init_policy=str(tmp_path / "empty")))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_pinned_child_runs_on_its_cores_only(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    with ProcessGroup([sys.executable, "-c", code], tmp_path / "log", cpus={cpu}) as p:
        p.proc.wait(timeout=30)
    assert (tmp_path / "log").read_text().strip() == f"[{cpu}]"
