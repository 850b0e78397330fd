"""The packer alone as a streaming Beam job on the Pub/Sub emulator (benchmark helper).

    python benchmarks/_packer_pipeline.py --runner=BundleBasedDirectRunner --streaming \\
        --project=P --input_subscription=projects/P/subscriptions/S --output_topic=projects/P/topics/T \\
        [--rows 4 --seq_len 256 --max_segments_per_row 2 --max_wait_s 2.0]

Input: one Pub/Sub message per trajectory group, JSON
    {"request_id": str, "finished_at": float, "lengths": [int, ...]}
(the benchmark stamps finished_at when it publishes). Each becomes a group of synthetic
Trajectories of those lengths and goes through the real `PackTrajectoryGroups`
(dedup, buckets, windows, stateful packer with its max-wait timer). Output: the real
encoded records, with two extra attributes: `flush_reason` and `packer_latency_ms`
(the packer's own emit time minus the oldest finished_at in the record).

Heartbeats (the same keep-alive `pipelines.job` uses on the direct runners) keep
the runner's Pub/Sub pull short so processing-time timers fire on time.
"""

from __future__ import annotations

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from core import config
from core.config import configclass, knob
from core.contracts import records
from core.contracts.record_shape import RecordLayout
from core.contracts.rollout_request import HEARTBEAT_ATTRIBUTE
from localstack.launch.plan import synthetic_trajectory
from pipelines.pack_transform import PackTrajectoryGroups
from pipelines.packing_config import PackingConfig


class ParseGroupFn(beam.DoFn):
    def process(self, msg: PubsubMessage):
        if HEARTBEAT_ATTRIBUTE in (msg.attributes or {}):
            return
        d = json.loads(msg.data)
        group = [
            synthetic_trajectory(d["request_id"], i, n, float(d["finished_at"])) for i, n in enumerate(d["lengths"])
        ]
        yield group


def to_message(f) -> PubsubMessage:
    attrs = records.attributes(f.record)
    attrs["flush_reason"] = f.reason
    attrs["packer_latency_ms"] = str(f.latency_ms)
    return PubsubMessage(data=records.encode(f.record), attributes=attrs)


@configclass
class PackerPipelineConfig:
    input_subscription: str = knob(help="the subscription of trajectory groups")
    output_topic: str = knob(help="the topic records go to")
    rows: int = knob(4, "rows per record")
    seq_len: int = knob(256, "tokens per record row (the one bucket)")
    max_segments_per_row: int = knob(2, "trajectories per row at most")
    max_wait_s: float = knob(2.0, "the packer's max wait, s")
    window_s: float = knob(60.0, "the packer's event-time window, s")
    heartbeat_s: float = knob(0.1, "heartbeat period on the input subscription, s (0: none)")


def main(argv=None) -> None:
    # Flags not ours are Beam's.
    ns, beam_argv = config.make_parser(PackerPipelineConfig, __doc__).parse_known_args(argv)
    args = config.from_namespace(PackerPipelineConfig, ns)
    options = PipelineOptions(beam_argv)
    options.view_as(StandardOptions).streaming = True
    cfg = PackingConfig(max_wait_s=args.max_wait_s, window_s=args.window_s)
    layout = RecordLayout((args.seq_len,), args.rows, args.max_segments_per_row)
    if args.heartbeat_s > 0:
        from pipelines.job import start_heartbeat

        start_heartbeat(args.input_subscription, args.heartbeat_s)
    with beam.Pipeline(options=options) as p:
        (
            p
            | "Read" >> beam.io.ReadFromPubSub(subscription=args.input_subscription, with_attributes=True)
            | "ParseGroups" >> beam.ParDo(ParseGroupFn())
            | "Pack" >> PackTrajectoryGroups(cfg, layout, keep_flush_info=True)
            | "ToMessages" >> beam.Map(to_message)
            | "Write" >> beam.io.WriteToPubSub(args.output_topic, with_attributes=True)
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(sys.argv[1:])
