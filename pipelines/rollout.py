"""The rollout job: rollout requests in, packed fixed-shape records out.

    python -m pipelines.rollout --runner=BundleBasedDirectRunner --streaming \\
        --requests_subscription=projects/P/subscriptions/S --records_topic=projects/P/topics/T \\
        --policy_root=/path/to/store
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from core.contracts.rollout_request import HEARTBEAT_ATTRIBUTE
from pipelines.direct_runner import memoise_dofn_specs, share_pubsub_publishers
from pipelines.options import RolloutOptions, engine_config, packing_config
from pipelines.pack_transform import DROPPED, PackTrajectoryGroups
from pipelines.transforms import DEAD_LETTER, ParseRequestFn, RunEpisodes, drop_notice_message, to_pubsub_message
from rollout.telemetry import current as telemetry

DIRECT_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def build(p: beam.Pipeline, options: PipelineOptions) -> None:
    opts = options.view_as(RolloutOptions)
    parsed = (
        p
        | "ReadRequests" >> beam.io.ReadFromPubSub(subscription=opts.requests_subscription, with_attributes=True)
        | "ParseRequests" >> beam.ParDo(ParseRequestFn()).with_outputs(DEAD_LETTER, main="requests")
    )
    episodes = parsed.requests | "RunEpisodes" >> RunEpisodes(engine_config(options))
    packed = episodes["groups"] | "Pack" >> PackTrajectoryGroups(packing_config(opts), drop_notices=True)
    # Drop notices travel with the records: the learner returns their feeder credits.
    (
        (
            packed["records"] | "RecordMessages" >> beam.Map(to_pubsub_message),
            packed[DROPPED] | "DropNoticeMessages" >> beam.Map(drop_notice_message),
        )
        | "AllMessages" >> beam.Flatten()
        | "WriteRecords" >> beam.io.WriteToPubSub(opts.records_topic, with_attributes=True)
    )
    dead = (parsed[DEAD_LETTER], episodes[DEAD_LETTER]) | "AllDeadLetters" >> beam.Flatten()
    if opts.dead_letter_topic:
        dead | "WriteDeadLetters" >> beam.io.WriteToPubSub(opts.dead_letter_topic, with_attributes=True)
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


def run(argv=None) -> None:
    options = PipelineOptions(argv)
    options.view_as(StandardOptions).streaming = True
    opts = options.view_as(RolloutOptions)
    # Not argparse-required: Beam parses every registered options class for every
    # pipeline in the process (tests included), so required flags would break those.
    missing = [f for f in ("requests_subscription", "records_topic", "policy_root") if not getattr(opts, f)]
    if missing:
        raise SystemExit(f"missing required flags: {', '.join('--' + f for f in missing)}")
    engine_config(options), packing_config(opts)  # bad settings refused before anything starts
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    if runner in DIRECT_RUNNERS:
        memoise_dofn_specs()
        share_pubsub_publishers()
        if opts.heartbeat_s > 0:
            start_heartbeat(opts.requests_subscription, opts.heartbeat_s)
    with beam.Pipeline(options=options) as p:
        build(p, options)


def _stop_on_signal(signum, _frame):
    """SIGTERM (the demo's teardown, Dataflow draining a worker): write the last telemetry
    row and spans now, while the runner's threads still run, then exit."""
    telemetry().close()
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop_on_signal)
    # force: absl (imported by orbax and tfds) installs a root handler first, which would
    # swallow our lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietAsyncWrapper())
    run(sys.argv[1:])
