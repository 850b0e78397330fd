"""EngineConfig refuses bad worker settings by name, is what the pipeline's flags build,
and the CLIs offer exactly the choices the code defines."""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from core.rl.advantages import ADVANTAGE_ESTIMATORS
from pipelines.options import engine_config
from rollout.engine_config import EngineConfig
from trainer import task
from trainer.learning.losses import AGGREGATIONS, ALGORITHMS, KL_ESTIMATORS


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (dict(policy_root=""), "policy_root"),
        (dict(model_config="huge"), "model_config"),
        (dict(slots=0), "slots"),
        (dict(slots=2.0), "slots"),
        (dict(max_concurrent_groups=-1), "max_concurrent_groups"),
        (dict(request_shards=0), "request_shards"),
        (dict(commit_interval_s=0), "commit_interval_s"),
        (dict(policy_poll_s=float("inf")), "policy_poll_s"),
        (dict(policy_wait_s=True), "policy_wait_s"),
        (dict(max_new_tokens_per_turn=256, max_tokens=256), "max_new_tokens_per_turn"),
        (dict(advantage_estimator="ppo"), "advantage_estimator"),
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
    ]
    cfg = engine_config(PipelineOptions(flags))
    assert cfg == EngineConfig(
        policy_root="/store",
        slots=32,
        max_concurrent_groups=8,
        commit_interval_s=0.5,
        request_shards=2,
        max_new_tokens_per_turn=24,
        max_tokens=256,  # the default trajectory cap (the tiny policy's context), below the largest bucket
        policy_poll_s=0.25,
        policy_wait_s=60.0,
        advantage_estimator="rloo",
    )
    assert cfg.limits.max_tokens == 256 and cfg.limits.max_new_tokens_per_turn == 24
    assert engine_config(PipelineOptions([*flags, "--max_trajectory_len=512"])).max_tokens == 512


def _choices(parser, dest):
    return next(a.choices for a in parser._actions if a.dest == dest)


def test_cli_choices_come_from_the_constants():
    learner = task.build_parser()
    assert list(_choices(learner, "loss")) == list(ALGORITHMS)
    assert list(_choices(learner, "aggregation")) == list(AGGREGATIONS)
    assert list(_choices(learner, "kl_estimator")) == list(KL_ESTIMATORS)
    with pytest.raises(SystemExit):
        task.parse_args(["--requests_topic=t", "--records_subscription=s", "--policy_root=/x", "--loss=sgd"])
    opts = PipelineOptions(["--advantage_estimator=nope"])
    with pytest.raises(SystemExit):
        opts.get_all_options()
    assert sorted(ADVANTAGE_ESTIMATORS) == ["dr_grpo", "grpo", "rloo"]
