"""The rollout job's, the evaluator's and the Vertex launcher's config trees: every flag's
default is its field's, and `config.to_argv` of a changed tree parses back to that tree
(for the rollout job also through Beam's options, as a worker re-creates them)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from core import config
from pipelines.config import RolloutJobConfig
from pipelines.options import rollout_config as from_options
from rollout.evaluator import EvaluatorConfig
from trainer.cloud.vertex import VertexJobConfig, parse_cli

VERTEX_REQUIRED = dict(
    project="my-proj",
    region="us-central1",
    image_uri="us-docker.pkg.dev/p/rl/learner:v1",
    base_output_dir="gs://my-bucket/x",
)


def field_default(cls, path: tuple[str, ...]):
    """The default written on the dataclass field itself (a section: its factory's)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == path[0])
    if len(path) > 1:
        return field_default(typing.get_type_hints(cls)[f.name], path[1:])
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


@pytest.mark.parametrize("cls", [RolloutJobConfig, EvaluatorConfig, VertexJobConfig])
def test_every_flag_default_is_its_fields_default(cls):
    parser = config.make_parser(cls)
    actions = {a.dest: a for a in parser._actions}
    for leaf in config.leaves(cls):
        want = field_default(cls, leaf.path)
        assert leaf.default == want, leaf.flag
        if want is dataclasses.MISSING:
            assert actions[leaf.dest].required, leaf.flag
        else:
            assert actions[leaf.dest].default == want, leaf.flag


def test_beams_options_default_to_the_default_tree():
    assert from_options(PipelineOptions([])) == RolloutJobConfig()
    # Beam re-creates a worker's options from a dict in which False is dropped: a bool
    # flag defaulting to True could never be turned off there.
    bools = [leaf.flag for leaf in config.leaves(RolloutJobConfig) if leaf.type is bool]
    assert bools and all(leaf.default is False for leaf in config.leaves(RolloutJobConfig) if leaf.type is bool)


ROLLOUT_CHANGES = dict(
    requests_subscription="projects/p/subscriptions/requests",
    records_topic="projects/p/topics/records",
    dead_letter_topic="projects/p/topics/dead",
    policy_root="gs://b/store",
    rows=2,
    seq_len=128,
    max_segments_per_row=3,
    buckets=(128, 256),
    max_trajectory_len=200,
    model="/checkpoints/qwen2",
    engine_slots=8,
    engine_prefill=32,
    engine_prefill_slots=4,
    engine_separate_prompts=True,
    engine_seed=3,
    engine_decode_steps=4,
    engine_dtype="bfloat16",
    max_concurrent_groups=4,
    queued_groups=2,
    admit_poll_s=0.1,
    commit_interval_s=0.5,
    request_shards=2,
    max_new_tokens_per_turn=24,
    step_timeout_s=5.0,
    episode_timeout_s=60.0,
    policy_poll_s=0.25,
    policy_wait_s=30.0,
    advantage_estimator="rloo",
    logdir="/tmp/logs",
    trace_dir="/tmp/traces",
    telemetry_every_s=1.0,
    window_s=30.0,
    max_wait_s=0.5,
    num_shards=2,
    dedup_window_s=600.0,
    content_dedup=True,
    filter_zero_signal=True,
    overlong="drop",
    allowed_lateness_s=0.0,
    heartbeat_s=0.0,
    dofn_per_bundle=True,
)


def test_a_changed_rollout_config_round_trips_through_argv_and_beam():
    cfg = config.build(RolloutJobConfig, **ROLLOUT_CHANGES)
    argv = config.to_argv(cfg)
    unchanged = {leaf.flag for leaf in config.leaves(RolloutJobConfig)} - set(ROLLOUT_CHANGES)
    assert unchanged == {"model_config"}  # one model size in the tests' environment
    assert len(argv) == len(ROLLOUT_CHANGES)
    assert config.parse(RolloutJobConfig, argv) == cfg
    launcher = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming", *argv])
    assert from_options(launcher) == cfg
    worker = PipelineOptions.from_dictionary(launcher.get_all_options())  # what a worker re-creates
    assert from_options(worker) == cfg
    layout = cfg.layout.layout  # the workers' trajectory cap and the packer's shapes
    assert (layout.trajectory_len, layout.buckets, layout.rows) == (200, (128, 256), 2)


def test_a_changed_evaluator_config_round_trips_through_argv():
    cfg = config.build(
        EvaluatorConfig,
        **dict(policy_root="/store", out="/out/eval.jsonl", env="guess", env_config={"max_turns": 3, "low": 1}),
        **dict(n=8, task_seed=3, data_dir="/data", modes="greedy", max_tokens=128, max_new_tokens_per_turn=16),
        **dict(slots=4, poll_s=0.5, stop_file="/out/final", timeout_s=60.0, seed=7, examples=3, nice=5),
        **dict(logdir="/logs", trace_dir="/traces", model="/checkpoints/qwen2"),
        **dict(prefill=16, prefill_slots=2, episode_timeout_s=300.0, greedy_at="ends"),
        **dict(decode_steps=4, dtype="bfloat16", samples=4, samples_at="every", temperatures="0.5,0.8"),
    )
    argv = config.to_argv(cfg)
    assert config.parse(EvaluatorConfig, argv) == cfg
    assert len(argv) == len(list(config.leaves(EvaluatorConfig))) - 1  # all but --model_config


def test_a_changed_vertex_config_round_trips_through_argv():
    cfg = VertexJobConfig(
        **VERTEX_REQUIRED,
        **dict(display_name="rl-run", tpu_topology="4x4", replica_count=4, staging_bucket="gs://my-stage"),
        **dict(service_account="learner@my-proj.iam.gserviceaccount.com", env=("A=1", "B=x,y=z")),
        **dict(tensorboard=f"projects/my-proj/locations/{VERTEX_REQUIRED['region']}/tensorboards/7"),
        **dict(dry_run=True, skip_learner_args_check=True),
    )
    argv = config.to_argv(cfg)
    assert argv.count("--env=A=1") == 1 and "--env=B=x,y=z" in argv  # one flag per variable
    assert parse_cli([*argv, "--", "--max_steps=3"]) == dataclasses.replace(cfg, learner_args=("--max_steps=3",))
    no_topology = dataclasses.replace(cfg, machine_type="n1-standard-8", tpu_topology="")
    assert parse_cli(config.to_argv(no_topology)) == no_topology
    dashed = [a if a != "--dry_run" else "--dry-run" for a in config.to_argv(cfg)]
    assert parse_cli(dashed).dry_run  # the documented spelling
