"""The demo's config tree: the main job's settings, and the processes it starts.

Top-level fields are the run's own (workdir, restarts, the live panel) and the settings
that several processes share (environment, tool latency, steps, group and batch sizes,
the record layout): the demo sets those in every process, so each process's section hides
them. The sections are the learner's, the rollout job's and the evaluator's own config
trees, preset for the main job; any of their fields is a flag under the section's prefix
(`--learner.kl_coef=0.01`, `--rollout.engine_slots=32`, `--eval_nice=5`). The demo launches
each process with `config.to_argv` of its section: no flag is forwarded by hand.
"""

from __future__ import annotations

import os
import sys

import environments
from core import config
from core.config import configclass, knob, section
from core.contracts.record_shape import LayoutConfig
from core.policy.config import MODEL_CONFIGS
from core.policy.sources import MODEL_HELP
from pipelines.config import RolloutJobConfig
from rollout.evaluator import EvaluatorConfig
from trainer.config import LearnerJobConfig

LAYOUT_FLAGS = tuple(leaf.flag for leaf in config.leaves(LayoutConfig))
TELEMETRY_FLAGS = ("logdir", "trace_dir")
SET_BY_DEMO = "set-by-the-demo"  # placeholder for a field the demo fills in at launch

# What the demo sets in each process (from its own fields or its workdir): no flag there.
LEARNER_SET = (
    *("requests_topic", "records_subscription", "dead_letter_topic", "policy_root", "summary_path"),
    *("checkpoint_dir", "data_dir", "plan", "env", "env_config", "init_policy", "sync"),
    *("max_steps", "publish_every", "batch_records", "group_size", "timeout_s", "model_config", "model"),
    *("warmstart_steps", "warmstart_batch", "warmstart_tasks", "warmstart_direct_frac", "lora_rank", "lora_alpha"),
    *LAYOUT_FLAGS,
    *TELEMETRY_FLAGS,
)
ROLLOUT_SET = (
    *("requests_subscription", "records_topic", "dead_letter_topic", "policy_root", "max_new_tokens_per_turn"),
    *("policy_poll_s", "max_wait_s", "filter_zero_signal", "model_config", "model"),
    *LAYOUT_FLAGS,
    *TELEMETRY_FLAGS,
)
EVALUATOR_SET = (
    *("policy_root", "out", "env", "env_config", "data_dir", "task_seed", "stop_file", "timeout_s", "max_tokens"),
    *("model_config", "model", "max_new_tokens_per_turn"),
    *TELEMETRY_FLAGS,
)


def main_job_learner() -> LearnerJobConfig:
    return config.build(
        LearnerJobConfig, requests_topic=SET_BY_DEMO, records_subscription=SET_BY_DEMO, policy_root=SET_BY_DEMO
    )


def main_job_rollout() -> RolloutJobConfig:
    return RolloutJobConfig()


def main_job_evaluator() -> EvaluatorConfig:
    # Niced: on two cores evaluation yields to training (it skips versions instead).
    return config.build(EvaluatorConfig, policy_root=SET_BY_DEMO, out=SET_BY_DEMO, nice=10)


@configclass
class DemoConfig:
    """`agentic-rl demo` (`make demo`): the main job on the embedded local stack."""

    workdir: str | None = knob(None, "logs, policy store and summary (unset: a temp dir)")
    max_steps: int = knob(40, "learner steps")
    publish_every: int = knob(2, "learner steps per policy version")
    batch_records: int = knob(4, "records per learner step (up to 16 episodes each)")
    group_size: int = knob(8, "episodes per prompt (GRPO group)")
    keep_zero_signal: bool = knob(
        False, "also train on groups whose rewards are all equal (they carry no gradient, only dilute it)"
    )
    env: str = knob(
        "calculator",
        "calculator, guess or code (any registered name); selects that environment's recipe "
        "(localstack/launch/recipes.py), which flags given here override",
    )
    env_config: dict = knob({}, "the environment's settings besides tool latency, JSON (turn limit, ranges)")
    max_new_tokens_per_turn: int = knob(32, "tokens one model turn may generate (rollout, evaluation, layout)", ge=1)
    model_config: str = knob(
        LearnerJobConfig.model_config, "the policy model, the same in every process", choices=sorted(MODEL_CONFIGS)
    )
    model: str | None = knob(
        None,
        MODEL_HELP + "; with it the record layout follows from the checkpoint and --env unless layout flags are given",
    )
    lora_rank: int = knob(0, "train LoRA adapters of this rank instead of every weight (0: full fine-tuning)")
    lora_alpha: float = knob(16.0, "LoRA scale numerator: adapters add (alpha / rank) * x A B")
    tool_latency: str = knob("fixed:0.5", "per tool call: none, fixed:S, uniform:A:B, lognormal:M:S")
    sync: bool = knob(False, "the synchronous baseline: one round of rollouts per policy version")
    timeout_s: float = knob(900.0, "the learner gives up after this long")
    policy_poll_s: float = knob(0.5, "how often rollout workers look for a new policy version")
    max_wait_s: float = knob(1.0, "a partly filled record is flushed after this long (planner and packer)")
    warmstart_steps: int = knob(2800, "behaviour cloning on oracle episodes before v0, so RL starts with signal")
    warmstart_batch: int = knob(16, "warm-start batch rows")
    warmstart_tasks: int = knob(12000, "distinct train tasks the demonstrations use")
    warmstart_direct_frac: float = knob(
        0.5, "share of demonstrations that answer at once instead of calling the tool: RL learns to call"
    )
    init_policy: str | None = knob(None, "start RL from this policy store's newest version (no warm start)")
    resume: bool = knob(False, "continue from the learner checkpoint a previous run left in --workdir")
    max_restarts: int = knob(3, "times a dead rollout job, and a dead Pub/Sub emulator, is started again", ge=0)
    target: float = knob(0.9, "held-out success the summary reports reaching")
    plan: str = knob(
        "auto",
        "auto: run the planner first and use its credits, staleness bound and engine slots; "
        "a plan JSON to use; off: the processes' own settings",
    )
    target_duty: float = knob(0.95, "the learner duty cycle the plan aims at")
    rollout_rate: float | None = knob(None, "for the plan: the measured rollout ceiling, trajectories/s")
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
    layout: LayoutConfig = section(LayoutConfig, help="the record layout, the same for both sides")
    learner: LearnerJobConfig = section(main_job_learner, "learner.", "the learner process", LEARNER_SET)
    rollout: RolloutJobConfig = section(main_job_rollout, "rollout.", "the rollout job", ROLLOUT_SET)
    evaluator: EvaluatorConfig = section(main_job_evaluator, "eval_", "the held-out evaluator", EVALUATOR_SET)

    def __post_init__(self):
        if self.env in environments.names():  # a plugin's is checked by the learner, once loaded
            try:
                environments.make(self.env, **{**self.env_config, "tool_latency": self.tool_latency})
            except (TypeError, ValueError) as e:
                raise ValueError(f"--env_config {self.env_config} is not a setting of --env {self.env}: {e}") from None
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
    env = env_of(argv) or DemoConfig.env
    base = config.parse(
        DemoConfig, [f"--env={env}", *recipe_argv(env, model_of(argv))], prog="agentic-rl demo (recipe)"
    )
    return config.parse(DemoConfig, argv, description=__doc__, prog="agentic-rl demo", base=base)
