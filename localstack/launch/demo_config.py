"""The demo's config tree: the main job's settings, and the processes it starts.

Top-level fields are the run's own (workdir, restarts, the live panel, steps, group and
batch sizes), and the sections every process must agree on (model, environment, turn
length, layout, LoRA, warm start, telemetry), declared `shared`: each is given to every process's section
of its type, which has no flag of its own. The processes' sections are the learner's, the
rollout job's and the evaluator's own config trees, preset for the main job; any of their
fields is a flag under the section's prefix (`--learner.kl_coef=0.01`,
`--rollout.engine_slots=32`, `--eval_nice=5`). The demo launches each process with
`config.to_argv` of its section, after setting the run-wide fields declared `to` it and the
workdir's paths (localstack/launch/demo.py).
"""

from __future__ import annotations

import os
import sys

from core import config
from core.config import configclass, knob, knob_like, section
from core.contracts.record_shape import LayoutConfig
from core.policy.model.lora import LoraConfig
from core.sections import EnvChoice, ModelChoice, TelemetryDirs, TurnBudget
from localstack.launch.plan import PlanConfig
from pipelines.config import RolloutJobConfig
from pipelines.packing_config import PackingConfig
from rollout.engine_config import EngineConfig
from rollout.evaluator import EvaluatorConfig
from trainer.config import LearnerJobConfig
from trainer.learning.data.feeder import CreditConfig
from trainer.learning.step.learner import LearnerConfig
from trainer.learning.warmstart import WarmStartConfig

SET_BY_DEMO = "set-by-the-demo"  # placeholder for a field the demo fills in at launch

# Where a run-wide value is set (`knob(to=...)`): a process tree the demo holds, or the
# planner, whose tree the demo builds from these values and the shared sections alone.
LEARNER, ROLLOUT, PLANNER = "learner", "rollout", "planner"
# The evaluator's settings that follow from others: the learner's task seed (one seed builds
# both splits, disjoint), the run's deadline and the layout's trajectory length.
EVALUATOR_DERIVED = ("task_seed", "timeout_s", "max_tokens")


def main_job_learner() -> LearnerJobConfig:
    return config.build(
        LearnerJobConfig, requests_topic=SET_BY_DEMO, records_subscription=SET_BY_DEMO, policy_root=SET_BY_DEMO
    )


def main_job_rollout() -> RolloutJobConfig:
    return RolloutJobConfig()


def main_job_env() -> EnvChoice:
    return EnvChoice(tool_latency="fixed:0.5")


def main_job_warmstart() -> WarmStartConfig:
    # Enough oracle episodes that RL starts with signal; half answer at once, so RL learns to call.
    return WarmStartConfig(steps=2800, batch_rows=16, tasks=12000, direct_frac=0.5)


def main_job_evaluator() -> EvaluatorConfig:
    # Niced: on two cores evaluation yields to training (it skips versions instead). v0 and
    # the final version are sampled 8 times a task (pass@1..8), and v0 at three lower
    # temperatures too: what tells RL's learning from sharpening (rollout/evaluator.py).
    return config.build(
        EvaluatorConfig,
        policy_root=SET_BY_DEMO,
        out=SET_BY_DEMO,
        nice=10,
        samples=8,
        temperatures="0.2,0.5,0.8",
    )


@configclass
class DemoConfig:
    """`agentic-rl demo` (`make demo`): the main job on the embedded local stack."""

    workdir: str | None = knob(None, "logs, policy store and summary (unset: a temp dir)")
    # Run-wide values: the demo reads them too (progress, deadline, accounting), and `to`
    # sets each in the named processes' trees, which offer no flag of their own for it. Each
    # is the process's own declaration (`knob_like`), with the main job's preset.
    max_steps: int = knob_like(LearnerJobConfig, "max_steps", 40, to=(LEARNER,))
    publish_every: int = knob_like(LearnerConfig, "publish_every", 2, to=(LEARNER, PLANNER))
    batch_records: int = knob_like(LearnerConfig, "batch_records", 4, to=(LEARNER, PLANNER))
    group_size: int = knob_like(CreditConfig, "group_size", 8, to=(LEARNER, PLANNER))
    filter_zero_signal: bool = knob_like(PackingConfig, "filter_zero_signal", True, to=(ROLLOUT,))
    sync: bool = knob_like(LearnerJobConfig, "sync", to=(LEARNER,))
    timeout_s: float = knob_like(LearnerJobConfig, "timeout_s", 900.0, to=(LEARNER,))
    policy_poll_s: float = knob_like(EngineConfig, "policy_poll_s", 0.5, to=(ROLLOUT,))
    max_wait_s: float = knob_like(PackingConfig, "max_wait_s", 1.0, to=(ROLLOUT, PLANNER))
    init_policy: str | None = knob_like(LearnerJobConfig, "init_policy", to=(LEARNER, PLANNER))
    resume: bool = knob(False, "continue from the learner checkpoint a previous run left in --workdir")
    max_restarts: int = knob(3, "times a dead rollout job, and a dead Pub/Sub emulator, is started again", ge=0)
    target: float = knob(0.9, "held-out success the summary reports reaching")
    plan: str = knob(
        "auto",
        "auto: run the planner first and use its credits, staleness bound and engine slots; "
        "a plan JSON to use; off: the processes' own settings",
    )
    target_duty: float = knob_like(PlanConfig, "target_duty", to=(PLANNER,))
    rollout_rate: float | None = knob_like(PlanConfig, "rollout_rate", to=(PLANNER,))
    learner_processes: int = knob(
        1,
        "JAX processes of the learner, joined as on Vertex AI (CLUSTER_SPEC on localhost, gloo collectives)",
        ge=1,
        le=8,
    )
    learner_cpus: str | None = knob(None, "pin the learner (and the planner) to these cores, e.g. 0")
    rollout_cpus: str | None = knob(None, "pin the emulator, rollout job and evaluator, e.g. 1")
    trace: bool = knob(True, "record every process's spans and merge them into WORKDIR/trace.json (Perfetto)")
    live: str = knob("auto", "progress while it runs", choices=("auto", "panel", "lines", "off"))
    report: bool = knob(True, "draw the run's figures into WORKDIR/report at the end (a few seconds of matplotlib)")
    # One value each for every process that reads it (its --env also picks the recipe, and
    # with --model the layout follows from the checkpoint unless layout flags are given).
    env: EnvChoice = section(main_job_env, help="the environment", shared=True)
    model: ModelChoice = section(ModelChoice, help="the policy model", shared=True)
    turn: TurnBudget = section(TurnBudget, help="one model turn (rollout, evaluation, layout)", shared=True)
    layout: LayoutConfig = section(LayoutConfig, help="the record layout, the same for both sides", shared=True)
    lora: LoraConfig = section(LoraConfig, "lora_", "LoRA adapters (rank 0: full fine-tuning)", shared=True)
    warmstart: WarmStartConfig = section(main_job_warmstart, "warmstart_", "behaviour cloning before v0", shared=True)
    telemetry: TelemetryDirs = section(  # under the workdir: the demo sets it at launch
        TelemetryDirs, shared=True, hide=("logdir", "trace_dir")
    )
    learner: LearnerJobConfig = section(main_job_learner, "learner.", "the learner", launched=True)
    rollout: RolloutJobConfig = section(main_job_rollout, "rollout.", "the rollout job", launched=True)
    evaluator: EvaluatorConfig = section(
        main_job_evaluator, "eval_", "the held-out evaluator", EVALUATOR_DERIVED, launched=True
    )

    def __post_init__(self):
        for flag in ("learner_cpus", "rollout_cpus"):  # refused here, not once the watchdog runs
            text = getattr(self, flag)
            if text is None:
                continue
            cores = [c.strip() for c in text.split(",")]
            if not all(c.isdigit() and int(c) < (os.cpu_count() or 1) for c in cores):
                raise ValueError(f"--{flag} must be comma-separated core numbers below {os.cpu_count()}, got {text!r}")

    @property
    def evaluating(self) -> bool:
        return self.evaluator.n > 0


def parse_args(argv: list[str] | None) -> DemoConfig:
    """The demo's config: the --env's recipe (localstack/launch/recipes.py), with --model the
    checkpoint recipe on top of it (localstack/launch/checkpoint_recipes.py), then `argv`."""
    from localstack.launch.recipes import env_of, model_of, recipe_argv

    argv = sys.argv[1:] if argv is None else list(argv)
    env = env_of(argv) or main_job_env().name
    base = config.parse(
        DemoConfig, [f"--env={env}", *recipe_argv(env, model_of(argv))], prog="agentic-rl demo (recipe)"
    )
    return config.parse(DemoConfig, argv, description=__doc__, prog="agentic-rl demo", base=base)
