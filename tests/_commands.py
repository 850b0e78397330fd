"""The tests' subprocess command lines, all from the config trees (core/config.py): a test
names the settings it changes, by flag name, and the launcher builds the command with
`config.to_argv`, exactly as the demo does (localstack/launch/commands.py)."""

from __future__ import annotations

from core import config
from localstack.launch import commands
from pipelines.config import RolloutJobConfig
from rollout.evaluator import EvaluatorConfig
from trainer.config import LearnerJobConfig

# The small, fast settings most tests share (a record of 2 x 256; a quick first flush).
SMALL_LAYOUT = {"rows": 2, "seq_len": 256}
FAST_ROLLOUT = {"engine_slots": 16, "max_wait_s": 0.5, "commit_interval_s": 0.1, "policy_poll_s": 0.2}


def learner(**flags) -> list[str]:
    """`trainer.task` with these settings (the rest: the learner's defaults)."""
    return commands.learner_command(config.build(LearnerJobConfig, **flags))


def rollout(project: str, **flags) -> list[str]:
    """The streaming rollout job on the local runner with these settings."""
    return commands.rollout_command(config.build(RolloutJobConfig, **flags), project)


def evaluator(**flags) -> list[str]:
    return commands.evaluator_command(config.build(EvaluatorConfig, **flags))


def demo(**flags) -> list[str]:
    from localstack.launch.demo_config import DemoConfig

    return commands.demo_command(config.build(DemoConfig, **flags))
