"""The scale planner's arithmetic: accelerator figures -> learner step time and rollout rate
per worker -> (through `trainer.learning.capacity`, the same Little's-law planner the local
stack uses) workers, trajectories in flight, staleness, duty cycle and what binds.

Pure functions, no JAX. Every rate is trajectories/s, every size bytes, every time seconds.

- Learner: a step trains `records x rows x seq_len` token slots (padding costs as much as a
  token) at 6 N FLOPs a slot for the weights plus 12 L S W for attention (L layers, S the
  keys a query attends, W = query heads x head dim); a KL reference forward adds 2 N + 4 L S W.
  Step time = FLOPs / (chips x peak x MFU).
- Rollout worker (the project's engine: a static KV cache `[slots, kv_heads, T, head_dim]`
  a layer, every decode step reads all weights and every slot's whole cache): a step takes
  max(bytes / (bandwidth x efficiency), FLOPs / (peak x MFU)) plus the host's per-step
  overhead. A prefill call feeds `prefill` tokens to each of `prefill_slots` slots and is
  costed the same way. The worker makes 1 / (its busy time per trajectory) trajectories/s,
  or fewer when its slots sit waiting on tools: slots / episode time.
"""

from __future__ import annotations

import dataclasses
import math

from core.config import configclass, derived
from core.policy.model.config import SLIDING, ModelConfig
from core.policy.model.flops import count_params
from localstack.launch.accelerators import Slice
from trainer.learning.capacity import Measurements, check_async, make_plan

BF16 = 2  # bytes a value: weights and KV cache on accelerators
TRAIN_BYTES_PER_PARAM = 16  # f32 params, grads and two Adam moments


@dataclasses.dataclass(frozen=True)
class ModelDims:
    params: float
    layers: int
    d_model: int
    attn_width: int  # query heads x head dim
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    sliding_window: int = 0  # > 0: every layer attends at most this many keys (an upper bound)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> ModelDims:
        window = cfg.sliding_window if cfg.layer_types and all(t == SLIDING for t in cfg.layer_types) else 0
        return cls(count_params(cfg), cfg.n_layers, cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads,
                   cfg.head_dim, cfg.vocab_size, cfg.tie_embeddings, window)  # fmt: skip

    @property
    def flop_params(self) -> float:
        """Parameters a token multiplies by: all but an untied input embedding (a lookup)."""
        return self.params - (0 if self.tied else self.vocab * self.d_model)

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16

    def attention_fwd_flops(self, keys: float) -> float:
        """QK^T and AV for one query against `keys` keys, every layer."""
        if self.sliding_window:
            keys = min(keys, self.sliding_window)
        return 4 * self.layers * keys * self.attn_width


@configclass
class Assumptions:
    """Not vendor figures: printed with every plan. The learner's MFU and the decode step's
    bandwidth efficiency are the ones measured on one TPU v5e (docs/BENCHMARKS.md,
    "Accelerator", 2026-12-07, bf16 activations): Qwen2.5-0.5B's step at 8 x 1,024 ran at
    MFU 0.401 (model FLOPs), and SmolLM2-135M's device-bound bf16 decode at 256 slots at
    0.281 of its HBM bound; on GPUs they are assumptions."""

    learner_mfu: float = derived(0.40, "of the slice's dense bf16 peak, for the train step", gt=0, le=1)
    decode_mfu: float = derived(0.3, "of peak, when a decode or prefill call is compute-bound", gt=0, le=1)
    bandwidth_efficiency: float = derived(0.28, "of the vendor's HBM bandwidth a decode step reaches", gt=0, le=1)
    memory_fraction: float = derived(0.9, "of HBM the engine may fill with weights and KV cache", gt=0, le=1)
    # Host time, measured on this machine's CPU (docs/BENCHMARKS.md): Sampler.step's Python
    # and dispatch, 2.4 ms + 0.28 ms a step (Rollout, cProfile); the Beam job's cost a
    # trajectory, 1/74.1 - 1/108.9 s on one core (Beam tax, no tools: job vs engine).
    step_overhead_s: float = 0.0027
    host_s_per_trajectory: float = 0.0043


@dataclasses.dataclass(frozen=True)
class Episode:
    tokens: float  # a trajectory's tokens: prompt (tools block), generated, observations
    generated: float  # of those, the policy's
    tool_calls: float  # per episode (mean)
    tool_latency_s: float  # per call (mean)

    def __post_init__(self):
        if not 0 < self.generated <= self.tokens or self.tool_calls < 0 or self.tool_latency_s < 0:
            raise ValueError(f"bad episode: {self}")

    @property
    def tool_wait_s(self) -> float:
        return self.tool_calls * self.tool_latency_s


@dataclasses.dataclass(frozen=True)
class Batch:
    records: int
    rows: int
    seq_len: int
    max_segments: int  # trajectories per row at most
    fill: float  # non-pad share of the slots the packer reaches
    attention_span: int  # keys a query attends in training (banded: the trajectory length)
    kl_reference: bool = False

    @property
    def slots(self) -> int:
        return self.records * self.rows * self.seq_len

    def trajectories_per_record(self, tokens_per_trajectory: float) -> float:
        by_tokens = self.rows * self.seq_len * self.fill / tokens_per_trajectory
        return min(self.rows * self.max_segments, by_tokens)


def learner_step(model: ModelDims, hw: Slice, batch: Batch, mfu: float) -> dict:
    per_slot = 6 * model.flop_params + 3 * model.attention_fwd_flops(batch.attention_span)
    ref = (2 * model.flop_params + model.attention_fwd_flops(batch.attention_span)) if batch.kl_reference else 0.0
    flops = (per_slot + ref) * batch.slots
    memory = model.params * (TRAIN_BYTES_PER_PARAM + (BF16 if batch.kl_reference else 0))
    return {
        "flops": flops,
        "flops_weights": 6 * model.flop_params * batch.slots,
        "flops_reference": ref * batch.slots,
        "step_s": flops / (hw.flops * mfu),
        "train_state_bytes": memory,
        "hbm_bytes": hw.hbm_bytes,
    }


@dataclasses.dataclass(frozen=True)
class Engine:
    slots: int  # decode batch: KV-cache slots
    prefill: int  # tokens a slot is fed per catch-up call
    prefill_slots: int  # slots fed per catch-up call
    cache_len: int  # T: the longest episode the cache holds


@dataclasses.dataclass(frozen=True)
class Worker:
    rate: float  # trajectories/s one worker makes
    episode_s: float  # one episode's wall time on it
    slots: int
    decode_step_s: float
    prefill_step_s: float
    decode_tokens_per_s: float
    max_slots: int  # what fits in HBM
    refeed: bool  # more episodes than slots: each tool return re-feeds the context
    binds: str  # (decode | prefill) (bandwidth | compute) | host CPU | tool latency (slots)


def _call_s(model: ModelDims, hw: Slice, a: Assumptions, tokens: int, slots: int, cache_len: int) -> tuple:
    """(seconds, bound) of one engine call: `tokens` new tokens in each of `slots` slots."""
    read = model.flop_params * BF16 + slots * cache_len * model.kv_bytes_per_token
    mem = read / (hw.hbm_bytes_per_s * a.bandwidth_efficiency)
    flops = slots * tokens * (2 * model.flop_params + model.attention_fwd_flops(cache_len))
    comp = flops / (hw.flops * a.decode_mfu)
    return max(mem, comp) + a.step_overhead_s, ("bandwidth" if mem >= comp else "compute"), max(mem, comp)


def rollout_worker(model: ModelDims, hw: Slice, ep: Episode, engine: Engine, a: Assumptions) -> Worker:
    free = hw.hbm_bytes * a.memory_fraction - model.params * BF16
    per_slot = engine.cache_len * model.kv_bytes_per_token
    max_slots = int(free // per_slot) if free > 0 else 0
    if max_slots < 1:
        raise ValueError(
            f"{hw.name}: {model.params * BF16 / 1e9:.1f} GB of bf16 weights and one {engine.cache_len}-token "
            f"KV slot ({per_slot / 1e9:.2f} GB) do not fit in {a.memory_fraction:.0%} of "
            f"{hw.hbm_bytes / 1e9:.0f} GB; take a bigger accelerator or more GPUs a worker (l4x2)"
        )
    s = min(engine.slots, max_slots)
    p = min(engine.prefill_slots, s)
    dec_s, dec_bound, dec_acc = _call_s(model, hw, a, 1, s, engine.cache_len)
    pre_s, pre_bound, pre_acc = _call_s(model, hw, a, engine.prefill, p, engine.cache_len)
    prefill_tokens = ep.tokens - ep.generated

    def busy(extra_prefill: float) -> tuple[float, dict]:
        """Seconds of the worker's one engine thread a trajectory costs, by part."""
        dec_calls, pre_calls = ep.generated / s, (prefill_tokens + extra_prefill) / (engine.prefill * p)
        parts = {
            f"decode {dec_bound}": dec_calls * dec_acc,
            f"prefill {pre_bound}": pre_calls * pre_acc,
            "host CPU": (dec_calls + pre_calls) * a.step_overhead_s + a.host_s_per_trajectory,
        }
        return sum(parts.values()), parts

    own_prefill_calls = math.ceil(prefill_tokens / engine.prefill)
    episode_s = ep.tool_wait_s + ep.generated * dec_s + own_prefill_calls * pre_s
    keep_busy, keep_parts = busy(0.0)
    keep_rate = min(1 / keep_busy, s / episode_s)  # episodes hold their slot through tool calls
    # More episodes than slots: a slot is released at each tool call and the context (half
    # an episode on average) is fed again when the result comes back.
    refeed_busy, refeed_parts = busy(ep.tool_calls * ep.tokens / 2)
    refeed = 1 / refeed_busy > keep_rate
    if refeed:
        rate, parts, binds = 1 / refeed_busy, refeed_parts, None
    else:
        rate, parts = keep_rate, keep_parts
        binds = "tool latency (slots)" if s / episode_s < 1 / keep_busy else None
    if binds is None:
        top = max(parts, key=parts.get)
        binds = top  # decode bandwidth | decode compute | prefill bandwidth | prefill compute | host CPU
    return Worker(rate, episode_s, s, dec_s, pre_s, s / dec_s, max_slots, refeed, binds)


_BINDS = {"learner": "learner compute", "credits": "in-flight window", "staleness bound": "in-flight cap (staleness)"}


def plan(
    *,
    step_s: float,
    trajectories_per_record: float,
    batch_records: int,
    worker_rate: float,
    worker_binds: str,
    episode_s: float,
    pipeline_s: float,
    tokens_per_trajectory: float,
    target_duty: float,
    group_size: int,
    publish_every: int,
    min_window: int,
    staleness_bound: float,
    max_workers: int | None = None,
    workers: int | None = None,
) -> dict:
    """Workers and window for target_duty (capacity.make_plan), the duty they give, the
    staleness that follows, what binds, and the request backlog to expect."""
    m = Measurements(
        step_s=step_s,
        trajectories_per_record=trajectories_per_record,
        batch_records=batch_records,
        episode_s=episode_s,
        pipeline_s=pipeline_s,
        rollout_rate=worker_rate,
        tokens_per_trajectory=tokens_per_trajectory,
    )
    want = target_duty * m.learner_rate
    needed = max(1, math.ceil(want / worker_rate))
    n = workers if workers is not None else min(needed, max_workers or needed)
    p = make_plan(m, target_duty=target_duty, group_size=group_size, publish_every=publish_every,
                  min_window=min_window, workers=n, staleness_bound=staleness_bound)  # fmt: skip
    # The worker rate already holds the worker's own concurrency limit, so the duty is
    # the learner's, the pool's and the window's (not make_plan's engine-concurrency term).
    pred = check_async(dataclasses.replace(m, rollout_rate=n * worker_rate), p.max_in_flight, publish_every)
    binds = pred.binds
    if binds == "credits" and p.async_prediction.binds == "staleness bound":
        binds = "staleness bound"
    rate = min(want, n * worker_rate)
    required = math.ceil(rate * m.latency_s + m.trajectories_per_step)  # Little, before any cap
    # The window holds required trajectories only if staleness_bound x publish_every x
    # trajectories_per_step does: the versions a step batch must last.
    min_publish_every = math.ceil(required / (staleness_bound * m.trajectories_per_step))
    running = n * p.max_concurrent_groups * group_size
    backlog = max(0, p.max_in_flight - running)
    return {
        "learner_rate": m.learner_rate,
        "trajectories_per_step": m.trajectories_per_step,
        "latency_s": m.latency_s,
        "workers_needed": needed,
        "workers": n,
        "max_in_flight": p.max_in_flight,
        "required_in_flight": required,
        "min_publish_every": min_publish_every,
        "max_concurrent_groups": p.max_concurrent_groups,
        "staleness_versions": pred.staleness_versions,
        "max_staleness": p.max_staleness,
        "duty": pred.duty_cycle,
        "sync_duty": p.sync_prediction.duty_cycle,
        "binds": worker_binds if binds == "rollout compute" else _BINDS.get(binds, binds),
        "limits": pred.limits,
        "trained_tokens_per_s": pred.rate * tokens_per_trajectory,
        "backlog_requests": backlog / group_size,
        "backlog_s": backlog / max(1e-9, n * worker_rate),
        "learner_flags": [
            f"--max_in_flight={p.max_in_flight}",
            f"--max_staleness={p.max_staleness}",
            f"--lag_target={staleness_bound:g}",  # the learner's loop holds it as workers scale
            f"--batch_records={batch_records}",
            f"--publish_every={publish_every}",
        ],
    }
