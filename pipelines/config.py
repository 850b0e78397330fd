"""RolloutJobConfig: the rollout job's one config tree, from which its flags are generated.

    cfg = config.build(RolloutJobConfig, requests_subscription=..., records_topic=..., policy_root=...)
    argv = [*beam_flags, *config.to_argv(cfg)]         # what `agentic-rl rollout` parses back

Sections: `io` (where requests come from and records go), `layout` (the record layout,
shared with the learner), `engine` (rollout/engine_config.py) and `packing`
(pipelines/packing_config.py), plus the job's own `heartbeat_s`. The flags are flat and
keep their names (`--engine_slots`, `--buckets`, `--window_s`). A section holds only what
is set on it: the workers take the policy store from `io` and the trajectory cap from
`layout`, the packer its record shapes from `layout`, passed beside their sections where
pipelines/job.py builds them. Beam's own flags (the runner, the
project, --streaming) stay Beam's: pipelines/options.py registers this tree beside them
and builds it from Beam's options (`rollout_config`).
"""

from __future__ import annotations

from core import config
from core.config import configclass, knob, section
from core.contracts.record_shape import LayoutConfig
from pipelines.packing_config import PackingConfig, check_records_fit_messages
from rollout.engine_config import EngineConfig

# Not argparse-required: Beam parses every registered options class for every pipeline in
# the process (tests included), so required flags would break those; `missing` says.
REQUIRED_IO = ("requests_subscription", "records_topic", "policy_root")


@configclass
class RolloutIOConfig:
    requests_subscription: str | None = knob(None, "projects/P/subscriptions/S carrying rollout requests", wiring=True)
    records_topic: str | None = knob(None, "projects/P/topics/T for packed records", wiring=True)
    dead_letter_topic: str | None = knob(
        None, "projects/P/topics/T for unrunnable requests (unset: logged)", wiring=True
    )
    policy_root: str | None = knob(None, "policy store root: a directory or gs://…", wiring=True)

    @property
    def missing(self) -> list[str]:
        return [f"--{name}" for name in REQUIRED_IO if not getattr(self, name)]


@configclass
class RolloutJobConfig:
    io: RolloutIOConfig = section(RolloutIOConfig, help="Pub/Sub and the policy store")
    layout: LayoutConfig = section(LayoutConfig, help="the record layout (the learner's too)")
    engine: EngineConfig = section(EngineConfig, help="each worker's inference engine and episodes")
    packing: PackingConfig = section(PackingConfig, help="packing trajectories into records")
    heartbeat_s: float = knob(0.1, "DirectRunner only: keep-alive interval so timers fire on time (0 = off)", ge=0)
    dofn_per_bundle: bool = knob(
        False,
        "DirectRunner only: Beam's own fresh unpickled DoFn for every bundle (off: one per executor "
        "thread, pipelines/direct_runner.py)",
    )

    def __post_init__(self):
        """The rules that span sections (each section checks its own)."""
        layout = self.layout.layout
        self.engine.check_fits(layout.trajectory_len)  # an episode fits one record row
        check_records_fit_messages(layout)


def from_values(values) -> RolloutJobConfig:
    """The tree from parsed flags: a dict by dest (Beam's `get_all_options()`), an argparse
    Namespace or a Beam options view. Refuses a bad setting with a ValueError naming it."""
    return config.from_namespace(RolloutJobConfig, values)
