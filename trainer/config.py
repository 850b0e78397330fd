"""The learner process's one config tree: `agentic-rl learner` (python -m trainer.task).

Its sections are the component configs themselves (each field is its flag, declared once
in the component's module): the record layout, the learner and its loss, staleness,
credits, deliveries and the warm start. A section holds only what is set on it: values
computed from other sections (the loss's segments from the layout, the credit window,
the dedup horizon, the warm start's length and seed) are computed where the parts are
built (trainer/learning/builder.py) and passed in. The rules that span sections live in
`__post_init__`. Flags are flat (core/config.py): `--eps_low`, `--warmstart_lr`.
"""

from __future__ import annotations

from core.config import configclass, knob, section
from core.contracts.record_shape import LayoutConfig
from core.sections import EnvChoice, ModelChoice, TelemetryDirs
from trainer.learning.data.deliveries import DeliveryConfig
from trainer.learning.data.feeder import CreditConfig, CreditWindow
from trainer.learning.data.lag_control import LagControlConfig
from trainer.learning.data.staleness import StalenessConfig
from trainer.learning.data.starvation import StarvationConfig
from trainer.learning.step.learner import LearnerConfig
from trainer.learning.warmstart import WarmStartConfig

# Flags Vertex AI's environment sets by default (applied in trainer.task.main, never here).
VERTEX_ENV_DEFAULTS = {
    "policy_root": "AIP_MODEL_DIR",
    "checkpoint_dir": "AIP_CHECKPOINT_DIR",
    "logdir": "AIP_TENSORBOARD_LOG_DIR",
}


def parse_mesh(text: str | None) -> tuple[int, int] | None:
    """ "data=4,model=2" -> (4, 2); None or "" -> None (one device, no mesh)."""
    if not text:
        return None
    try:
        axes = dict(part.split("=") for part in text.split(","))
        shape = (int(axes.pop("data", 1)), int(axes.pop("model", 1)))
    except ValueError:
        raise ValueError(f"--mesh must look like data=4,model=2, got {text!r}") from None
    if axes or min(shape) < 1:
        raise ValueError(f"--mesh takes positive sizes for the axes data and model only, got {text!r}")
    return shape


@configclass
class LearnerJobConfig:
    """Everything the learner job reads from its command line."""

    requests_topic: str = knob(help="Pub/Sub topic the feeder publishes rollout requests to", wiring=True)
    records_subscription: str = knob(help="Pub/Sub subscription the packed records arrive on", wiring=True)
    policy_root: str = knob(help="the policy store (a dir or gs://...); on Vertex AI: AIP_MODEL_DIR", wiring=True)
    dead_letter_topic: str | None = knob(
        None, "where malformed records go (unset: dropped with a log line)", wiring=True
    )
    model: ModelChoice = section(ModelChoice, help="the policy model")
    max_steps: int = knob(20, "learner steps, then stop")
    timeout_s: float = knob(600.0, "give up (exit 1) after this long")
    mesh: str | None = knob(None, "device mesh, e.g. data=4,model=2 (unset: one device)")
    sync: bool = knob(
        False,
        "the synchronous baseline: request one round (publish_every batches) at version v, "
        "wait for all of it, train on it, publish v+1, repeat",
    )
    sync_round_timeout_s: float = knob(
        300.0, "a round whose trajectories are not all back by then trains on what came (counted as lost)"
    )
    env: EnvChoice = section(EnvChoice, help="the environment the requests name")
    task_seed: int = knob(0, "seed of the generated prompts")
    data_dir: str | None = knob(
        None, "read prompts from the environment's TFDS dataset here (built locally if missing)", wiring=True
    )
    init_policy: str | None = knob(
        None, "start from the newest version in this policy store (a dir or gs://...) instead of a warm start"
    )
    init_policy_unverified: bool = knob(
        False, "accept an --init_policy version published before checksum manifests, loading it unverified"
    )
    plan: str | None = knob(
        None,
        "a localstack.launch.plan JSON: warn at start if the credit window cannot reach its duty cycle",
        wiring=True,
    )
    peak_tflops: float | None = knob(
        None, "the accelerator's peak, for model-FLOPs utilisation (e.g. 197 per v5e chip)"
    )
    publish_bf16: bool = knob(False, "publish policy versions in bfloat16")
    keep_versions: int = knob(5, "policy versions kept in the store")
    delta_every: int = knob(
        0,
        "publish a full policy version every K versions and, in between, deltas against the last full one "
        "(0 or 1: every version full)",
        ge=0,
    )
    delta_max_share: float = knob(
        0.5, "publish a full version instead of a delta larger than this share of the last full one", gt=0, le=1
    )
    checkpoint_dir: str | None = knob(
        None,
        "learner checkpoints (a dir or gs://...), saved at every policy publish; a restarted learner resumes "
        "from the newest (on Vertex AI: AIP_CHECKPOINT_DIR)",
        wiring=True,
    )
    checkpoint_unverified: bool = knob(
        False, "resume from a checkpoint written before checksum manifests, restoring it unverified"
    )
    # A TPU compile of the step takes tens of seconds; a preempted or re-run job pays it again.
    compile_cache_dir: str | None = knob(
        None,
        "a persistent XLA compilation cache (a dir or gs://...) that a restarted or re-run learner reuses "
        "(unset: CHECKPOINT_DIR/xla_cache when --checkpoint_dir is set; JAX_COMPILATION_CACHE_DIR wins)",
        wiring=True,
    )
    summary_path: str | None = knob(None, "also write the run summary here as JSON", wiring=True)
    telemetry: TelemetryDirs = section(TelemetryDirs, help="per-step scalars and the timeline")
    layout: LayoutConfig = section(LayoutConfig, help="the record layout, the same on both sides")
    learner: LearnerConfig = section(LearnerConfig, help="the train step and its loss")
    staleness: StalenessConfig = section(StalenessConfig, help="how stale a record may be")
    credits: CreditConfig = section(CreditConfig, help="the feeder's credit window")
    lag: LagControlConfig = section(LagControlConfig, "lag_", help="the closed loop that resizes the window")
    delivery: DeliveryConfig = section(DeliveryConfig, help="holding records until a checkpoint covers them")
    warmstart: WarmStartConfig = section(WarmStartConfig, "warmstart_", "behaviour cloning before policy v0")
    starvation: StarvationConfig = section(StarvationConfig, help="a learner that gets no records: says why, or stops")

    def __post_init__(self):
        """The rules that span sections, in one place (each section checks its own)."""
        parse_mesh(self.mesh)  # refused here, naming --mesh
        self.credit_window().check()
        if self.lag.target is not None and not self.sync and self.lag.target > self.staleness.max_staleness:
            raise ValueError(
                f"--lag_target {self.lag.target:g} is above --max_staleness {self.staleness.max_staleness}: "
                "records that stale are dropped, so the lag could never settle there"
            )
        if self.learner.lr_decay and self.max_steps <= self.learner.lr_warmup_steps:
            raise ValueError(
                f"lr_decay needs max_steps > lr_warmup_steps ({self.learner.lr_warmup_steps}), got {self.max_steps}"
            )

    def credit_window(self) -> CreditWindow:
        """The feeder's window: the credit knobs against the batch and the layout's largest record."""
        return CreditWindow(
            self.credits, self.learner.batch_records, self.record_layout.largest, self.sync, self.learner.publish_every
        )

    def applied_staleness(self) -> StalenessConfig:
        """The staleness the run applies: the sync baseline trains only on its own version, never waits."""
        return StalenessConfig(max_staleness=0, max_mean_staleness=None) if self.sync else self.staleness

    @property
    def record_layout(self):
        return self.layout.layout
