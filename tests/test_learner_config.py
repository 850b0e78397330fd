"""The learner's and the planner's config trees are their command lines: each flag's
default is its field's, the flags of a tree rebuild it, derived fields follow the
sections they come from; and the run summary is a versioned contract."""

import dataclasses
import json

import pytest

from core import config
from core.contracts.record_shape import LayoutConfig, RecordShape
from core.contracts.run_summary import Accounting, RunSummary, SchemaError, SyncRounds
from core.sections import EnvChoice
from localstack.launch.plan import PlanConfig
from localstack.reports.reconcile import Reconciliation
from localstack.reports.summary import DemoSummary
from trainer import task
from trainer.config import LearnerJobConfig
from trainer.learning.data.feeder import CreditConfig
from trainer.learning.data.staleness import StalenessConfig
from trainer.learning.step.learner import LearnerConfig
from trainer.learning.step.losses import LossConfig
from trainer.learning.warmstart import WarmStartConfig

REQUIRED = {"requests_topic": "projects/p/topics/r", "records_subscription": "projects/p/subs/s", "policy_root": "/x"}


def _field_default(cls, path):
    """The default of the field at `path`, read from the dataclasses themselves (inside a
    section: its factory's instance, a preset)."""
    preset = None
    for name in path[:-1]:
        preset = next(f for f in dataclasses.fields(cls) if f.name == name).default_factory()
        cls = type(preset)
    f = next(f for f in dataclasses.fields(cls) if f.name == path[-1])
    if preset is not None:
        return getattr(preset, f.name)
    if f.default is not dataclasses.MISSING or f.default_factory is dataclasses.MISSING:
        return f.default
    return f.default_factory()


@pytest.mark.parametrize("cls", [LearnerJobConfig, PlanConfig])
def test_every_flag_defaults_to_its_field(cls):
    parser = config.make_parser(cls)
    leaves = {leaf.dest: leaf for leaf in config.leaves(cls)}
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(actions) == set(leaves)
    for dest, action in actions.items():
        want = _field_default(cls, leaves[dest].path)
        if want is dataclasses.MISSING:
            assert action.required, dest
        else:
            assert action.default == want, dest


def test_the_learner_keeps_its_flag_names():
    flags = {leaf.flag for leaf in config.leaves(LearnerJobConfig)}
    warm = {"warmstart_" + n for n in ("steps", "batch", "lr", "schedule", "warmup", "direct_at", "tasks")}
    assert warm | {"warmstart_direct_frac", "ack_extend_every_s", "loss", "sync", "env_config", "buckets"} <= flags
    assert "tool_latency" in flags
    assert LearnerConfig().batch_records == PlanConfig().batch_records  # one default, not 2 here and 4 there


def _changed_learner() -> LearnerJobConfig:
    return LearnerJobConfig(
        **REQUIRED,
        max_steps=7,
        sync=True,
        env=EnvChoice(tool_latency="fixed:0.1"),
        mesh="data=1",
        publish_bf16=True,
        layout=LayoutConfig(rows=2, buckets=(64, 128), max_segments_per_row=2),
        learner=LearnerConfig(batch_records=3, publish_every=2, loss=LossConfig(eps_high=0.3, tis_cap=2.0)),
        credits=CreditConfig(group_size=8, max_in_flight=64, request_timeout_s=120.0),
        warmstart=WarmStartConfig(steps=10, learning_rate=1e-3, direct_at="any_turn"),
    )


@pytest.mark.parametrize(
    "cls, cfg",
    [
        (LearnerJobConfig, _changed_learner()),
        (LearnerJobConfig, LearnerJobConfig(**REQUIRED)),
        (PlanConfig, config.build(PlanConfig, group_size=8, publish_every=2, rows=2, out="/tmp/plan.json")),
    ],
)
def test_the_flags_of_a_tree_rebuild_it(cls, cfg):
    parser = config.make_parser(cls)
    assert config.from_namespace(cls, parser.parse_args(config.to_argv(cfg))) == cfg


def test_values_computed_from_several_sections_follow_them():
    cfg = _changed_learner()
    window = cfg.credit_window()
    assert window.batch_records == 3 and window.shape == RecordShape(2, 128, 2)
    assert window.sync and window.steps_per_round == 2 and window.request_timeout is None
    assert cfg.applied_staleness() == StalenessConfig(0, None)  # the sync baseline
    assert cfg.staleness == StalenessConfig()  # the section keeps what was set on it
    parsed = task.parse_config([*config.to_argv(LearnerJobConfig(**REQUIRED)), "--max_staleness=3"])
    assert parsed.applied_staleness().max_staleness == 3 and parsed.credit_window().request_timeout == 300.0


def test_vertex_env_gives_defaults_the_command_line_overrides(monkeypatch):
    monkeypatch.setenv("AIP_MODEL_DIR", "gs://b/model")
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", "gs://b/logs")
    argv = ["--requests_topic=t", "--records_subscription=s", "--logdir=/here"]
    cfg = task.parse_config(argv)
    assert cfg.policy_root == "gs://b/model" and cfg.telemetry.logdir == "/here" and cfg.checkpoint_dir is None


def _summary() -> RunSummary:
    return RunSummary(
        steps=4,
        schedule="sync",
        sync=SyncRounds(rounds=2, round_sizes=[16, 24]),
        mesh={"data": 2, "model": 1},
        policy_versions_published=[0, 1, 2],
        staleness_histogram={"0": 5},
        last_metrics={"losses/policy_loss": 0.5},
        accounting=Accounting(requested=32, received=30, trained=30, in_flight_at_end=2),
    )


def test_run_summary_round_trips_and_refuses_another_schema():
    s = _summary()
    assert RunSummary.from_json(s.to_json()) == s
    assert json.loads(s.to_json())["schema_version"] == RunSummary.SCHEMA_VERSION
    data = s.to_dict()
    with pytest.raises(SchemaError, match="schema_version 2; this code reads version 1"):
        RunSummary.from_dict({**data, "schema_version": 2})
    with pytest.raises(SchemaError, match="no schema_version"):
        RunSummary.from_dict({k: v for k, v in data.items() if k != "schema_version"})
    with pytest.raises(SchemaError, match=r"RunSummary.steps must be int"):
        RunSummary.from_dict({**data, "steps": "4"})
    with pytest.raises(SchemaError, match=r"unknown fields \['stpes'\]"):
        RunSummary.from_dict({**data, "stpes": 4})
    with pytest.raises(SchemaError, match=r"RunSummary.accounting.trained must be int"):
        RunSummary.from_dict({**data, "accounting": {**data["accounting"], "trained": None}})


def test_demo_summary_holds_the_learners_and_round_trips():
    demo = DemoSummary(
        _summary(),
        held_out={"sampled": {"target": 0.9}},
        eval_n=32,
        demo_wall_s=12.5,
        workdir="/w",
        restarts={"pipeline": 1, "emulator": 0},
        reconciliation=Reconciliation(episodes=30, remainders={"not_yet_run": 2}),
        pids={"learner": 7},
    )
    back = DemoSummary.from_json(demo.to_json())
    assert back == demo and back.learner.sync.rounds == 2
    with pytest.raises(SchemaError, match="run summary has schema_version 9"):
        DemoSummary.from_dict({**demo.to_dict(), "learner": {**demo.learner.to_dict(), "schema_version": 9}})
