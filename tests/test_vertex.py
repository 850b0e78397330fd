"""The learner's Vertex AI job, offline: CustomJob build and validation, the dry-run CLI
(with every network connection refused), the Dockerfile's text, and the AIP_*/CLUSTER_SPEC
parsing that places a process in a multi-host job."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from tests import _no_network as no_network
from trainer.cloud import distributed, vertex

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMAGE = "us-docker.pkg.dev/my-proj/rl/learner:v1"
SA = "learner@my-proj.iam.gserviceaccount.com"
TENSORBOARD = "projects/my-proj/locations/europe-west4/tensorboards/4242"
LEARNER_ARGS = (
    "--requests_topic",
    "projects/my-proj/topics/rollout-requests",
    "--records_subscription",
    "projects/my-proj/subscriptions/records-sub",
    "--policy_root",
    "gs://my-bucket/policy-store",
    "--max_steps",
    "1000",
)


def config(**overrides) -> vertex.VertexJobConfig:
    kw = dict(
        project="my-proj",
        region="us-central1",
        image_uri=IMAGE,
        base_output_dir="gs://my-bucket/learner",
        learner_args=LEARNER_ARGS,
    )
    return vertex.VertexJobConfig(**{**kw, **overrides})


def test_builds_a_tpu_v5e_2x2_job():
    from google.cloud.aiplatform_v1 import types

    job = vertex.build_custom_job(
        config(service_account="learner@my-proj.iam.gserviceaccount.com", env=("JAX_LOG_COMPILES=0",))
    )
    assert isinstance(job, types.CustomJob)
    (pool,) = job.job_spec.worker_pool_specs
    assert pool.machine_spec.machine_type == "ct5lp-hightpu-4t"
    assert pool.machine_spec.tpu_topology == "2x2"
    assert pool.replica_count == 1
    assert pool.container_spec.image_uri == IMAGE
    assert list(pool.container_spec.command) == ["python", "-m", "trainer.task"]
    assert tuple(pool.container_spec.args) == LEARNER_ARGS
    assert [(e.name, e.value) for e in pool.container_spec.env] == [("JAX_LOG_COMPILES", "0")]
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://my-bucket/learner"
    assert job.job_spec.service_account == "learner@my-proj.iam.gserviceaccount.com"


def test_multi_host_uses_a_primary_pool_and_a_worker_pool():
    job = vertex.build_custom_job(config(tpu_topology="4x4", replica_count=4))
    primary, workers = job.job_spec.worker_pool_specs
    assert (primary.replica_count, workers.replica_count) == (1, 3)
    assert workers.machine_spec == primary.machine_spec
    assert workers.container_spec == primary.container_spec


def test_sdk_job_builds_offline_with_anonymous_credentials():
    from google.auth.credentials import AnonymousCredentials

    sdk_job = vertex.to_sdk_job(config(), AnonymousCredentials())
    assert sdk_job.job_spec.worker_pool_specs == vertex.build_custom_job(config()).job_spec.worker_pool_specs


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(region="us_central1"), "region"),
        (dict(region="us-central1-a"), "region"),  # a zone
        (dict(region="US-CENTRAL1"), "region"),
        (dict(image_uri=""), "image must be"),  # its flag: --image
        (dict(image_uri=None), "image must be set"),
        (dict(base_output_dir="/tmp/out"), "base_output_dir"),
        (dict(base_output_dir="s3://bucket/out"), "base_output_dir"),
        (dict(replica_count=0), "replica_count"),
        (dict(replica_count=-2), "replica_count"),
        (dict(project="My Project"), "project"),
        (dict(staging_bucket="my-bucket"), "staging_bucket"),
        (dict(tpu_topology="2by2"), "tpu_topology"),
        (dict(tpu_topology=None), "needs a tpu_topology"),
        (dict(tpu_topology="1x2"), "does not fill"),  # 2 chips on a 4-chip host
        (dict(machine_type="n2-standard-8"), "non-TPU"),
        (dict(env=("CLUSTER_SPEC={}",)), "reserved"),
        (dict(env=("AIP_MODEL_DIR=gs://x",)), "reserved"),
        (dict(env=("NOEQUALS",)), "NAME=VALUE"),
        (dict(service_account="not-an-email"), "service_account"),
        (dict(tensorboard=TENSORBOARD.replace("europe-west4", "us-central1")), "tensorboard needs service_account"),
        (dict(tensorboard="tb-4242", service_account=SA), "must be projects/PROJECT/locations/REGION/tensorboards/ID"),
        (dict(tensorboard=TENSORBOARD, service_account=SA), "Vertex AI wants the TensorBoard in the job's region"),
    ],
)
def test_invalid_configs_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        config(**overrides)


def test_a_tensorboard_is_attached_and_submitted_with_the_service_account(monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    cfg = config(region="europe-west4", service_account=SA, tensorboard=TENSORBOARD)
    spec = vertex.build_custom_job(cfg).job_spec
    assert (spec.tensorboard, spec.service_account) == (TENSORBOARD, SA)
    assert spec.base_output_directory.output_uri_prefix == "gs://my-bucket/learner"  # where AIP_TENSORBOARD_LOG_DIR is
    assert vertex.build_custom_job(config()).job_spec.tensorboard == ""
    calls = []  # submit() is the network call: record what it is given instead
    monkeypatch.setattr(aiplatform.CustomJob, "submit", lambda self, **kw: calls.append(kw))
    vertex.submit(cfg, AnonymousCredentials())
    assert calls == [{"service_account": SA, "tensorboard": TENSORBOARD}]


def test_unknown_field_names_raise_when_the_proto_is_built():
    from google.cloud.aiplatform_v1 import types

    with pytest.raises(ValueError, match="machine_typ"):
        types.WorkerPoolSpec(machine_spec={"machine_typ": "ct5lp-hightpu-4t"})


def test_learner_args_are_checked_with_the_learners_parser():
    vertex.check_learner_args(LEARNER_ARGS)
    with pytest.raises(ValueError, match="refuses"):
        vertex.check_learner_args(LEARNER_ARGS + ("--max_stepz", "3"))


# Runs the CLI with every TCP/UDP connection and DNS lookup refused (an audit hook), and
# proxies pointing at a closed port: a network call would fail the command, not hang.
_NO_NETWORK = no_network.script("trainer.cloud.vertex")


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
        "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent.json",
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.run(
        [sys.executable, "-c", _NO_NETWORK, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.e2e
def test_cli_dry_run_prints_the_job_as_json_without_network():
    start = time.monotonic()
    out = run_cli(
        "--project",
        "my-proj",
        "--region",
        "europe-west4",
        "--image",
        IMAGE,
        "--base_output_dir",
        "gs://my-bucket/learner",
        "--env",
        "A=1",
        "--service_account",
        SA,
        "--tensorboard",
        TENSORBOARD,
        "--dry-run",
        "--",
        *LEARNER_ARGS,
    )
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - start < 60
    job = json.loads(out.stdout)  # stdout is the job alone; the summary goes to stderr
    (pool,) = job["jobSpec"]["workerPoolSpecs"]
    assert pool["machineSpec"] == {"machineType": "ct5lp-hightpu-4t", "tpuTopology": "2x2"}
    assert pool["containerSpec"]["args"] == list(LEARNER_ARGS)
    assert pool["containerSpec"]["env"] == [{"name": "A", "value": "1"}]
    assert (job["jobSpec"]["serviceAccount"], job["jobSpec"]["tensorboard"]) == (SA, TENSORBOARD)
    summary = out.stderr.splitlines()
    for line in [
        "Vertex AI CustomJob 'agentic-rl-learner' (dry run: nothing submitted)",
        "  workerpool0: 1 replica(s) of ct5lp-hightpu-4t, TPU topology 2x2",
        f"  image: {IMAGE}",
        f"  command: python -m trainer.task ({len(LEARNER_ARGS)} learner args)",
        "  base output dir: gs://my-bucket/learner",
        f"  service account: {SA}",
        f"  tensorboard: {TENSORBOARD}",
    ]:
        assert line in summary, (line, out.stderr)


def test_summary_names_every_pool_and_an_unset_identity():
    lines = vertex.summary(vertex.build_custom_job(config(tpu_topology="4x4", replica_count=4)))
    assert "  workerpool0: 1 replica(s) of ct5lp-hightpu-4t, TPU topology 4x4" in lines
    assert "  workerpool1: 3 replica(s) of ct5lp-hightpu-4t, TPU topology 4x4" in lines
    assert "  service account: unset (Vertex AI's default identity, not a least-privilege one)" in lines
    assert "  tensorboard: none" in lines


@pytest.mark.e2e
def test_cli_refuses_a_bad_config_and_bad_learner_args():
    base = ["--project", "my-proj", "--image", IMAGE, "--base_output_dir", "gs://b-1/x", "--dry-run"]
    bad_region = run_cli(*base, "--region", "us-central1-a", "--", *LEARNER_ARGS)
    assert bad_region.returncode == 2 and "region" in bad_region.stderr
    bad_args = run_cli(*base, "--region", "us-central1", "--", "--no_such_flag")
    assert bad_args.returncode != 0 and "refuses the learner args" in bad_args.stderr


def test_dockerfile_installs_the_project_with_jax_tpu_and_runs_the_learner():
    text = (ROOT / "Dockerfile").read_text()
    instructions = [
        ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert instructions[0].startswith("FROM python:3.11-slim")
    runs = " ".join(i for i in instructions if i.startswith("RUN "))
    assert re.search(r"pip install (\S+ )*\.( |$)", runs), "the project itself is installed"
    assert '"jax[tpu]' in runs
    copied = {i.split()[1].rstrip("/") for i in instructions if i.startswith("COPY ")}
    assert {"setup.py", "trainer", "environments"} <= copied
    assert instructions[-1] == 'ENTRYPOINT ["python", "-m", "trainer.task"]'


# --- trainer.cloud.distributed -----------------------------------------------------------------

SINGLE_HOST = {
    "cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"]},
    "environment": "cloud",
    "task": {"type": "workerpool0", "index": 0},
    "job": {},
}


def four_hosts(task_type: str, index: int) -> dict:
    return {
        "cluster": {
            "workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
            "workerpool1": [f"cmle-training-workerpool1-ab-{i}:2222" for i in range(3)],
        },
        "environment": "cloud",
        "task": {"type": task_type, "index": index, "trial": "1"},
        "job": {},
    }


AIP = {
    "CLOUD_ML_JOB_ID": "1234567890",
    "AIP_MODEL_DIR": "gs://b/learner/model/",
    "AIP_CHECKPOINT_DIR": "gs://b/learner/checkpoints/",
    "AIP_TENSORBOARD_LOG_DIR": "gs://b/learner/logs/",
}


def test_local_environment_is_one_process():
    env = distributed.read_vertex_env({})
    assert not env.on_vertex and env.checkpoint_dir is None
    assert (env.num_processes, env.process_id, env.coordinator_address) == (1, 0, None)
    assert distributed.maybe_initialize_distributed(env, initialize=pytest.fail) == distributed.DistributedInfo()


def test_single_host_vertex_job_reads_dirs_and_does_not_initialize():
    env = distributed.read_vertex_env({**AIP, "CLUSTER_SPEC": json.dumps(SINGLE_HOST)})
    assert env.on_vertex and env.job_id == "1234567890"
    assert env.checkpoint_dir == "gs://b/learner/checkpoints/"
    assert env.model_dir == "gs://b/learner/model/" and env.tensorboard_log_dir == "gs://b/learner/logs/"
    assert (env.num_processes, env.process_id) == (1, 0)
    info = distributed.maybe_initialize_distributed(env, initialize=pytest.fail)
    assert not info.initialized and info.is_primary and distributed.is_primary(info)


@pytest.mark.parametrize(
    "task_type, index, process_id", [("workerpool0", 0, 0), ("workerpool1", 0, 1), ("workerpool1", 2, 3)]
)
def test_four_hosts_initialize_jax_with_the_primary_as_coordinator(task_type, index, process_id):
    env = distributed.read_vertex_env({**AIP, "CLUSTER_SPEC": json.dumps(four_hosts(task_type, index))})
    assert env.trial == "1" and env.num_processes == 4 and env.process_id == process_id
    calls = []
    info = distributed.maybe_initialize_distributed(env, initialize=lambda **kw: calls.append(kw))
    assert calls == [
        dict(coordinator_address="cmle-training-workerpool0-ab-0:2222", num_processes=4, process_id=process_id)
    ]
    assert info.initialized and info.process_count == 4 and info.is_primary == (process_id == 0)
    distributed.maybe_initialize_distributed(env, coordinator_port=8476, initialize=lambda **kw: calls.append(kw))
    assert calls[-1]["coordinator_address"] == "cmle-training-workerpool0-ab-0:8476"


def test_tf_config_is_read_when_cluster_spec_is_absent():
    tf_config = {
        "cluster": {"chief": ["training-workerpool0-x-0:2222"], "worker": ["training-workerpool1-x-0:2222"]},
        "environment": "cloud",
        "task": {"type": "worker", "index": 0, "cloud": "y"},
    }
    env = distributed.read_vertex_env({"TF_CONFIG": json.dumps(tf_config)})
    assert (env.task_type, env.num_processes, env.process_id) == ("workerpool1", 2, 1)


@pytest.mark.parametrize(
    "spec",
    [
        "not json",
        json.dumps({"cluster": {"workerpool0": ["h:2222"]}, "task": {"type": "workerpool1", "index": 0}}),
        json.dumps({"cluster": {"workerpool0": ["h:2222"]}, "task": {"type": "workerpool0", "index": 1}}),
        json.dumps({"cluster": {"workerpool0": ["no-port"]}, "task": {"type": "workerpool0", "index": 0}}),
    ],
)
def test_malformed_cluster_specs_are_refused(spec):
    with pytest.raises(ValueError):
        distributed.read_vertex_env({"CLUSTER_SPEC": spec})


def test_evaluator_pool_is_not_a_learner_process():
    spec = four_hosts("workerpool1", 0)
    spec["cluster"]["workerpool3"] = ["cmle-training-workerpool3-ab-0:2222"]
    spec["task"] = {"type": "workerpool3", "index": 0}
    env = distributed.read_vertex_env({"CLUSTER_SPEC": json.dumps(spec)})
    with pytest.raises(ValueError, match="not a learner pool"):
        distributed.maybe_initialize_distributed(env, initialize=lambda **kw: None)
