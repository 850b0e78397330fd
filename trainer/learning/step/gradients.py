"""How a step computes its gradients within memory and at the device's speed: the compute
dtype, per-layer rematerialisation, the vocabulary projection in chunks, micro-batches whose
gradients are summed, and the attention kernel.

One path for every step that trains: the RL step (learner.py), the warm start
(warmstart.py) and the planner's measurement of the RL step.

- Layout (remat, micro-batches): chosen by memory, not by model size (layout.py): the
  fastest that XLA's memory analysis says fits, trying remat off before on and, on an
  accelerator, fewer micro-batches before more (on a CPU, one row a micro-batch). Remat
  recomputes each layer's forward (a third more FLOPs); without it a real model's
  activations are what binds (SmolLM2-135M at 8 x 1024 in f32
  asked for 14 GB beyond its state).
- Mixed precision: weights and activations in bfloat16 in the forward and backward (the
  TPU's matrix unit runs bf16 at full rate), while params, gradient sums and Adam's state
  stay float32 and logits, log-softmax and the loss are float32 (model.head accumulates
  the vocabulary projection in float32).

Micro-batches are exact: a loss divides by the *whole* batch's counts (losses.batch_totals),
so the micro-batches' losses, mean diagnostics and gradients sum to the whole batch's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from core.config import configclass, knob
from core.policy.model.transformer import ATTENTION_IMPLS

REMAT = ("auto", "on", "off")
DTYPES = ("auto", "float32", "bfloat16")
ATTENTION = ("auto", *ATTENTION_IMPLS)
# logit_chunk 0: tokens projected onto the vocabulary at once, by device. A CPU keeps one
# chunk's float32 logits small (512 x 49,152 are 100 MB); an accelerator wants long
# matmuls and has the memory: 2,048 x 151,936 float32 logits are 1.2 GB.
AUTO_LOGIT_CHUNK = {"cpu": 512}
AUTO_LOGIT_CHUNK_ACCELERATOR = 2048


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one step's batch is laid out in memory."""

    remat: bool
    micro_batches: int

    def __str__(self) -> str:
        return f"remat {'on' if self.remat else 'off'}, {self.micro_batches} micro-batch(es)"


@dataclasses.dataclass(frozen=True)
class Numerics:
    """ComputeConfig's device-dependent choices, resolved for one backend."""

    dtype: jnp.dtype  # the forward and backward's weights and activations
    attention: str  # one of ATTENTION_IMPLS
    logit_chunk: int


@configclass
class ComputeConfig:
    """Memory against compute in a train step (the RL step and the warm start alike)."""

    remat: str = knob(
        "auto",
        "recompute each layer's activations in the backward pass instead of keeping them "
        "(auto: off when the step fits in memory without it, else on)",
        choices=REMAT,
    )
    micro_batches: int = knob(
        0,
        "split a step's rows into this many micro-batches and sum their gradients: activations scale "
        "with one (0: auto: the fewest that fit in memory)",
        ge=0,
    )
    logit_chunk: int = knob(
        0,
        "tokens projected onto the vocabulary at once (log-probs and entropy in chunks; "
        f"0: {AUTO_LOGIT_CHUNK['cpu']} on CPU, {AUTO_LOGIT_CHUNK_ACCELERATOR} on accelerators)",
        ge=0,
    )
    dtype: str = knob(
        "auto",
        "the compute dtype of weights and activations in a step; params, gradient sums and optimizer "
        "state stay float32, logits and the loss float32 (auto: bfloat16 on accelerators, float32 on CPU)",
        flag="compute_dtype",
        choices=DTYPES,
    )
    attention: str = knob(
        "auto",
        "attention in training: xla (dense, or banded for short segments) or splash (Pallas' flash "
        "kernel with segment ids; off a TPU it is interpreted, for tests only; auto: splash on TPU)",
        choices=ATTENTION,
    )
    memory_gb: float = knob(
        0.0,
        "the most a step's working memory (beyond params, optimizer state and batch) may take when "
        "remat and micro-batches are chosen (0: what the device has free, less headroom)",
        flag="step_memory_gb",
        ge=0,
    )

    def numerics(self, backend: str | None = None) -> Numerics:
        """The dtype, attention and logit chunk for `backend` (default: JAX's)."""
        backend = backend or jax.default_backend()
        cpu = backend == "cpu"
        dtype = self.dtype if self.dtype != "auto" else ("float32" if cpu else "bfloat16")
        attention = self.attention if self.attention != "auto" else ("splash" if backend == "tpu" else "xla")
        chunk = self.logit_chunk or AUTO_LOGIT_CHUNK.get(backend, AUTO_LOGIT_CHUNK_ACCELERATOR)
        return Numerics(jnp.dtype(dtype), attention, chunk)

    def layouts(self, rows: int, backend: str | None = None) -> list[Layout]:
        """The layouts a step of `rows` rows may run in on `backend` (default: JAX's),
        fastest first: remat off before on; on an accelerator fewer micro-batches before more
        (each a divisor of rows, so every micro-batch has the same compiled shape), on a CPU
        one row a micro-batch, whose smaller working set runs faster there (SmolLM2 at
        4 x 1,152, remat off: 73.5 tok/s in 4 micro-batches, 51.1 in one; the byte model at
        4 x 1,024: 1.30 against 1.38 s a step). Refuses a fixed count that does not divide
        the rows."""
        if self.micro_batches:
            if rows % self.micro_batches:
                raise ValueError(
                    f"--micro_batches {self.micro_batches} must divide the step's {rows} rows "
                    "(batch_records x rows per record, or the warm start's batch)"
                )
            counts = [self.micro_batches]
        elif (backend or jax.default_backend()) == "cpu":
            counts = [rows]
        else:
            counts = [m for m in range(1, rows + 1) if rows % m == 0]
        remats = {"off": [False], "on": [True], "auto": [False, True]}[self.remat]
        return [Layout(r, m) for r in remats for m in counts]


def cast_floats(tree, dtype):
    """Every floating leaf of `tree` in `dtype` (the step's compute copies; None passes)."""
    if tree is None:
        return None

    def cast(x):
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype else x

    return jax.tree.map(cast, tree)


def n_params(tree) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(tree) if hasattr(x, "size"))


def value_and_grad(loss_fn, params, batch: dict, micro_batches: int):
    """((loss, metrics), grads) of loss_fn(params, micro_batch) -> (loss, metrics), summed
    over `micro_batches` equal slices of the batch's rows (leading axis) with lax.scan, so
    one slice's activations are live at a time. loss_fn must normalise by the whole batch
    (losses.batch_totals): the sums are then the whole batch's values. Metrics named
    *_max are combined by max, the rest summed."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro_batches == 1:
        return grad_fn(params, batch)
    parts = jax.tree.map(lambda x: x.reshape(micro_batches, x.shape[0] // micro_batches, *x.shape[1:]), batch)
    first = jax.tree.map(lambda x: x[0], parts)
    (_, metric_shapes), _ = jax.eval_shape(grad_fn, params, first)
    init = (
        jnp.zeros((), jnp.float32),
        {k: jnp.full(s.shape, -jnp.inf if k.endswith("_max") else 0.0, s.dtype) for k, s in metric_shapes.items()},
        jax.tree.map(jnp.zeros_like, params),
    )

    def one(carry, part):
        loss_sum, metrics_acc, grads_acc = carry
        (loss, metrics), grads = grad_fn(params, part)
        metrics_acc = {
            k: jnp.maximum(v, metrics[k]) if k.endswith("_max") else v + metrics[k] for k, v in metrics_acc.items()
        }
        return (loss_sum + loss, metrics_acc, jax.tree.map(jnp.add, grads_acc, grads)), None

    (loss, metrics, grads), _ = jax.lax.scan(one, init, parts)
    return (loss, metrics), grads
