"""Typed pipeline options for the rollout job (local DirectRunner or Dataflow)."""
from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions


class RolloutOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--requests_subscription", required=True,
                            help="projects/P/subscriptions/S carrying rollout requests")
        parser.add_argument("--records_topic", required=True, help="projects/P/topics/T for packed records")
        parser.add_argument("--dead_letter_topic", default=None, help="projects/P/topics/T for unrunnable requests")
        parser.add_argument("--policy_root", required=True, help="policy store root: a directory or gs://…")
        parser.add_argument("--model_config", default="tiny")
        parser.add_argument("--group_size", type=int, default=4, help="sampler slots = max samples per request")
        parser.add_argument("--rows", type=int, default=4)
        parser.add_argument("--seq_len", type=int, default=256)
        parser.add_argument("--max_segments_per_row", type=int, default=2)
        parser.add_argument("--max_new_tokens_per_turn", type=int, default=32)
        parser.add_argument("--policy_poll_s", type=float, default=1.0)
        parser.add_argument("--policy_wait_s", type=float, default=300.0,
                            help="how long a worker waits for the first policy version")
        parser.add_argument("--max_wait_s", type=float, default=2.0,
                            help="a partly filled record is flushed after this long")
        parser.add_argument("--dedup_window_s", type=float, default=3600.0)
        parser.add_argument("--heartbeat_s", type=float, default=0.1,
                            help="DirectRunner only: keep-alive interval so timers fire on time (0 = off)")


class EngineOptions(PipelineOptions):
    """How many episodes one worker process runs at once, and how results are committed."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--engine_slots", type=int, default=64,
                            help="KV-cache slots of the per-process inference engine")
        parser.add_argument("--max_concurrent_groups", type=int, default=16,
                            help="requests (groups of G episodes) in flight per worker process")
        parser.add_argument("--commit_interval_s", type=float, default=0.2,
                            help="how often finished groups are committed downstream")
        parser.add_argument("--request_shards", type=int, default=4,
                            help="keys that requests are spread over (state and timers are per key)")
