"""Typed pipeline options for the rollout job (local DirectRunner or Dataflow)."""
from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.bucketing import OVERLONG_POLICIES
from pipelines.packing_config import PackingConfig


class RolloutOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--requests_subscription", default=None,
                            help="projects/P/subscriptions/S carrying rollout requests")
        parser.add_argument("--records_topic", default=None, help="projects/P/topics/T for packed records")
        parser.add_argument("--dead_letter_topic", default=None, help="projects/P/topics/T for unrunnable requests")
        parser.add_argument("--policy_root", default=None, help="policy store root: a directory or gs://…")
        parser.add_argument("--model_config", default="tiny")
        parser.add_argument("--rows", type=int, default=4)
        parser.add_argument("--seq_len", type=int, default=256)
        parser.add_argument("--max_segments_per_row", type=int, default=2)
        parser.add_argument("--max_new_tokens_per_turn", type=int, default=32)
        parser.add_argument("--advantage_estimator", default="grpo", choices=["grpo", "rloo", "dr_grpo"],
                            help="group-relative advantages, computed once a group is complete")
        parser.add_argument("--policy_poll_s", type=float, default=1.0)
        parser.add_argument("--policy_wait_s", type=float, default=300.0,
                            help="how long a worker waits for the first policy version")
        parser.add_argument("--max_wait_s", type=float, default=2.0,
                            help="a partly filled record is flushed after this long")
        parser.add_argument("--dedup_window_s", type=float, default=3600.0)
        parser.add_argument("--buckets", default=None,
                            help="record sequence lengths, ascending, e.g. 128,256 (default: --seq_len alone)")
        parser.add_argument("--window_s", type=float, default=60.0,
                            help="event-time packing window: buffers are flushed at its end")
        parser.add_argument("--num_shards", type=int, default=1, help="packing keys per length bucket")
        parser.add_argument("--allowed_lateness_s", type=float, default=3600.0,
                            help="late trajectories within this of their window's end are still packed")
        # store_true, not type=bool: Beam re-creates options on workers from a dict in which
        # True becomes a bare --flag.
        parser.add_argument("--content_dedup", action="store_true",
                            help="also drop trajectories with equal tokens + loss mask under another id")
        parser.add_argument("--filter_zero_signal", action="store_true",
                            help="drop groups whose advantages are all 0 (their credits are not returned)")
        parser.add_argument("--overlong", choices=OVERLONG_POLICIES, default="truncate",
                            help="a trajectory longer than the largest bucket is truncated or dropped")
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


def parse_buckets(text: str | None, seq_len: int) -> tuple[int, ...]:
    """"128,256" -> (128, 256); None or "" -> (seq_len,). Order and values are checked by PackingConfig."""
    if not text:
        return (seq_len,)
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--buckets must be comma-separated integers, got {text!r}") from None


def packing_config(opts: RolloutOptions) -> PackingConfig:
    return PackingConfig(
        buckets=parse_buckets(opts.buckets, opts.seq_len), rows=opts.rows,
        max_segments_per_row=opts.max_segments_per_row, window_s=opts.window_s, max_wait_s=opts.max_wait_s,
        num_shards=opts.num_shards, dedup_window_s=opts.dedup_window_s, content_dedup=bool(opts.content_dedup),
        filter_zero_signal=bool(opts.filter_zero_signal), overlong=opts.overlong,
        allowed_lateness_s=opts.allowed_lateness_s)
