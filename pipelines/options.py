"""Typed pipeline options for the rollout job (local DirectRunner or Dataflow), and the
checked configs built from them: PackingConfig (packing half) and EngineConfig (workers)."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from core.contracts.record_shape import add_layout_arguments, layout_from_flags
from core.policy.config import MODEL_CONFIGS
from core.rl.advantages import ADVANTAGE_ESTIMATORS
from pipelines.bucketing import OVERLONG_POLICIES
from pipelines.packing_config import PackingConfig
from rollout.engine_config import EngineConfig

_ENGINE = EngineConfig.__dataclass_fields__  # defaults live in EngineConfig
_PACKING = PackingConfig.__dataclass_fields__


class RolloutOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--requests_subscription", default=None, help="projects/P/subscriptions/S carrying rollout requests"
        )
        parser.add_argument("--records_topic", default=None, help="projects/P/topics/T for packed records")
        parser.add_argument("--dead_letter_topic", default=None, help="projects/P/topics/T for unrunnable requests")
        parser.add_argument("--policy_root", default=None, help="policy store root: a directory or gs://…")
        parser.add_argument("--model_config", default=_ENGINE["model_config"].default, choices=sorted(MODEL_CONFIGS))
        add_layout_arguments(parser)
        parser.add_argument("--max_new_tokens_per_turn", type=int, default=_ENGINE["max_new_tokens_per_turn"].default)
        parser.add_argument(
            "--step_timeout_s",
            type=float,
            default=_ENGINE["step_timeout_s"].default,
            help="an environment step (tool call) longer than this ends its episode as timeout",
        )
        parser.add_argument(
            "--episode_timeout_s",
            type=float,
            default=_ENGINE["episode_timeout_s"].default,
            help="a whole episode longer than this ends as timeout",
        )
        parser.add_argument(
            "--advantage_estimator",
            default=_ENGINE["advantage_estimator"].default,
            choices=sorted(ADVANTAGE_ESTIMATORS),
            help="group-relative advantages, computed once a group is complete",
        )
        parser.add_argument("--policy_poll_s", type=float, default=_ENGINE["policy_poll_s"].default)
        parser.add_argument(
            "--policy_wait_s",
            type=float,
            default=_ENGINE["policy_wait_s"].default,
            help="how long a worker waits for the first policy version, and for a request's minimum version "
            "(after that the request runs anyway and the learner's staleness filter decides)",
        )
        parser.add_argument(
            "--max_wait_s",
            type=float,
            default=_PACKING["max_wait_s"].default,
            help="a partly filled record is flushed after this long",
        )
        parser.add_argument("--dedup_window_s", type=float, default=_PACKING["dedup_window_s"].default)
        parser.add_argument(
            "--window_s",
            type=float,
            default=_PACKING["window_s"].default,
            help="event-time packing window: buffers are flushed at its end",
        )
        parser.add_argument(
            "--num_shards", type=int, default=_PACKING["num_shards"].default, help="packing keys per length bucket"
        )
        parser.add_argument(
            "--allowed_lateness_s",
            type=float,
            default=_PACKING["allowed_lateness_s"].default,
            help="late trajectories within this of their window's end are still packed",
        )
        # store_true, not type=bool: Beam re-creates options on workers from a dict in which
        # True becomes a bare --flag.
        parser.add_argument(
            "--content_dedup",
            action="store_true",
            help="also drop trajectories with equal tokens + loss mask under another id",
        )
        parser.add_argument(
            "--filter_zero_signal",
            action="store_true",
            help="drop groups whose advantages are all 0 (a drop notice returns their credits)",
        )
        parser.add_argument(
            "--overlong",
            choices=OVERLONG_POLICIES,
            default=_PACKING["overlong"].default,
            help="a trajectory longer than the largest bucket is truncated or dropped",
        )
        parser.add_argument(
            "--heartbeat_s",
            type=float,
            default=0.1,
            help="DirectRunner only: keep-alive interval so timers fire on time (0 = off)",
        )


class EngineOptions(PipelineOptions):
    """How many episodes one worker process runs at once, and how results are committed."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--engine_slots",
            type=int,
            default=_ENGINE["slots"].default,
            help="KV-cache slots of the per-process inference engine",
        )
        parser.add_argument(
            "--max_concurrent_groups",
            type=int,
            default=_ENGINE["max_concurrent_groups"].default,
            help="requests (groups of G episodes) in flight per worker process",
        )
        parser.add_argument(
            "--commit_interval_s",
            type=float,
            default=_ENGINE["commit_interval_s"].default,
            help="how often finished groups are committed downstream",
        )
        parser.add_argument(
            "--request_shards",
            type=int,
            default=_ENGINE["request_shards"].default,
            help="keys that requests are spread over (state and timers are per key)",
        )
        parser.add_argument(
            "--logdir",
            default=None,
            help="each worker writes rollout/... scalars here (TensorBoard + JSONL), one run per process",
        )
        parser.add_argument(
            "--trace_dir", default=None, help="each worker writes its timeline spans here (off when unset)"
        )
        parser.add_argument(
            "--telemetry_every_s", type=float, default=_ENGINE["telemetry_every_s"].default, help="row interval"
        )


def packing_config(opts: RolloutOptions) -> PackingConfig:
    layout = layout_from_flags(opts)
    return PackingConfig(
        buckets=layout.buckets,
        rows=layout.rows,
        max_segments_per_row=layout.max_segments_per_row,
        window_s=opts.window_s,
        max_wait_s=opts.max_wait_s,
        num_shards=opts.num_shards,
        dedup_window_s=opts.dedup_window_s,
        content_dedup=bool(opts.content_dedup),
        filter_zero_signal=bool(opts.filter_zero_signal),
        overlong=opts.overlong,
        allowed_lateness_s=opts.allowed_lateness_s,
    )


def engine_config(options: PipelineOptions) -> EngineConfig:
    opts, eng = options.view_as(RolloutOptions), options.view_as(EngineOptions)
    return EngineConfig(
        policy_root=opts.policy_root,
        model_config=opts.model_config,
        slots=eng.engine_slots,
        max_concurrent_groups=eng.max_concurrent_groups,
        commit_interval_s=eng.commit_interval_s,
        request_shards=eng.request_shards,
        max_new_tokens_per_turn=opts.max_new_tokens_per_turn,
        max_tokens=layout_from_flags(opts).trajectory_len,  # an episode must fit one row
        step_timeout_s=opts.step_timeout_s,
        episode_timeout_s=opts.episode_timeout_s,
        policy_poll_s=opts.policy_poll_s,
        policy_wait_s=opts.policy_wait_s,
        advantage_estimator=opts.advantage_estimator,
        logdir=eng.logdir,
        trace_dir=eng.trace_dir,
        telemetry_every_s=eng.telemetry_every_s,
    )
