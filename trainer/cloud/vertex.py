"""The learner as a Vertex AI `CustomJob` on a TPU slice: build, check offline, submit.

    agentic-rl vertex --project my-proj --region us-central1 \\
        --image us-docker.pkg.dev/my-proj/rl/learner:v1 --base_output_dir gs://my-bucket/learner \\
        --dry-run -- --requests_topic projects/my-proj/topics/rollout-requests ...

(`python -m trainer.cloud.vertex` is the same command.) Everything after `--` is passed to
`python -m trainer.task`. `--dry-run` (or `--dry_run`) builds the job,
checks it (the proto constructor refuses unknown field names; the learner's own argparse
checks its flags) and prints it as JSON on stdout, with a short summary on stderr (worker
pools, machines, image, service account, TensorBoard), with no network call. Without `--dry-run` the job
is submitted with `aiplatform.CustomJob(...).submit()` and Application Default
Credentials: that path needs a real project and has NOT been run from this repository.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Sequence

from core import config
from core.config import configclass, derived, knob

LEARNER_COMMAND = ("python", "-m", "trainer.task")
_GCS = (r"gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?", "a gs://bucket[/path] URI")
_TPU_CHIPS_PER_HOST = re.compile(r"^ct.*-(\d+)t$")  # ct5lp-hightpu-4t: 4 chips per host
_TENSORBOARD = re.compile(r"projects/([^/\s]+)/locations/([^/\s]+)/tensorboards/([^/\s]+)")
_RESERVED_ENV = ("AIP_", "CLUSTER_SPEC", "TF_CONFIG", "CLOUD_ML_JOB_ID")


@configclass(kw_only=True)
class VertexJobConfig:
    """Everything the learner's CustomJob needs, and how to launch it: each field is a flag
    of `agentic-rl vertex` but `learner_args` (what follows `--`). Refuses bad values on
    construction."""

    project: str = knob(help="GCP project id", matches=(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", "a GCP project id"))
    region: str = knob(
        help="a region like us-central1 (not a zone)",
        matches=(r"[a-z]+-[a-z]+[0-9]+", "a region like us-central1 (zones are refused)"),
    )
    image_uri: str = knob(
        help="learner container image URI (see Dockerfile)", flag="image", matches=(r"\S*/\S*", "a container image URI")
    )
    # Vertex derives AIP_MODEL_DIR/CHECKPOINT_DIR/... from it.
    base_output_dir: str = knob(help="gs://bucket/path", matches=_GCS)
    display_name: str = knob(
        "agentic-rl-learner", "the job's name in the console", matches=(r"(?s).{1,128}", "1-128 characters")
    )
    machine_type: str = knob("ct5lp-hightpu-4t", "learner host machine type (TPU v5e, 4 chips per host)")
    # 2x2: one v5e host
    tpu_topology: str | None = knob(
        "2x2",
        "the TPU slice, e.g. 2x2 or 4x4 ('' for none)",
        matches=(r"|[1-9][0-9]*(x[1-9][0-9]*){1,2}", "like 2x2 or 2x2x1"),
    )
    replica_count: int = knob(1, "learner hosts: workerpool0 holds 1, workerpool1 the rest", ge=1)
    staging_bucket: str | None = knob(
        None, "gs://... for the SDK's staging (unset: base_output_dir's bucket)", matches=_GCS
    )
    service_account: str | None = knob(
        None,
        "the identity the job runs as (an email); docs/DEPLOY.md lists its roles",
        matches=(r"[^@\s]+@[^@\s]+", "an email"),
    )
    tensorboard: str | None = knob(
        None,
        "projects/P/locations/L/tensorboards/ID: a Vertex AI TensorBoard (in --region) that shows the learner's "
        "logs (AIP_TENSORBOARD_LOG_DIR); needs --service_account",
        matches=(_TENSORBOARD.pattern, "projects/PROJECT/locations/REGION/tensorboards/ID"),
    )
    env: tuple[str, ...] = knob(
        (),
        "NAME=VALUE for the learner's environment (repeat the flag)",
        repeat=True,
        # Vertex sets the reserved names itself: overriding them would mislead trainer.cloud.distributed.
        matches=(
            rf"(?!{'|'.join(_RESERVED_ENV)})[A-Za-z_][A-Za-z0-9_]*=(?s:.*)",
            f"NAME=VALUE items, no NAME reserved by Vertex AI ({', '.join(n + '*' for n in _RESERVED_ENV)})",
        ),
    )
    dry_run: bool = knob(False, "build, check and print the job as JSON; no network")
    skip_learner_args_check: bool = knob(False, "do not parse the learner's flags with trainer.task's parser")
    learner_args: tuple[str, ...] = derived((), "the learner's flags: everything after --")

    def __post_init__(self):
        self._check_tensorboard()
        tpu = _TPU_CHIPS_PER_HOST.match(self.machine_type)
        if tpu and not self.tpu_topology:
            raise ValueError(f"TPU machine type {self.machine_type} needs a tpu_topology")
        if self.tpu_topology and not tpu:
            raise ValueError(f"tpu_topology given for non-TPU machine type {self.machine_type!r}")
        if tpu and self.topology_chips % int(tpu.group(1)):
            raise ValueError(
                f"topology {self.tpu_topology} ({self.topology_chips} chips) does not fill "
                f"{self.machine_type} hosts of {tpu.group(1)} chips (tpu_topology)"
            )

    def _check_tensorboard(self) -> None:
        """Vertex uploads AIP_TENSORBOARD_LOG_DIR (under base_output_dir, always set here) to
        the instance as the job's service account, and only from a job in the instance's region."""
        if self.tensorboard is None:
            return
        m = _TENSORBOARD.match(self.tensorboard)
        if self.service_account is None:
            raise ValueError(
                "tensorboard needs service_account: Vertex AI uploads the learner's logs to a TensorBoard "
                "only as the job's own service account (--service_account EMAIL)"
            )
        if m.group(2) != self.region:
            raise ValueError(
                f"tensorboard {self.tensorboard!r} is in {m.group(2)}, the job in region {self.region}: "
                "Vertex AI wants the TensorBoard in the job's region"
            )

    @property
    def topology_chips(self) -> int:
        chips = 1
        for d in (self.tpu_topology or "1").split("x"):
            chips *= int(d)
        return chips

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(item.partition("=")[::2] for item in self.env)

    @property
    def resolved_staging_bucket(self) -> str:
        return self.staging_bucket or "gs://" + self.base_output_dir[len("gs://") :].split("/")[0]


def worker_pool_specs(cfg: VertexJobConfig) -> list[dict]:
    """Vertex's distributed layout: workerpool0 is the primary (1 replica), workerpool1
    the other learner hosts, all running the same container."""
    machine = {"machine_type": cfg.machine_type}
    if cfg.tpu_topology:
        machine["tpu_topology"] = cfg.tpu_topology
    container = {
        "image_uri": cfg.image_uri,
        "command": list(LEARNER_COMMAND),
        "args": list(cfg.learner_args),
        "env": [{"name": k, "value": v} for k, v in sorted(cfg.env_vars.items())],
    }
    pool = lambda n: {"machine_spec": dict(machine), "replica_count": n, "container_spec": dict(container)}
    return [pool(1)] + ([pool(cfg.replica_count - 1)] if cfg.replica_count > 1 else [])


def build_custom_job(cfg: VertexJobConfig):
    """The `google.cloud.aiplatform_v1.types.CustomJob` proto (offline; an unknown field raises)."""
    from google.cloud.aiplatform_v1 import types

    return types.CustomJob(
        display_name=cfg.display_name,
        job_spec=types.CustomJobSpec(
            worker_pool_specs=worker_pool_specs(cfg),
            base_output_directory=types.GcsDestination(output_uri_prefix=cfg.base_output_dir),
            service_account=cfg.service_account or "",
            tensorboard=cfg.tensorboard or "",
        ),
    )


def to_sdk_job(cfg: VertexJobConfig, credentials=None):
    """The `aiplatform.CustomJob` object. With `AnonymousCredentials()` it is built offline
    (no API call happens before submit())."""
    from google.cloud import aiplatform

    return aiplatform.CustomJob(
        display_name=cfg.display_name,
        worker_pool_specs=worker_pool_specs(cfg),
        base_output_dir=cfg.base_output_dir,
        project=cfg.project,
        location=cfg.region,
        credentials=credentials,
        staging_bucket=cfg.resolved_staging_bucket,
    )


def check_learner_args(args: Sequence[str]) -> None:
    """Parse the learner's flags as trainer.task does (its config tree): typos fail here, not on a TPU."""
    from trainer.config import LearnerJobConfig  # imports JAX: only when a job's flags are checked

    try:
        config.parse(LearnerJobConfig, list(args), prog="agentic-rl learner")
    except SystemExit as e:
        raise ValueError(f"trainer.task refuses the learner args {list(args)} (see message above)") from e


def to_json(job) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(type(job).pb(job), indent=2)


def submit(cfg: VertexJobConfig, credentials=None):
    """Create the job on Vertex AI (network; untested here). Returns the aiplatform.CustomJob."""
    job = to_sdk_job(cfg, credentials)
    job.submit(service_account=cfg.service_account, tensorboard=cfg.tensorboard)
    return job


def summary(job) -> list[str]:
    """What the dry run built, in a few lines: pools, machines, image, identity, TensorBoard."""
    spec = job.job_spec
    lines = [f"Vertex AI CustomJob {job.display_name!r} (dry run: nothing submitted)"]
    for i, pool in enumerate(spec.worker_pool_specs):
        m = pool.machine_spec
        if m.tpu_topology:
            accel = f"TPU topology {m.tpu_topology}"
        else:
            accel = (
                f"accelerator {m.accelerator_type.name} x{m.accelerator_count}"
                if m.accelerator_count
                else "no accelerator"
            )
        lines.append(f"  workerpool{i}: {pool.replica_count} replica(s) of {m.machine_type}, {accel}")
    container = spec.worker_pool_specs[0].container_spec
    lines += [
        f"  image: {container.image_uri}",
        f"  command: {' '.join(container.command)} ({len(container.args)} learner args)",
        f"  base output dir: {spec.base_output_directory.output_uri_prefix}",
        "  service account: "
        + (spec.service_account or "unset (Vertex AI's default identity, not a least-privilege one)"),
        f"  tensorboard: {spec.tensorboard or 'none'}",
    ]
    return lines


def parse_cli(argv: Sequence[str]) -> VertexJobConfig:
    """The launcher's flags, then `--` and the learner's; a bad value exits naming its flag."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    own = ["--dry_run" if a == "--dry-run" else a for a in argv[:cut]]  # both spellings are documented
    cfg = config.parse(VertexJobConfig, own, description=__doc__, prog="agentic-rl vertex")
    return dataclasses.replace(cfg, learner_args=tuple(argv[cut + 1 :]))


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_cli(sys.argv[1:] if argv is None else argv)
    if not cfg.skip_learner_args_check:
        check_learner_args(cfg.learner_args)
    job = build_custom_job(cfg)
    if cfg.dry_run:
        from google.auth.credentials import AnonymousCredentials

        to_sdk_job(cfg, AnonymousCredentials())  # the SDK accepts it too, still offline
        print("\n".join(summary(job)), file=sys.stderr)  # stdout stays the job's JSON
        print(to_json(job))
        return 0
    sdk_job = submit(cfg)
    print(sdk_job.resource_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
