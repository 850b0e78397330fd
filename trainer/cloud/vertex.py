"""The learner as a Vertex AI `CustomJob` on a TPU slice: build, check offline, submit.

    python -m trainer.cloud.vertex --project my-proj --region us-central1 \\
        --image us-docker.pkg.dev/my-proj/rl/learner:v1 --base_output_dir gs://my-bucket/learner \\
        --dry-run -- --requests_topic projects/my-proj/topics/rollout-requests ...

Everything after `--` is passed to `python -m trainer.task`. `--dry-run` builds the job,
checks it (the proto constructor refuses unknown field names; the learner's own argparse
checks its flags) and prints it as JSON, with no network call. Without `--dry-run` the job
is submitted with `aiplatform.CustomJob(...).submit()` and Application Default
Credentials: that path needs a real project and has NOT been run from this repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence

LEARNER_COMMAND = ("python", "-m", "trainer.task")
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")  # us-central1, europe-west4; not a zone
_TOPOLOGY = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")
_TPU_CHIPS_PER_HOST = re.compile(r"^ct.*-(\d+)t$")  # ct5lp-hightpu-4t: 4 chips per host
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Vertex sets these itself; overriding them would mislead trainer.cloud.distributed.
_RESERVED_ENV = ("AIP_", "CLUSTER_SPEC", "TF_CONFIG", "CLOUD_ML_JOB_ID")


def _gcs(uri: str | None, what: str, required: bool = True) -> None:
    if uri is None and not required:
        return
    if not (isinstance(uri, str) and re.match(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$", uri)):
        raise ValueError(f"{what} must be a gs://bucket[/path] URI, got {uri!r}")


@dataclasses.dataclass(frozen=True)
class LearnerJobConfig:
    """Everything the learner's CustomJob needs; refuses bad values on construction."""

    project: str
    region: str
    image_uri: str
    base_output_dir: str  # gs://…; Vertex derives AIP_MODEL_DIR/CHECKPOINT_DIR/… from it
    display_name: str = "agentic-rl-learner"
    machine_type: str = "ct5lp-hightpu-4t"  # TPU v5e, 4 chips per host
    tpu_topology: str | None = "2x2"  # one ct5lp-hightpu-4t host
    replica_count: int = 1  # learner hosts: workerpool0 holds 1, workerpool1 the rest
    learner_args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    staging_bucket: str | None = None  # default: base_output_dir's bucket
    service_account: str | None = None

    def __post_init__(self):
        if not _PROJECT.match(self.project or ""):
            raise ValueError(f"project {self.project!r} is not a GCP project id")
        if not _REGION.match(self.region or ""):
            raise ValueError(f"region {self.region!r} is not a region like us-central1 (zones are refused)")
        if not self.image_uri or any(c.isspace() for c in self.image_uri) or "/" not in self.image_uri:
            raise ValueError(f"image_uri {self.image_uri!r} is not a container image URI")
        _gcs(self.base_output_dir, "base_output_dir")
        _gcs(self.staging_bucket, "staging_bucket", required=False)
        if not self.display_name or len(self.display_name) > 128:
            raise ValueError("display_name must be 1-128 characters")
        if not isinstance(self.replica_count, int) or self.replica_count < 1:
            raise ValueError(f"replica_count must be an int >= 1, got {self.replica_count!r}")
        if self.service_account is not None and not re.match(r"^[^@\s]+@[^@\s]+$", self.service_account):
            raise ValueError(f"service_account {self.service_account!r} is not an email")
        for name, value in self.env.items():
            if not _ENV_NAME.match(name) or name.startswith(_RESERVED_ENV):
                raise ValueError(f"env var {name!r} is invalid or reserved by Vertex AI")
            if not isinstance(value, str):
                raise ValueError(f"env var {name} must be a string")
        object.__setattr__(self, "learner_args", tuple(self.learner_args))
        tpu = _TPU_CHIPS_PER_HOST.match(self.machine_type or "")
        if tpu and not self.tpu_topology:
            raise ValueError(f"TPU machine type {self.machine_type} needs a tpu_topology")
        if self.tpu_topology is not None:
            if not tpu:
                raise ValueError(f"tpu_topology given for non-TPU machine type {self.machine_type!r}")
            if not _TOPOLOGY.match(self.tpu_topology):
                raise ValueError(f"tpu_topology {self.tpu_topology!r} is not like 2x2 or 2x2x1")
            if self.topology_chips % int(tpu.group(1)):
                raise ValueError(
                    f"topology {self.tpu_topology} ({self.topology_chips} chips) does not fill "
                    f"{self.machine_type} hosts of {tpu.group(1)} chips (tpu_topology)"
                )

    @property
    def topology_chips(self) -> int:
        chips = 1
        for d in (self.tpu_topology or "1").split("x"):
            chips *= int(d)
        return chips

    @property
    def resolved_staging_bucket(self) -> str:
        return self.staging_bucket or "gs://" + self.base_output_dir[len("gs://") :].split("/")[0]


def worker_pool_specs(cfg: LearnerJobConfig) -> list[dict]:
    """Vertex's distributed layout: workerpool0 is the primary (1 replica), workerpool1
    the other learner hosts, all running the same container."""
    machine = {"machine_type": cfg.machine_type}
    if cfg.tpu_topology:
        machine["tpu_topology"] = cfg.tpu_topology
    container = {
        "image_uri": cfg.image_uri,
        "command": list(LEARNER_COMMAND),
        "args": list(cfg.learner_args),
        "env": [{"name": k, "value": v} for k, v in sorted(cfg.env.items())],
    }
    pool = lambda n: {"machine_spec": dict(machine), "replica_count": n, "container_spec": dict(container)}
    return [pool(1)] + ([pool(cfg.replica_count - 1)] if cfg.replica_count > 1 else [])


def build_custom_job(cfg: LearnerJobConfig):
    """The `google.cloud.aiplatform_v1.types.CustomJob` proto (offline; an unknown field raises)."""
    from google.cloud.aiplatform_v1 import types

    return types.CustomJob(
        display_name=cfg.display_name,
        job_spec=types.CustomJobSpec(
            worker_pool_specs=worker_pool_specs(cfg),
            base_output_directory=types.GcsDestination(output_uri_prefix=cfg.base_output_dir),
            service_account=cfg.service_account or "",
        ),
    )


def to_sdk_job(cfg: LearnerJobConfig, credentials=None):
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
    """Parse the learner's flags with trainer.task's own parser: typos fail here, not on a TPU."""
    from trainer import task

    try:
        task.parse_args(list(args))
    except SystemExit as e:
        raise ValueError(f"trainer.task refuses the learner args {list(args)} (see message above)") from e


def to_json(job) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(type(job).pb(job), indent=2)


def submit(cfg: LearnerJobConfig, credentials=None):
    """Create the job on Vertex AI (network; untested here). Returns the aiplatform.CustomJob."""
    job = to_sdk_job(cfg, credentials)
    job.submit(service_account=cfg.service_account)
    return job


def parse_cli(argv: Sequence[str]) -> tuple[LearnerJobConfig, bool, bool]:
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    own, learner = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(
        prog="python -m trainer.cloud.vertex", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--project", required=True)
    p.add_argument("--region", required=True)
    p.add_argument("--image", required=True, help="learner container image URI (see Dockerfile)")
    p.add_argument("--base_output_dir", required=True, help="gs://bucket/path")
    p.add_argument("--display_name", default=LearnerJobConfig.display_name)
    p.add_argument("--machine_type", default=LearnerJobConfig.machine_type)
    p.add_argument("--tpu_topology", default=LearnerJobConfig.tpu_topology, help="'' for none")
    p.add_argument("--replica_count", type=int, default=1)
    p.add_argument("--staging_bucket", default=None)
    p.add_argument("--service_account", default=None)
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument(
        "--dry-run",
        "--dry_run",
        dest="dry_run",
        action="store_true",
        help="build, check and print the job as JSON; no network",
    )
    p.add_argument("--skip_learner_args_check", action="store_true")
    a = p.parse_args(own)
    env = {}
    for item in a.env:
        name, sep, value = item.partition("=")
        if not sep:
            p.error(f"--env wants NAME=VALUE, got {item!r}")
        env[name] = value
    try:
        cfg = LearnerJobConfig(
            project=a.project,
            region=a.region,
            image_uri=a.image,
            base_output_dir=a.base_output_dir,
            display_name=a.display_name,
            machine_type=a.machine_type,
            tpu_topology=a.tpu_topology or None,
            replica_count=a.replica_count,
            learner_args=tuple(learner),
            env=env,
            staging_bucket=a.staging_bucket,
            service_account=a.service_account,
        )
    except ValueError as e:
        p.error(str(e))
    return cfg, a.dry_run, not a.skip_learner_args_check


def main(argv: Sequence[str] | None = None) -> int:
    cfg, dry_run, check_args = parse_cli(sys.argv[1:] if argv is None else argv)
    if check_args:
        check_learner_args(cfg.learner_args)
    job = build_custom_job(cfg)
    if dry_run:
        from google.auth.credentials import AnonymousCredentials

        to_sdk_job(cfg, AnonymousCredentials())  # the SDK accepts it too, still offline
        print(to_json(job))
        return 0
    sdk_job = submit(cfg)
    print(sdk_job.resource_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
