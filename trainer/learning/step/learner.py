"""The learner: one jitted, donated train step over fixed-shape packed batches.

With LoRA (cfg.lora.rank > 0) the trainable params are the adapter alone: the optimizer
state is adapter-sized, and the base (`frozen`) is passed to every step, never donated
and never updated."""

from __future__ import annotations

import functools
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from core import heap
from core.config import configclass, knob, section
from core.contracts.record_shape import DEFAULT_MAX_SEGMENTS_PER_ROW
from core.contracts.records import ARRAY_SPECS, PackedRecord
from core.policy.model.config import ModelConfig
from core.policy.model.flops import segment_lengths, train_flops
from core.policy.model.logprobs import token_logprobs_and_entropy
from core.policy.model.lora import LoraConfig, add_lora, merge, split_lora
from core.policy.model.transformer import Transformer, init_model, split_params
from core.policy.sources import BYTE
from core.policy.text.tokenizer import BYTE_TOKENIZER
from trainer.learning.step import gradients, layout, losses, memory, sharding
from trainer.learning.step.gradients import ComputeConfig, Layout, Numerics, cast_floats

BATCH_FIELDS = ("tokens", "segment_ids", "positions", "loss_mask", "behaviour_logprobs", "advantages")


@configclass
class LearnerConfig:
    batch_records: int = knob(4, "records per learner step; a step sees batch_records x rows sequences", ge=1)
    learning_rate: float = knob(3e-4, "Adam's learning rate (0: the RL-off control, no policy update)", ge=0)
    # Adam's first steps move every weight by about the learning rate, whatever the
    # gradient's size: from a few noisy groups that undoes a warm start (code, guess).
    lr_warmup_steps: int = knob(0, "the learning rate rises linearly from 0 over this many RL steps", ge=0)
    # The last version is the one a run is judged by and exported: a constant rate keeps
    # it as noisy as every other (code's held-out success fell 0.48 -> 0.37 over the last
    # six versions of a run at a constant rate).
    lr_decay: float = knob(
        0.0,
        "after the warmup the rate falls by a cosine to (1 - lr_decay) x itself at the run's last step",
        ge=0,
        le=1,
    )
    max_grad_norm: float = knob(1.0, "gradients are clipped to this global norm", gt=0)
    # Off by default (Adam, as in PPO): with it, a batch whose advantages are all zero
    # would still move the weights.
    weight_decay: float = knob(0.0, "AdamW weight decay (0: plain Adam)", ge=0)
    publish_every: int = knob(5, "learner steps between policy versions", ge=1)
    seed: int = knob(0, "the initial params' seed (and the warm start's)")
    loss: losses.LossConfig = section(losses.LossConfig)
    compute: ComputeConfig = section(ComputeConfig, help="memory against compute in a step")
    lora: LoraConfig = section(LoraConfig, "lora_", "LoRA adapters (rank 0: full fine-tuning)")


def learning_rate_schedule(cfg: LearnerConfig, total_steps: int | None):
    """The rate of step k (from 0): lr * (k + 1) / (w + 1) over a warmup of w steps, then
    lr, falling by a cosine to lr * (1 - lr_decay) at step total_steps."""
    lr, w = cfg.learning_rate, cfg.lr_warmup_steps
    if cfg.lr_decay:
        if total_steps is None or total_steps <= w:
            raise ValueError(f"lr_decay needs more steps than the warmup's {w}, got {total_steps}")
        decay = optax.cosine_decay_schedule(lr, total_steps - w, alpha=1 - cfg.lr_decay)
        if not w:
            return decay
        return optax.join_schedules([optax.linear_schedule(lr / (w + 1), lr, w), decay], [w])
    return optax.linear_schedule(lr / (w + 1), lr, w) if w else lr


def batch_from_records(records: list[PackedRecord]) -> dict[str, np.ndarray]:
    """Stack B records of [rows, seq] into one [B * rows, seq] batch."""
    return {f: np.concatenate([getattr(r, f) for r in records], axis=0) for f in BATCH_FIELDS}


class Rows(typing.NamedTuple):
    """What the step needs of the record layout's rows (static): `span`, the longest
    trajectory (None: whole rows), for banded attention; `segments`, trajectories per row
    at most, for the loss's per-sequence sums."""

    span: int | None = None
    segments: int = DEFAULT_MAX_SEGMENTS_PER_ROW


def _loss_fn(graphdef, cfg: losses.LossConfig, num: Numerics, remat, rows: Rows, frozen, params, ref_params, batch):
    """The RL loss of one micro-batch, normalised by the whole batch's totals (in `batch`).
    The forward runs on num.dtype copies of the weights: their gradients reach the float32
    params through the cast."""
    tokens = batch["tokens"]

    def logprobs(p):  # the policy and the KL reference: the same attention
        model = _merged(graphdef, cast_floats(p, num.dtype), cast_floats(frozen, num.dtype))
        hidden = model.hidden(
            tokens, batch["segment_ids"], batch["positions"], span=rows.span, remat=remat, attention=num.attention
        )
        return token_logprobs_and_entropy(model.head, hidden, tokens, num.logit_chunk)

    logp, entropy = logprobs(params)
    # One update per batch: the proximal policy (params before this update) is these params.
    proximal = jax.lax.stop_gradient(logp) if cfg.needs_proximal else None
    ref = jax.lax.stop_gradient(logprobs(ref_params)[0]) if cfg.kl_coef > 0 else None
    mask = batch["loss_mask"].astype(np.float32)
    totals = batch["totals"]
    loss, metrics = losses.policy_loss(
        logp,
        batch["behaviour_logprobs"],
        batch["advantages"],
        mask,
        batch["segment_ids"],
        cfg,
        proximal_logp=proximal,
        ref_logp=ref,
        totals=totals,
        max_segments=rows.segments,
    )
    metrics["losses/entropy"] = losses.masked_mean(entropy, mask, totals["tokens"])
    return loss, metrics


def _merged(graphdef, params, frozen):
    """The module of trainable params (and, with LoRA, the frozen base)."""
    return nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)


def _grads(graphdef, cfg, num: Numerics, lay: Layout, row: Rows, params, ref_params, batch, frozen=None):
    """((loss, metrics), grads) of the batch, in the layout's micro-batches."""
    rows = batch["tokens"].shape[0]
    totals = losses.batch_totals(batch["loss_mask"], batch["segment_ids"], row.segments)
    # Every micro-batch divides by the whole batch's totals (a copy per row: the scan
    # slices every leaf of the batch along its rows).
    batch = {**batch, "totals": jax.tree.map(lambda x: jnp.broadcast_to(x, (rows,)), totals)}

    def loss_fn(p, part):
        part = {**part, "totals": jax.tree.map(lambda x: x[0], part["totals"])}
        return _loss_fn(graphdef, cfg, num, lay.remat, row, frozen, p, ref_params, part)

    return gradients.value_and_grad(loss_fn, params, batch, lay.micro_batches)


def _train_step(graphdef, tx, cfg, num, lay, rows: Rows, params, opt_state, ref_params, batch, frozen=None):
    (loss, metrics), grads = _grads(graphdef, cfg, num, lay, rows, params, ref_params, batch, frozen)
    # A non-finite loss or gradient (logits overflowing, say) must not reach the weights:
    # skip the update, keep the optimizer state, count it. A cond, not a select over the
    # trees: a select holds the old and the new params and moments at once (1 GB more at 135 M).
    ok = losses.all_finite(loss, grads)

    def update(state):
        params, opt_state = state
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    new_params, new_opt_state = jax.lax.cond(ok, update, lambda state: state, (params, opt_state))
    metrics["losses/grad_norm"] = optax.tree.norm(grads)
    metrics["losses/skipped_nonfinite"] = 1.0 - ok.astype(jnp.float32)
    return new_params, new_opt_state, metrics


class Learner:
    """Params and optimizer state, optionally sharded over a ("data", "model") mesh, and
    one jitted step with donated state per record shape."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        cfg: LearnerConfig,
        mesh=None,
        model: Transformer | None = None,
        span: int | None = None,
        max_segments: int = DEFAULT_MAX_SEGMENTS_PER_ROW,
        total_steps: int | None = None,
        tokenizer=BYTE_TOKENIZER,
        tokenizer_source: str = BYTE,
    ):
        """model: the initial Transformer (e.g. a Hugging Face checkpoint's; with LoRA its
        Linears are wrapped in place); None: init_model(model_cfg, cfg.seed).
        tokenizer, tokenizer_source: the model's (the warm start writes demonstrations with
        it; each published version names where it came from).
        span: the layout's longest trajectory. Given, rows longer than it are scored with
        banded attention (exact only while no segment is longer: train_step refuses one).
        max_segments: the layout's trajectories per row at most (the loss sums per segment).
        total_steps: the run's steps, over which cfg.lr_decay decays the learning rate."""
        self.model_cfg, self.cfg, self.mesh, self.span = model_cfg, cfg, mesh, span
        self.rows = Rows(span, max_segments)
        self.tokenizer, self.tokenizer_source = tokenizer, tokenizer_source
        if model is None:
            model = init_model(model_cfg, cfg.seed)
        elif model.cfg != model_cfg:
            raise ValueError("the initial model's config differs from model_cfg")
        # The dtype, attention kernel and logit chunk of every step, for this device.
        self.numerics = cfg.compute.numerics()
        if cfg.lora.rank:
            self.graphdef, params, frozen = split_lora(add_lora(model, cfg.lora, cfg.seed))
            # The frozen base is only ever read in the compute dtype: keep it so (half the memory in bf16).
            frozen = cast_floats(frozen, self.numerics.dtype)
        else:
            (self.graphdef, params), frozen = split_params(model), None
        lr = self.learning_rate = learning_rate_schedule(cfg, total_steps)
        tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adamw(lr, weight_decay=cfg.weight_decay))
        self._step_of = functools.partial(_train_step, self.graphdef, tx, cfg.loss, self.numerics)
        self.ref_params = None  # set once by set_reference(); only read when kl_coef > 0
        self.skipped_nonfinite = 0
        self._tx, self._opt_shardings = tx, None
        trainable = sum(x.nbytes for x in jax.tree.leaves(params))
        resident = trainable + sum(x.nbytes for x in jax.tree.leaves(frozen))
        devices = mesh.size if mesh is not None else 1  # the state is sharded over them (near enough)
        memory.check_state(
            resident // devices, 2 * trainable // devices, "the learner's state", "train a LoRA adapter (--lora_rank)"
        )
        if mesh is None:
            self.params, self.opt_state, self.frozen = params, tx.init(params), frozen
            self._batch_sharding = None
        else:
            if frozen is None:
                shardings = sharding.param_shardings(params, mesh)
            else:  # the adapter has no logical axes (and is small): replicated
                shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
            self.frozen = None if frozen is None else jax.device_put(frozen, sharding.param_shardings(frozen, mesh))
            self.params = jax.device_put(params, shardings)
            self.init_optimizer()
            self._batch_sharding = sharding.batch_sharding(mesh)
        self._shardings = None if mesh is None else shardings
        # The params live in host memory: a checkpoint's save reads their buffers in place.
        self.on_host = all(d.platform == "cpu" for x in jax.tree.leaves(self.params) for d in x.devices())
        self._steps: dict[Layout, object] = {}  # the jitted step of each layout tried
        self.steps = 0
        # Per batch shape: the layout chosen by memory, the compiled step, its memory (XLA's
        # memory analysis) and the seconds its compiles took.
        self.layouts: dict[tuple, Layout] = {}
        self.compile_s: dict[tuple, float] = {}
        self.layout_tries: dict[tuple, list] = {}  # every layout considered, with its memory (None: skipped)
        self._compiled: dict[tuple, object] = {}
        self.memory: dict[tuple, memory.StepMemory] = {}

    def train_params_with(self, train):
        """`train(params) -> (params, result)` trains the params with something else (the
        warm start, with its own optimizer). Adam's moments (twice the trainable params)
        are freed meanwhile, and made fresh for the params it returns. Returns `result`."""
        self.opt_state = None
        self.params, result = train(self.params)
        self.init_optimizer()
        return result

    def init_optimizer(self) -> None:
        """A fresh optimizer state for the current params, in the layout the step was compiled for."""
        if self.mesh is None:
            self.opt_state = self._tx.init(self.params)
            return
        opt_state = jax.jit(self._tx.init)(self.params)  # moments follow the params' layout
        if self._opt_shardings is None:  # scalars (step counts) come out on one device: replicate them
            self._opt_shardings = jax.tree.map(
                lambda x: x.sharding if isinstance(x.sharding, NamedSharding) else NamedSharding(self.mesh, P()),
                opt_state,
            )
        self.opt_state = jax.device_put(opt_state, self._opt_shardings)

    def _jitted(self, lay: Layout):
        if lay not in self._steps:
            step = functools.partial(self._step_of, lay, self.rows)
            out = None if self.mesh is None else (self._shardings, self._opt_shardings, None)
            self._steps[lay] = jax.jit(step, donate_argnums=(0, 1), out_shardings=out)
        return self._steps[lay]

    def _executable(self, batch: dict):
        """The step compiled for this batch's shape, once, in the fastest layout that fits
        in the memory that is free (layout.choose); memory.StepDoesNotFit, with every
        layout's numbers, before any step runs if none does."""
        key = batch["tokens"].shape
        if key not in self._compiled:
            # Before set_reference (compile_for at start-up) the reference has the params' shapes.
            ref = self._reference() if self.ref_params is not None or not self.cfg.loss.kl_coef else self.params
            rows, seq_len = key

            def compile_layout(lay):
                compiled = self._jitted(lay).lower(self.params, self.opt_state, ref, batch, self.frozen).compile()
                heap.release()  # the compiler's working memory, before the step's own
                return compiled

            t0 = time.perf_counter()
            hint = f"lower the rows per step ({rows} = batch_records x rows), or use --lora_rank"
            compiled, lay, self.memory[key], self.layout_tries[key] = layout.choose(
                compile_layout, self.cfg.compute, rows, f"the learner step at {rows}x{seq_len}", hint
            )
            self.compile_s[key] = time.perf_counter() - t0
            self.layouts[key] = lay
            self._compiled[key] = compiled
        return self._compiled[key]

    def compile_for(self, rows: int, seq_len: int) -> memory.StepMemory:
        """Compiles the step for batches of rows x seq_len now (the one compile a run of that
        shape needs) and checks it against free memory: memory.StepDoesNotFit, with the
        numbers, before any step or warm start has run."""
        batch = {f: np.zeros((rows, seq_len), ARRAY_SPECS[f].newbyteorder("=")) for f in BATCH_FIELDS}
        if self._batch_sharding is not None:
            batch = jax.device_put(batch, self._batch_sharding)
        self._executable(batch)
        return self.memory[(rows, seq_len)]

    def step_flops(self, records: list[PackedRecord]) -> float:
        """Model FLOPs of a step on this batch (core/policy/model/flops.py: 6 N a trained token
        plus causal attention within each segment, and the KL reference's forward): what
        the step's MFU divides by. Padding and remat's recomputation are not counted."""
        lengths = segment_lengths(np.concatenate([r.segment_ids for r in records], axis=0))
        trainable = "adapter" if self.cfg.lora.rank else "all"
        return train_flops(self.model_cfg, lengths, trainable, reference=self.cfg.loss.kl_coef > 0)

    def train_step(self, records: list[PackedRecord]) -> dict[str, float]:
        if len(records) != self.cfg.batch_records:
            raise ValueError(f"expected {self.cfg.batch_records} records, got {len(records)}")
        batch = batch_from_records(records)
        # The consumer dead-letters such records; this guards every other caller, as banded
        # attention would silently cut a longer segment's context.
        if self.span is not None and int(batch["positions"].max()) >= self.span:
            raise ValueError(
                f"a segment of {int(batch['positions'].max()) + 1} tokens is longer than the learner's span {self.span}"
            )
        if self._batch_sharding is not None:
            batch = jax.device_put(batch, self._batch_sharding)
        step = self._executable(batch)
        self.params, self.opt_state, metrics = step(self.params, self.opt_state, self._reference(), batch, self.frozen)
        out = {k: float(v) for k, v in metrics.items()}
        # The rate this step used (Adam's count: self.steps, as no step was skipped).
        out["optimizer/learning_rate"] = float(
            self.learning_rate(self.steps) if callable(self.learning_rate) else self.learning_rate
        )
        self.steps += 1
        self.skipped_nonfinite += int(out["losses/skipped_nonfinite"])
        return out

    def loss_and_grads(self, records: list[PackedRecord]):
        """((loss, metrics), grads) of a batch under the current params, with no update: the
        step's own path (micro-batches, remat, chunked log-probs), for tests and diagnostics."""
        batch = batch_from_records(records)
        if self._batch_sharding is not None:
            batch = jax.device_put(batch, self._batch_sharding)
        fixed = self.cfg.compute.layouts(batch["tokens"].shape[0])
        if len(fixed) == 1:  # nothing to choose
            lay = fixed[0]
        else:  # the layout the step would run in
            self._executable(batch)
            lay = self.layouts[batch["tokens"].shape]
        fn = functools.partial(_grads, self.graphdef, self.cfg.loss, self.numerics, lay, self.rows)
        return jax.jit(fn)(self.params, self._reference(), batch, self.frozen)

    def restore(self, step: int, state: dict) -> None:
        """A checkpoint's params, optimizer state and reference (learner_state_of's keys),
        as of `step`."""
        self.params, self.opt_state, self.steps = state["params"], state["opt_state"], step
        if "ref_params" in state:
            self.ref_params = state["ref_params"]

    def load_params(self, params: dict) -> None:
        """Params from a plain nested dict (a policy store's version), laid out as the
        initial ones: uncommitted arrays without a mesh (Orbax's committed ones would make
        the first step compile for them and the second again for its own outputs)."""
        nnx.replace_by_pure_dict(self.params, params)
        if self.mesh is None:
            self.params = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), self.params)
        else:
            self.params = jax.device_put(self.params, self._shardings)

    def set_reference(self, params) -> None:
        """The KL reference policy, loaded once at start (a copy: the step donates params).
        With LoRA: an adapter (the base is shared with the policy)."""
        ref = jax.tree.map(jnp.array, params)
        self.ref_params = ref if self._shardings is None else jax.device_put(ref, self._shardings)

    def _reference(self):
        if self.cfg.loss.kl_coef == 0:
            return None  # never read by the step (cfg is static), so nothing is passed
        if self.ref_params is None:
            raise ValueError("kl_coef > 0 needs a reference policy: call set_reference() first")
        return self.ref_params

    def model_of(self, params) -> Transformer:
        """The module of these trainable params (with LoRA: on the frozen base)."""
        return _merged(self.graphdef, params, self.frozen)

    def params_dict(self) -> dict:
        """Params as a nested dict of arrays: what the policy store writes (with LoRA: the
        adapter alone)."""
        return nnx.to_pure_dict(self.params)

    def full_params_dict(self) -> dict:
        """The plain model's params (with LoRA: the adapter merged into the base), for an export."""
        if self.frozen is None:
            return self.params_dict()
        return nnx.to_pure_dict(nnx.state(merge(self.model_of(self.params)), nnx.Param))

    def compiled_variants(self) -> int:
        return len(self._compiled) + sum(f._cache_size() for f in self._steps.values())
