"""Every subprocess command line of the local stack, built from the processes' config
trees with `config.to_argv`: the demo, the benchmarks and the tests all start the learner,
the rollout job, the evaluator and the planner through these functions."""

from __future__ import annotations

import sys

from core import config

LOCAL_RUNNER = ("--runner=BundleBasedDirectRunner", "--streaming")


def learner_command(cfg) -> list[str]:
    """`trainer.task` (the `agentic-rl learner` subcommand) with this LearnerJobConfig."""
    return [sys.executable, "-m", "trainer.task", *config.to_argv(cfg)]


def rollout_command(cfg, project: str, beam_flags: tuple[str, ...] = LOCAL_RUNNER) -> list[str]:
    """The streaming rollout job with this RolloutJobConfig; Beam's own flags (the runner,
    the project) are Beam's, not the config's."""
    return [sys.executable, "-m", "pipelines.job", *beam_flags, f"--project={project}", *config.to_argv(cfg)]


def evaluator_command(cfg) -> list[str]:
    return [sys.executable, "-m", "rollout.evaluator", *config.to_argv(cfg)]


def plan_command(cfg) -> list[str]:
    return [sys.executable, "-m", "localstack.launch.plan", *config.to_argv(cfg)]


def demo_command(cfg) -> list[str]:
    return [sys.executable, "-m", "localstack.launch.demo", *config.to_argv(cfg)]
