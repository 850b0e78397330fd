"""The rollout job: rollout requests in, packed fixed-shape records out.

    agentic-rl rollout --runner=BundleBasedDirectRunner --streaming \\
        --requests_subscription=projects/P/subscriptions/S --records_topic=projects/P/topics/T \\
        --policy_root=/path/to/store

(`python -m pipelines.job` is the same.) Its flags are RolloutJobConfig's
(pipelines/config.py) beside Beam's own (--runner, --project, --streaming). The identity
the Dataflow workers run as is Beam's `--service_account_email`; `--service_account` (the
Vertex launcher's spelling) is the same flag. With `--runner=DataflowRunner --dry_run=True`
the job is built offline and summarised on stdout (pipelines/dry_run.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from core import config, heap
from core.contracts.rollout_request import HEARTBEAT_ATTRIBUTE
from pipelines import direct_runner, dry_run
from pipelines.config import RolloutJobConfig
from pipelines.options import rollout_config
from pipelines.pack_transform import DROPPED, PackTrajectoryGroups
from pipelines.preflight import check_resources
from pipelines.pubsub_write import WriteRecordsToPubSub
from pipelines.transforms import DEAD_LETTER, ParseRequestFn, RunEpisodes, drop_notice_message, to_pubsub_message
from rollout.telemetry import current as telemetry

DIRECT_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def build(p: beam.Pipeline, options: PipelineOptions) -> None:
    cfg = rollout_config(options)
    layout = cfg.layout.layout  # the workers' trajectory cap and the packer's record shapes
    parsed = (
        p
        | "ReadRequests" >> beam.io.ReadFromPubSub(subscription=cfg.io.requests_subscription, with_attributes=True)
        | "ParseRequests" >> beam.ParDo(ParseRequestFn()).with_outputs(DEAD_LETTER, main="requests")
    )
    episodes = parsed.requests | "RunEpisodes" >> RunEpisodes(cfg.engine, cfg.io.policy_root, layout.trajectory_len)
    packed = episodes["groups"] | "Pack" >> PackTrajectoryGroups(cfg.packing, layout, drop_notices=True)
    # Drop notices travel with the records: the learner returns their feeder credits.
    (
        (
            packed["records"] | "RecordMessages" >> beam.Map(to_pubsub_message),
            packed[DROPPED] | "DropNoticeMessages" >> beam.Map(drop_notice_message),
        )
        | "AllMessages" >> beam.Flatten()
        | "WriteRecords" >> WriteRecordsToPubSub(cfg.io.records_topic)
    )
    dead = (parsed[DEAD_LETTER], episodes[DEAD_LETTER]) | "AllDeadLetters" >> beam.Flatten()
    if cfg.io.dead_letter_topic:
        dead | "WriteDeadLetters" >> WriteRecordsToPubSub(cfg.io.dead_letter_topic)
    else:
        dead | "LogDeadLetters" >> beam.Map(lambda m: logging.error("dead letter: %s", m.attributes.get("error")))


def start_heartbeat(subscription: str, interval_s: float) -> threading.Event:
    """BundleBasedDirectRunner blocks up to 30 s in a Pub/Sub pull on an idle subscription,
    and no timer fires meanwhile; a tiny keep-alive message every `interval_s` bounds how
    late the packer's flush timer can be. Not needed (nor started) on Dataflow."""
    from core.contracts import pubsub_io

    sub = pubsub_io.subscriber_client()
    topic = sub.get_subscription(subscription=subscription).topic
    publisher = pubsub_io.publisher_client()
    stop = threading.Event()

    def beat():
        while not stop.wait(interval_s):
            try:
                pubsub_io.publish(publisher, topic, b"", **{HEARTBEAT_ATTRIBUTE: "1"})
            except Exception as e:
                logging.warning("heartbeat publish failed: %s", e)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
    return stop


class _QuietAsyncWrapper(logging.Filter):
    """AsyncWrapper logs half a dozen INFO lines on every commit: keep its warnings only."""

    def filter(self, record):
        return record.levelno >= logging.WARNING or not record.pathname.endswith("async_dofn.py")


def forward_service_account(argv: list[str]) -> list[str]:
    """`--service_account X` becomes Beam's `--service_account_email X`: Beam would discard
    the unknown spelling with a warning, and the job would run as the default identity."""
    out, given = [], {}
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in ("--service_account", "--service_account_email"):
            value = value if eq else next(args, "")
            given[name] = value
            out.append(f"--service_account_email={value}")
        else:
            out.append(arg)
    if len(set(given.values())) > 1:
        raise SystemExit(f"--service_account and --service_account_email disagree: {given}")
    return out


def run(argv=None) -> None:
    argv = forward_service_account(sys.argv[1:] if argv is None else list(argv))
    options = PipelineOptions(argv)
    options.view_as(StandardOptions).streaming = True
    cfg = rollout_config(options)  # bad settings refused before anything starts
    if cfg.io.missing:
        raise SystemExit(f"missing required flags: {', '.join(cfg.io.missing)}")
    check_resources(cfg.io, options)  # a wrong name or a missing bucket: named now, not retried
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    if runner in DIRECT_RUNNERS:
        direct_runner.apply(reuse_dofns=not cfg.dofn_per_bundle)
        if cfg.heartbeat_s > 0:
            start_heartbeat(cfg.io.requests_subscription, cfg.heartbeat_s)
    with beam.Pipeline(options=options) as p:
        build(p, options)
    if dry_run.is_dataflow_dry_run(options):  # built, nothing submitted: say what
        print("\n".join(dry_run.summary(p.result.job)), flush=True)
        dry_run.remove_local_staging(p.result.job)


def _stop_on_signal(signum, _frame):
    """SIGTERM (the demo's teardown, Dataflow draining a worker): write the last telemetry
    row and spans now, while the runner's threads still run, then exit at once.

    Not SystemExit: interpreter shutdown with the runner's gRPC and Pub/Sub threads still
    inside C++ aborted the process ("terminate called ... FATAL: exception not rethrown").
    Nothing is lost by skipping it: a bundle publishes its records before it commits, and
    the requests of unfinished episodes come back to the learner's request timeout."""
    telemetry().close()
    logging.info("stopped by signal %d: exit %d", signum, 128 + signum)
    logging.shutdown()  # flushes the handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def main(argv=None) -> int:
    """`agentic-rl rollout`: runs the job until it is stopped."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:  # Beam's own parser would list only -h
        epilog = (
            "Beam's own flags (--runner, --project, --streaming, --service_account_email (or --service_account), "
            "...) are Beam's: see its PipelineOptions."
        )
        config.make_parser(RolloutJobConfig, __doc__ + "\n" + epilog, "agentic-rl rollout").print_help()
        return 0
    heap.limit_arenas(2)  # before Beam's and JAX's threads: fewer arenas, less fragmentation (core/heap.py)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    # force: absl (imported by orbax and tfds) installs a root handler first, which would
    # swallow our lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietAsyncWrapper())
    from core.contracts.pubsub_io import PermanentError
    from core.contracts.store import StoreAccessError

    logging.info("rollout job starting")
    try:
        run(argv)
    except (PermanentError, StoreAccessError) as e:  # no retry can fix these: say which resource
        logging.error("stopped: %s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
