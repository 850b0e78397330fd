"""The rollout job, built for Dataflow offline: DataflowRunner with --dry_run=True.

What the dry run does here (apache-beam 2.77, DataflowRunner.run_pipeline): it applies
the Dataflow overrides, translates the graph to the portable pipeline proto, builds the
setup_file's sdist locally (`python -m build`, a dependency) and records it as a
staged artifact, adds the streaming experiments, builds the Job request object, and returns
before creating an API client: nothing is uploaded to GCS, no credentials are read, no
network is used. The Job's `environment` (sdkPipelineOptions, temp storage) is normally
filled in while staging; pipelines/dry_run.py builds that part with apiclient.Environment,
also offline, and `agentic-rl rollout ... --dry_run=True` prints a summary of the job.
"""

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import DebugOptions, PipelineOptions, SetupOptions, StandardOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2 as rapi
from apache_beam.runners.dataflow.internal import apiclient

from pipelines import dry_run
from pipelines import job as rollout
from pipelines.dry_run import remove_local_staging, staged_artifacts
from pipelines.options import rollout_config
from pipelines.pubsub_write import WriteRecordsToPubSub
from tests import _no_network as no_network

# The dry run builds the sdist with `python -m build` in another process.
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
PROJECT = "rl-project-123"  # Beam wants an id of the real form
REQUESTS = f"projects/{PROJECT}/subscriptions/rollout-requests"
RECORDS = f"projects/{PROJECT}/topics/packed-trajectories"
ROLLOUT_SA = f"rollout@{PROJECT}.iam.gserviceaccount.com"
ARGV = [
    "--runner=DataflowRunner",
    "--dry_run=True",
    f"--project={PROJECT}",
    "--region=us-central1",
    "--temp_location=gs://rl-bucket/tmp",
    "--streaming",
    f"--setup_file={REPO / 'setup.py'}",
    f"--requests_subscription={REQUESTS}",
    f"--records_topic={RECORDS}",
    "--policy_root=gs://rl-bucket/store",
    "--buckets=128,256",
    "--window_s=30",
    "--content_dedup",
    "--engine_slots=16",
    f"--service_account_email={ROLLOUT_SA}",
]


@pytest.fixture(scope="module")
def job():
    options = PipelineOptions(ARGV)
    p = beam.Pipeline(options=options)
    rollout.build(p, options)  # build(p, options) is the graph function, as run() calls it
    result = p.run()  # returns at once: a dry run submits nothing
    yield result.job
    remove_local_staging(result.job)


def transforms_with(job, urn: str):
    return [t for t in job.proto_pipeline.components.transforms.values() if t.spec.urn == urn]


def test_it_is_a_streaming_job(job):
    assert job.proto.type.name == "JOB_TYPE_STREAMING"
    assert job.options.view_as(StandardOptions).streaming
    assert "enable_streaming_engine" in job.options.view_as(DebugOptions).experiments


def dofn(transform):
    """The DoFn a ParDo step runs, as a Dataflow worker would unpickle it."""
    from apache_beam.internal import pickler

    payload = rapi.ParDoPayload.FromString(transform.spec.payload)
    return pickler.loads(payload.do_fn.payload)[0]


def test_reads_requests_and_writes_records_on_pubsub(job):
    reads = [
        rapi.PubSubReadPayload.FromString(t.spec.payload)
        for t in transforms_with(job, common_urns.composites.PUBSUB_READ.urn)
    ]
    assert [(r.subscription, r.with_attributes) for r in reads] == [(REQUESTS, True)]
    # Records go out through our publisher DoFn (one client per worker process), not Beam's sink.
    assert not transforms_with(job, common_urns.composites.PUBSUB_WRITE.urn)
    (publish,) = [
        t for t in job.proto_pipeline.components.transforms.values() if t.unique_name == "WriteRecords/Publish"
    ]
    fn = dofn(publish)
    assert type(fn).__module__ == WriteRecordsToPubSub.__module__ and fn.topic == RECORDS


def test_setup_file_is_carried_and_staged(job):
    assert job.options.view_as(SetupOptions).setup_file == str(REPO / "setup.py")
    # What the service would receive as sdkPipelineOptions.
    env = apiclient.Environment(
        packages=[],
        options=job.options,
        environment_version="8",
        proto_pipeline_staged_url="gs://rl-bucket/tmp/pipeline.pb",
        proto_pipeline=job.proto_pipeline,
    ).proto
    sent = dict(env.sdk_pipeline_options["options"])
    assert sent["setup_file"] == str(REPO / "setup.py") and sent["streaming"] is True
    assert sent["buckets"] == "128,256" and sent["window_s"] == 30.0
    # The workers install the project from the sdist the dry run built from setup.py.
    staged = staged_artifacts(job)
    assert "workflow.tar.gz" in staged
    with tarfile.open(staged["workflow.tar.gz"]) as sdist:
        names = sdist.getnames()
    for module in ("pipelines/job.py", "pipelines/pack_transform.py", "core/contracts/records.py", "setup.py"):
        assert any(n.endswith(module) for n in names), module


def test_the_flags_parse_as_the_workers_will_see_them(job):
    """A worker re-creates its options from the sdkPipelineOptions dict: the tree built
    there (list flags as text, bools as bare flags) is the launcher's."""
    launcher = rollout_config(job.options)
    assert launcher.layout.layout.buckets == (128, 256) and launcher.packing.window_s == 30.0
    assert launcher.packing.content_dedup and launcher.engine.slots == 16
    # What the service stores (sdkPipelineOptions: JSON, where a tuple would become a list).
    sent = json.loads(json.dumps(job.options.get_all_options()))
    assert rollout_config(PipelineOptions.from_dictionary(sent)) == launcher


def test_the_packer_translates_for_dataflow():
    """PackTrajectoryGroups on its own (whatever rollout.build wires today): its stateful
    packer keeps its state, both timer domains, a deterministic key coder and the
    windowing with allowed lateness through Dataflow's translation."""
    from core.contracts.record_shape import RecordLayout
    from pipelines.pack_transform import PackTrajectoryGroups
    from pipelines.packing_config import PackingConfig

    argv = [a for a in ARGV if not a.startswith("--setup_file")]
    p = beam.Pipeline(options=PipelineOptions(argv))
    cfg = PackingConfig(window_s=30.0, allowed_lateness_s=600.0)
    (
        p
        | beam.io.ReadFromPubSub(subscription=REQUESTS)
        | beam.Map(lambda _: [])
        | PackTrajectoryGroups(cfg, RecordLayout((128, 256)))
        | beam.Map(lambda r: r.record_id.encode())
        | beam.io.WriteToPubSub(RECORDS)
    )
    job = p.run().job
    remove_local_staging(job)
    pipeline = job.proto_pipeline
    comps = pipeline.components
    (packer,) = [t for t in comps.transforms.values() if t.unique_name.endswith("/PackRecords")]
    payload = rapi.ParDoPayload.FromString(packer.spec.payload)
    assert set(payload.state_specs) == {"buffer", "arrivals", "armed"}
    domains = {k: v.time_domain for k, v in payload.timer_family_specs.items()}
    assert domains == {"ts-max_wait": rapi.TimeDomain.PROCESSING_TIME, "ts-window_end": rapi.TimeDomain.EVENT_TIME}
    pcoll = comps.pcollections[next(iter(packer.inputs.values()))]
    windowing = comps.windowing_strategies[pcoll.windowing_strategy_id]
    assert windowing.window_fn.urn == common_urns.fixed_windows.urn and windowing.allowed_lateness == 600_000
    # The (bucket, shard) key: a pair of varints, deterministic as state keys must be.
    key_coder = comps.coders[comps.coders[pcoll.coder_id].component_coder_ids[0]]
    assert key_coder.spec.urn == common_urns.coders.KV.urn
    assert [comps.coders[c].spec.urn for c in key_coder.component_coder_ids] == [common_urns.coders.VARINT.urn] * 2


def test_the_job_runs_as_its_own_service_account(job):
    """--service_account_email reaches the Job's environment (serviceAccountEmail), as the
    service receives it, and the options the workers re-create."""
    env = dry_run.fill_environment(job)
    assert env.service_account_email == ROLLOUT_SA == job.proto.environment.service_account_email
    assert dict(env.sdk_pipeline_options["options"])["service_account_email"] == ROLLOUT_SA


def test_the_vertex_spelling_is_forwarded_and_a_conflict_refused():
    fwd = rollout.forward_service_account
    assert fwd(["--service_account", "a@p.iam", "--x=1"]) == ["--service_account_email=a@p.iam", "--x=1"]
    assert fwd(["--service_account=a@p.iam"]) == fwd(["--service_account_email=a@p.iam"])
    with pytest.raises(SystemExit, match="disagree"):
        fwd(["--service_account=a@p.iam", "--service_account_email=b@p.iam"])


# The real CLI, with every TCP/UDP connection and DNS lookup refused (an audit hook).
_NO_NETWORK = no_network.script("pipelines.job")


def test_the_cli_dry_run_prints_what_it_built_and_leaves_no_staging():
    argv = [a for a in ARGV if not a.startswith("--service_account_email")] + [
        "--service_account",  # the Vertex launcher's spelling
        ROLLOUT_SA,
        "--dead_letter_topic=projects/rl-project-123/topics/dead-letters",
        "--machine_type=n2-standard-16",
        "--number_of_worker_harness_threads=4",
        "--autoscaling_algorithm=THROUGHPUT_BASED",
        "--max_num_workers=20",
        "--dataflow_service_options=worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver",
    ]
    env = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "", "JAX_PLATFORMS": "cpu"}
    env["GOOGLE_APPLICATION_CREDENTIALS"] = "/nonexistent.json"
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _NO_NETWORK, *argv], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert time.monotonic() - start < 120
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Dataflow job beamapp-") and "nothing uploaded or submitted" in lines[0]
    expected = [
        "  type: streaming (JOB_TYPE_STREAMING)",
        "  steps: ReadRequests, ParseRequests, RunEpisodes, Pack, RecordMessages, DropNoticeMessages, "
        "AllMessages, WriteRecords, AllDeadLetters, WriteDeadLetters",
        "  workers: machine type n2-standard-16, accelerator type:nvidia-l4;count:1;install-nvidia-driver, "
        "harness threads 4",
        "  autoscaling: THROUGHPUT_BASED, initial workers default, max workers 20",
        f"  service account: {ROLLOUT_SA}",
    ]
    for line in expected:
        assert line in lines, (line, out.stdout)
    (package,) = [ln for ln in lines if ln.startswith("  staged package: ")]
    assert package.startswith("  staged package: beam_agentic_rl-0.1.0.tar.gz as workflow.tar.gz (")
    assert package.endswith(" KiB)") and int(package.split("(")[1].split()[0]) > 100
    # The local sdist the summary measured is removed: a dry run leaves nothing behind.
    assert "network access" not in out.stderr
    staged_dirs = [ln.split("--outdir', '")[1].split("'")[0] for ln in out.stderr.splitlines() if "--outdir" in ln]
    assert staged_dirs and not any(Path(d).exists() for d in staged_dirs)
