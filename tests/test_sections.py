"""Shared sections (core/sections, core/config.py `section(shared=True)`): a setting that
several processes must agree on is declared once, given once, and reaches every process
that holds its section, through the argv the demo starts that process with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core import config
from core.config import configclass, knob, section
from core.sections import EnvChoice, ModelChoice, TelemetryDirs
from localstack.launch import demo
from localstack.launch.demo_config import DemoConfig, parse_args
from localstack.launch.plan import PlanConfig
from pipelines.config import RolloutJobConfig
from rollout.evaluator import EvaluatorConfig
from trainer.config import LearnerJobConfig

TOPICS = {"requests": "t/r", "records": "t/p", "dead": "t/d"}


def _processes(cfg: DemoConfig, tmp_path) -> dict:
    """Each process's tree as its own parser rebuilds it from the argv the demo gives it."""
    cfg = demo.telemetry(cfg, tmp_path)
    trees = {
        "learner": demo.learner_config(cfg, tmp_path, TOPICS, TOPICS, tmp_path / "store", None),
        "rollout": demo.rollout_config(cfg, tmp_path, TOPICS, TOPICS, tmp_path / "store", None),
        "evaluator": demo.evaluator_config(cfg, tmp_path, tmp_path / "store"),
    }
    return {name: config.parse(type(tree), config.to_argv(tree)) for name, tree in trees.items()}


@pytest.fixture(scope="module")
def default_processes(tmp_path_factory) -> dict:
    return _processes(parse_args([]), tmp_path_factory.mktemp("default"))


MODELS = lambda p: (p["learner"].model, p["rollout"].engine.model, p["evaluator"].model)


@pytest.mark.parametrize(
    "argv, reads, want",
    [
        (["--model=/ckpt/m"], lambda p: [m.checkpoint for m in MODELS(p)], "/ckpt/m"),
        (["--model_config=small"], lambda p: [m.builtin for m in MODELS(p)], "small"),
        (["--env=guess"], lambda p: (p["learner"].env.name, p["evaluator"].env.name), "guess"),
        (
            ['--env_config={"max_ops_per_call": 1}'],
            lambda p: (p["learner"].env.config, p["evaluator"].env.config),
            {"max_ops_per_call": 1},
        ),
        (["--rows=3"], lambda p: (p["learner"].layout.rows, p["rollout"].layout.rows), 3),
        (
            ["--max_new_tokens_per_turn=48"],
            lambda p: (p["rollout"].engine.turn.max_new_tokens_per_turn, p["evaluator"].turn.max_new_tokens_per_turn),
            48,
        ),
        (
            ["--lora_rank=4", "--lora_alpha=8"],
            lambda p: ((p["learner"].learner.lora.rank, p["learner"].learner.lora.alpha),),
            (4, 8),
        ),
        (
            ["--warmstart_steps=5", "--warmstart_lr=1e-4"],
            lambda p: ((p["learner"].warmstart.steps, p["learner"].warmstart.learning_rate),),
            (5, 1e-4),
        ),
        # Run-wide values (`knob(to=...)`): the demo's own, set in the processes named.
        (["--max_steps=7"], lambda p: (p["learner"].max_steps,), 7),
        (["--group_size=4"], lambda p: (config.get(p["learner"], _path(p["learner"], "group_size")),), 4),
        (["--sync"], lambda p: (p["learner"].sync,), True),
        (["--init_policy=/store"], lambda p: (p["learner"].init_policy,), "/store"),
        (["--max_wait_s=3"], lambda p: (config.get(p["rollout"], _path(p["rollout"], "max_wait_s")),), 3.0),
        (["--no-filter_zero_signal"], lambda p: (p["rollout"].packing.filter_zero_signal,), False),
    ],
)
def test_one_flag_reaches_every_process_that_holds_its_section(argv, reads, want, tmp_path, default_processes):
    given = list(reads(_processes(parse_args(argv), tmp_path)))
    assert given == [want] * len(given)  # every process named holds the flag's value
    assert list(reads(default_processes)) != given  # which is not what it holds by default


def test_the_telemetry_dirs_are_the_workdirs_in_every_process_and_no_demo_flag(tmp_path):
    procs = _processes(parse_args([]), tmp_path)
    dirs = {p.telemetry if name != "rollout" else p.engine.telemetry for name, p in procs.items()}
    assert dirs == {TelemetryDirs(str(tmp_path / "logs"), str(tmp_path / "trace"))}
    with pytest.raises(SystemExit):
        parse_args(["--logdir=/elsewhere"])


def test_a_shared_sections_copies_have_no_flags_of_their_own():
    flags = {leaf.flag for leaf in config.leaves(DemoConfig)}
    assert {"model", "model_config", "env", "env_config", "tool_latency", "lora_rank", "warmstart_steps"} <= flags
    for prefix in ("learner.", "rollout.", "eval_"):
        held = ("model", "model_config", "env", "env_config", "rows", "logdir", "max_new_tokens_per_turn")
        assert not {prefix + f for f in held} & flags
        # Where a process connects is wiring: the demo sets it from its workdir and emulator.
        assert not {prefix + f for f in ("policy_root", "data_dir", "requests_topic", "records_topic")} & flags
    assert {"policy_root", "requests_topic", "data_dir"} <= {leaf.flag for leaf in config.leaves(LearnerJobConfig)}


def test_a_run_wide_value_is_set_in_each_process_named_and_is_no_flag_there():
    flags = {leaf.flag for leaf in config.leaves(DemoConfig)}
    forwarded = {f.name: f.metadata["to"] for f in dataclasses.fields(DemoConfig) if "to" in f.metadata}
    assert {"max_steps", "batch_records", "timeout_s", "policy_poll_s", "filter_zero_signal"} <= set(forwarded)
    assert {"batch_records", "max_wait_s", "target_duty", "rollout_rate"} <= {
        f for f, to in forwarded.items() if "planner" in to
    }
    prefixes = {"learner": "learner.", "rollout": "rollout.", "evaluator": "eval_"}
    given = DemoConfig(batch_records=3, max_wait_s=2.5, target_duty=0.5, rollout_rate=7.0, group_size=4)
    for name, sections in forwarded.items():
        assert name in flags
        for section_name in sections:
            if section_name == "planner":  # no tree in the demo's: the demo builds one from these
                tree = demo.planner_config(given, Path("plan.json"))
            else:
                assert prefixes[section_name] + name not in flags  # the demo's flag, not the process's
                tree = config.launched(given, section_name)
            assert config.get(tree, _path(tree, name)) == getattr(given, name)


# Each tree a run-wide value can be set in, as its own process parses it.
RUN_WIDE_TARGETS = {"learner": LearnerJobConfig, "rollout": RolloutJobConfig, "planner": PlanConfig}


def _declaration(leaf) -> tuple:
    return (leaf.type, leaf.help, leaf.choices, leaf.bounds)


def test_each_run_wide_value_is_declared_once_in_the_process_that_reads_it():
    """A value the demo sets in its processes (`to`), and a job's knob the planner plans by,
    is the process's own declaration (`knob_like`): one help, one type, one set of checks.
    The holder may preset another value; nothing else about the flag is said twice."""
    holders = {"demo": (DemoConfig, None), "planner": (PlanConfig, ("learner", "rollout"))}
    checked = set()
    for holder_name, (holder, to_all) in holders.items():
        mine = {leaf.flag: leaf for leaf in config.leaves(holder)}
        for f in dataclasses.fields(holder):
            targets = f.metadata.get("to", ()) or (to_all if "like" in f.metadata else ())
            for target in targets:
                theirs = {leaf.flag: leaf for leaf in config.leaves(RUN_WIDE_TARGETS[target])}
                if f.name not in theirs:
                    continue  # the planner's knobs name one job or the other
                assert "like" in f.metadata, f"--{f.name}: declared again in {holder_name}, not knob_like"
                assert _declaration(mine[f.name]) == _declaration(theirs[f.name]), (holder_name, f.name, target)
                checked.add((holder_name, f.name))
    assert {("demo", n) for n in ("max_steps", "group_size", "filter_zero_signal", "target_duty")} <= checked
    assert {("planner", n) for n in ("batch_records", "group_size", "publish_every", "max_wait_s")} <= checked


def _path(tree, flag: str) -> tuple[str, ...]:
    return next(leaf.path for leaf in config.leaves(type(tree)) if leaf.flag == flag)


@configclass
class _Steps:
    steps: int = knob(1, "steps")


@configclass
class _StepsHolder:
    steps: int = knob(5, "steps", to=("inner",))
    other: int = knob(2, "no such flag inside", to=("inner",))
    inner: _Steps = section(_Steps, "inner.", launched=True)


def test_to_names_a_flag_the_section_must_have():
    assert "inner.steps" not in {leaf.flag for leaf in config.leaves(_StepsHolder)}
    with pytest.raises(KeyError, match="--other"):
        config.launched(_StepsHolder(), "inner")


def test_the_evaluator_scores_without_the_runs_tool_latency(tmp_path):
    cfg = parse_args(["--tool_latency=fixed:3"])
    procs = _processes(cfg, tmp_path)
    assert procs["learner"].env.settings["tool_latency"] == "fixed:3"
    assert "tool_latency" not in procs["evaluator"].env.config
    assert "tool_latency" not in {leaf.flag for leaf in config.leaves(EvaluatorConfig)}


def test_a_section_given_after_construction_reaches_the_held_trees_again():
    cfg = config.build(DemoConfig)
    moved = dataclasses.replace(cfg, model=ModelChoice(checkpoint="/ckpt/x"))
    assert moved.learner.model.checkpoint == moved.rollout.engine.model.checkpoint == "/ckpt/x"
    assert moved.evaluator.model.checkpoint == "/ckpt/x" and cfg.learner.model.checkpoint is None
    # A shared layout reaches the learner: its span and warm-start rows are built from it.
    longer = config.replace(cfg, max_trajectory_len=320)
    assert longer.learner.record_layout.trajectory_len == longer.layout.layout.trajectory_len == 320


@configclass
class _Inner:
    size: int = knob(1, "a shared setting", ge=1)


@configclass
class _Process:
    inner: _Inner = section(_Inner)
    own: int = knob(0, "the process's own")


@configclass
class _Holder:
    inner: _Inner = section(_Inner, shared=True)
    a: _Process = section(_Process, "a.")
    b: _Process = section(_Process, "b.")


def test_sharing_is_by_type_at_any_depth_and_checks_the_value_once():
    flags = {leaf.flag for leaf in config.leaves(_Holder)}
    assert flags == {"size", "a.own", "b.own"}
    tree = config.parse(_Holder, ["--size=3", "--a.own=1"])
    assert tree.a.inner.size == tree.b.inner.size == 3 and (tree.a.own, tree.b.own) == (1, 0)
    with pytest.raises(SystemExit):
        config.parse(_Holder, ["--size=0"])  # the declaration's bound, named once
    assert config.parse(_Process, ["--size=2"]).inner.size == 2  # alone, a process has the flag


def test_the_sections_refuse_what_they_declare():
    with pytest.raises(ValueError, match="model_config"):
        ModelChoice(builtin="huge")
    with pytest.raises(ValueError, match=r"no_such_setting.*--env 'calculator', --env_config"):
        EnvChoice(config={"no_such_setting": 1})
    assert EnvChoice(config={"max_ops_per_call": 2}, tool_latency="fixed:1").settings == {
        "max_ops_per_call": 2,
        "tool_latency": "fixed:1",
    }


def test_a_process_alone_still_takes_every_flag():
    for cls in (LearnerJobConfig, RolloutJobConfig, EvaluatorConfig):
        flags = {leaf.flag for leaf in config.leaves(cls)}
        assert {"model", "model_config", "logdir", "trace_dir"} <= flags, cls
    learner = config.parse(
        LearnerJobConfig,
        ["--requests_topic=t", "--records_subscription=s", "--policy_root=/p", "--env=guess", "--model=/m"],
    )
    assert (learner.env.name, learner.model.checkpoint) == ("guess", "/m")
    assert learner.env.settings == {}  # no tool latency unless asked


def test_the_planner_measures_with_the_runs_own_sections():
    cfg = parse_args(["--env=guess", "--model_config=small", "--rows=2", "--lora_rank=4", "--learner.step_memory_gb=2"])
    plan = demo.planner_config(cfg, Path("plan.json"))
    assert (plan.env.name, plan.model.builtin, plan.layout.rows, plan.lora.rank) == ("guess", "small", 2, 4)
    assert plan.compute == cfg.learner.learner.compute and plan.compute.memory_gb == 2
    assert plan.out == "plan.json"
