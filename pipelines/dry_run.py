"""What `--runner=DataflowRunner --dry_run=True` built, said in a few lines.

Beam's dry run (DataflowRunner.run_pipeline, apache-beam 2.77) translates the graph, builds
the setup_file's sdist locally, builds the Job request and returns before creating an API
client. The Job's `environment` (worker pool, service account, sdkPipelineOptions) is
normally filled in while staging: `fill_environment` builds it offline with
apiclient.Environment, as staging would, so the dry-run job carries
`environment.serviceAccountEmail` and the worker pool; `summary` reads the job back.
Nothing here reaches the network.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.portability.api import beam_runner_api_pb2 as rapi
from apache_beam.runners.dataflow.internal import apiclient

NO_SERVICE_ACCOUNT = "unset: the Compute Engine default service account (often roles/editor), not least privilege"


# The environment's enum, by the --autoscaling_algorithm value that sets it.
_ALGORITHMS = {"AUTOSCALING_ALGORITHM_BASIC": "THROUGHPUT_BASED", "AUTOSCALING_ALGORITHM_NONE": "NONE"}


def is_dataflow_dry_run(options) -> bool:
    """As DataflowRunner decides it: any non-empty --dry_run value."""
    runner = options.view_as(StandardOptions).runner or ""
    return runner.endswith("DataflowRunner") and bool(options.view_as(TestOptions).dry_run)


def staged_artifacts(job) -> dict[str, str]:
    """staged name -> local file, for every artifact the workers would receive."""
    staged = {}
    for environment in job.proto_pipeline.components.environments.values():
        for dep in environment.dependencies:
            name = rapi.ArtifactStagingToRolePayload.FromString(dep.role_payload).staged_name
            staged[name] = rapi.ArtifactFilePayload.FromString(dep.type_payload).path
    return staged


def remove_local_staging(job) -> None:
    """The sdist and the other artifacts sit in a temp dir the dry run leaves behind."""
    tmp = Path(tempfile.gettempdir())
    for path in {Path(a).parent for a in staged_artifacts(job).values()}:
        if path.is_relative_to(tmp) and path != tmp:
            shutil.rmtree(path, ignore_errors=True)


def fill_environment(job):
    """The Job's environment as staging would send it (offline); set on job.proto, returned."""
    gcs = job.options.view_as(GoogleCloudOptions)
    log = logging.getLogger(apiclient.__name__)
    level = log.level
    log.setLevel(logging.WARNING)  # it logs every option on one INFO line: the summary says what matters
    try:
        env = apiclient.Environment(
            packages=[],
            options=job.options,
            environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
            proto_pipeline_staged_url=f"{gcs.staging_location or gcs.temp_location}/pipeline.pb",
            proto_pipeline=job.proto_pipeline,
        ).proto
    finally:
        log.setLevel(level)
    job.proto.environment = env
    return env


def steps(job) -> list[str]:
    """The pipeline's top-level transform labels, in the order they were applied."""
    comps = job.proto_pipeline.components
    names = []
    for root_id in job.proto_pipeline.root_transform_ids:
        root = comps.transforms[root_id]
        ids = root.subtransforms if root.subtransforms and not root.spec.urn else [root_id]
        names += [comps.transforms[i].unique_name for i in ids]
    return names


def _size(path: str) -> str:
    try:
        n = os.path.getsize(path)
    except OSError:
        return "missing"
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def _accelerator(job) -> str:
    gcs = job.options.view_as(GoogleCloudOptions)
    found = [o.partition("=")[2] for o in gcs.dataflow_service_options or [] if o.startswith("worker_accelerator=")]
    hints = job.options.view_as(StandardOptions).resource_hints or []
    found += [h.partition("=")[2] for h in hints if h.startswith("accelerator=")]
    return "; ".join(found) or "none"


def summary(job) -> list[str]:
    """The job in a few lines: steps, streaming or batch, staged package, workers,
    autoscaling, service account. Fills the job's environment if it is still empty."""
    env = job.proto.environment if job.proto.environment.worker_pools else fill_environment(job)
    pool = env.worker_pools[0]
    staged = staged_artifacts(job)
    package = (
        f"{Path(staged['workflow.tar.gz']).name} as workflow.tar.gz ({_size(staged['workflow.tar.gz'])})"
        if "workflow.tar.gz" in staged
        else "none (no --setup_file: the workers get no copy of this project)"
    )
    others = ", ".join(f"{name} ({_size(path)})" for name, path in sorted(staged.items()) if name != "workflow.tar.gz")
    scaling = pool.autoscaling_settings
    algorithm = _ALGORITHMS.get(scaling.algorithm.name, scaling.algorithm.name) if scaling.algorithm else "default"
    return [
        f"Dataflow job {job.proto.name} (dry run: built locally, nothing uploaded or submitted)",
        f"  type: {'streaming' if job.proto.type.name == 'JOB_TYPE_STREAMING' else 'batch'} ({job.proto.type.name})",
        f"  steps: {', '.join(steps(job))}",
        f"  staged package: {package}",
        f"  other staged files: {others or 'none'}",
        f"  workers: machine type {pool.machine_type or 'Dataflow default'}, accelerator {_accelerator(job)}, "
        f"harness threads {pool.num_threads_per_worker or 'default'}",
        f"  container image: {pool.worker_harness_container_image or 'default'}",
        f"  autoscaling: {algorithm}, initial workers {pool.num_workers or 'default'}, "
        f"max workers {scaling.max_num_workers or 'default'}",
        f"  service account: {env.service_account_email or NO_SERVICE_ACCOUNT}",
    ]
