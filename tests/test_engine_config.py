"""EngineConfig refuses bad worker settings by name, is what the pipeline's flags build,
and the CLIs offer exactly the choices the code defines."""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from core import config
from core.rl.advantages import ADVANTAGE_ESTIMATORS
from core.sections import TurnBudget
from pipelines.config import RolloutJobConfig
from pipelines.options import rollout_config
from rollout.engine_config import EngineConfig
from trainer import task
from trainer.config import LearnerJobConfig
from trainer.learning.step.losses import AGGREGATIONS, ALGORITHMS, KL_ESTIMATORS


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (dict(policy_root=""), "policy_root"),
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
        (dict(turn=TurnBudget(256), max_tokens=256), "max_new_tokens_per_turn"),
        (dict(advantage_estimator="ppo"), "advantage_estimator"),
        (dict(decode_steps=-1), "decode_steps"),
        (dict(decode_steps=2.5), "decode_steps"),
        (dict(dtype="float16"), "dtype"),
    ],
)
def test_refuses_bad_settings_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{"policy_root": "/store", **bad})


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
        policy_root="/store",
        slots=32,
        max_concurrent_groups=8,
        commit_interval_s=0.5,
        request_shards=2,
        turn=TurnBudget(24),
        max_tokens=256,  # the default trajectory cap (the tiny policy's context), below the largest bucket
        policy_poll_s=0.25,
        policy_wait_s=60.0,
        advantage_estimator="rloo",
        decode_steps=8,
        dtype="bfloat16",
    )
    assert cfg.limits.max_tokens == 256 and cfg.limits.max_new_tokens_per_turn == 24
    assert rollout_config(PipelineOptions([*flags, "--max_trajectory_len=512"])).engine.max_tokens == 512


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


def test_the_job_derives_the_engines_store_and_trajectory_cap():
    """Not flags: the policy store comes from the I/O section, the cap from the layout, on
    every path that builds or changes the tree."""
    flags = {leaf.flag for leaf in config.leaves(RolloutJobConfig)}
    assert "max_tokens" not in flags and flags >= {"policy_root", "engine_slots", "telemetry_every_s"}
    cfg = config.build(
        RolloutJobConfig, policy_root="/store", buckets=(128, 512), max_trajectory_len=512, max_new_tokens_per_turn=300
    )  # built with the derived cap: not refused against the default one
    assert (cfg.engine.policy_root, cfg.engine.max_tokens) == ("/store", 512)
    assert config.replace(cfg, max_trajectory_len=384).engine.max_tokens == 384
    assert config.replace(cfg, policy_root="gs://b/store").engine.policy_root == "gs://b/store"
    with pytest.raises(ValueError, match="max_new_tokens_per_turn"):
        config.replace(cfg, max_trajectory_len=256)  # 300 new tokens no longer fit a trajectory
    assert config.parse(RolloutJobConfig, config.to_argv(cfg)) == cfg
    assert EngineConfig().policy_root is None  # a config's defaults; the worker refuses it
