"""EngineConfig refuses bad worker settings by name, is what the pipeline's flags build,
and the CLIs offer exactly the choices the code defines."""

import dataclasses

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from core import config
from core.rl.advantages import ADVANTAGE_ESTIMATORS
from core.sections import TurnBudget
from pipelines.config import RolloutJobConfig
from pipelines.options import rollout_config
from rollout.engine_config import EngineConfig
from rollout.worker import RolloutWorker
from trainer import task
from trainer.config import LearnerJobConfig
from trainer.learning.step.losses import AGGREGATIONS, ALGORITHMS, KL_ESTIMATORS


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (dict(slots=0), "slots"),
        (dict(slots=2.0), "slots"),
        (dict(max_concurrent_groups=-1), "max_concurrent_groups"),
        (dict(request_shards=0), "request_shards"),
        (dict(commit_interval_s=0), "commit_interval_s"),
        (dict(queued_groups=-1), "queued_groups"),
        (dict(queued_groups=1.5), "queued_groups"),
        (dict(admit_poll_s=0), "admit_poll_s"),
        (dict(policy_poll_s=float("inf")), "policy_poll_s"),
        (dict(policy_wait_s=True), "policy_wait_s"),
        (dict(advantage_estimator="ppo"), "advantage_estimator"),
        (dict(decode_steps=-1), "decode_steps"),
        (dict(decode_steps=2.5), "decode_steps"),
        (dict(dtype="float16"), "dtype"),
    ],
)
def test_refuses_bad_settings_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**bad)


def test_pipeline_flags_build_the_engine_config():
    flags = [
        "--policy_root=/store",
        "--engine_slots=32",
        "--max_concurrent_groups=8",
        "--commit_interval_s=0.5",
        "--request_shards=2",
        "--max_new_tokens_per_turn=24",
        "--buckets=128,512",
        "--policy_poll_s=0.25",
        "--policy_wait_s=60",
        "--advantage_estimator=rloo",
        "--engine_decode_steps=8",
        "--engine_dtype=bfloat16",
    ]
    cfg = rollout_config(PipelineOptions(flags)).engine
    assert cfg == EngineConfig(
        slots=32,
        max_concurrent_groups=8,
        commit_interval_s=0.5,
        request_shards=2,
        turn=TurnBudget(24),
        policy_poll_s=0.25,
        policy_wait_s=60.0,
        advantage_estimator="rloo",
        decode_steps=8,
        dtype="bfloat16",
    )
    assert cfg.limits(256).max_tokens == 256 and cfg.limits(256).max_new_tokens_per_turn == 24


def _choices(parser, dest):
    return next(a.choices for a in parser._actions if a.dest == dest)


def test_cli_choices_come_from_the_constants():
    learner = config.make_parser(LearnerJobConfig)
    assert list(_choices(learner, "loss")) == list(ALGORITHMS)
    assert list(_choices(learner, "aggregation")) == list(AGGREGATIONS)
    assert list(_choices(learner, "kl_estimator")) == list(KL_ESTIMATORS)
    with pytest.raises(SystemExit):
        task.parse_config(["--requests_topic=t", "--records_subscription=s", "--policy_root=/x", "--loss=sgd"])
    opts = PipelineOptions(["--advantage_estimator=nope"])
    with pytest.raises(SystemExit):
        opts.get_all_options()
    assert sorted(ADVANTAGE_ESTIMATORS) == ["dr_grpo", "grpo", "rloo"]
    assert list(_choices(config.make_parser(RolloutJobConfig), "advantage_estimator")) == sorted(ADVANTAGE_ESTIMATORS)


def test_the_workers_take_the_store_and_the_trajectory_cap_from_the_jobs_sections():
    """Not flags of the engine, nor copies in it: the policy store is the I/O section's, the
    cap the layout's (the default: the tiny policy's context, below the largest bucket);
    the job's config refuses a turn that no longer fits a trajectory, on every path."""
    flags = {leaf.flag for leaf in config.leaves(RolloutJobConfig)}
    assert "max_tokens" not in flags and flags >= {"policy_root", "engine_slots", "telemetry_every_s"}
    assert "policy_root" not in {f.name for f in dataclasses.fields(EngineConfig)}
    cfg = config.build(
        RolloutJobConfig, policy_root="/store", buckets=(128, 512), max_trajectory_len=512, max_new_tokens_per_turn=300
    )
    assert (cfg.io.policy_root, cfg.layout.layout.trajectory_len) == ("/store", 512)
    assert config.build(RolloutJobConfig, buckets=(128, 512)).layout.layout.trajectory_len == 256
    assert config.replace(cfg, max_trajectory_len=384).layout.layout.trajectory_len == 384
    with pytest.raises(ValueError, match="max_new_tokens_per_turn"):
        config.replace(cfg, max_trajectory_len=256)  # 300 new tokens no longer fit a trajectory
    with pytest.raises(ValueError, match="max_new_tokens_per_turn"):
        config.build(RolloutJobConfig, max_new_tokens_per_turn=256)  # the default cap, 256
    assert config.parse(RolloutJobConfig, config.to_argv(cfg)) == cfg
    with pytest.raises(ValueError, match="policy_root"):
        RolloutWorker(EngineConfig(), None, 256)  # a worker without a store is refused
