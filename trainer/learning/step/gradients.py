"""How a step computes its gradients within memory: per-layer rematerialisation, the
vocabulary projection in chunks, and micro-batches whose gradients are summed.

One path for every step that trains: the RL step (learner.py), the warm start
(warmstart.py) and the planner's measurement of the RL step. A real model's step is
dominated by activations, not weights: at 4 x 1,152 tokens SmolLM2-135M's plain step asked
XLA for 22 GB per record; with each layer recomputed in the backward pass, the logits a
chunk at a time and one row per micro-batch, activations stay a few hundred MB.

Micro-batches are exact: a loss divides by the *whole* batch's counts (losses.batch_totals),
so the micro-batches' losses, mean diagnostics and gradients sum to the whole batch's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core.config import configclass, knob

REMAT = ("auto", "on", "off")
# auto: the built-in byte policy (0.1 M parameters) keeps every activation, as it always has.
AUTO_REMAT_PARAMS = 10_000_000
AUTO_MICRO_BATCH_TOKENS = 2048  # auto micro-batches: rows adding up to at most this (one row at least)


@configclass
class ComputeConfig:
    """Memory against compute in a train step (the RL step and the warm start alike)."""

    remat: str = knob(
        "auto",
        "recompute each layer's activations in the backward pass instead of keeping them "
        f"(auto: on for models over {AUTO_REMAT_PARAMS:,} parameters, e.g. any --model checkpoint)",
        choices=REMAT,
    )
    micro_batches: int = knob(
        0,
        "split a step's rows into this many micro-batches and sum their gradients: activations scale "
        f"with one (0: auto: with remat on, micro-batches of about {AUTO_MICRO_BATCH_TOKENS} tokens; else 1)",
        ge=0,
    )
    logit_chunk: int = knob(512, "tokens projected onto the vocabulary at once (log-probs and entropy in chunks)", ge=1)

    def remat_for(self, n_params: int) -> bool:
        return self.remat == "on" or (self.remat == "auto" and n_params > AUTO_REMAT_PARAMS)

    def micro_batches_for(self, rows: int, seq_len: int, remat: bool) -> int:
        """How many micro-batches a step of `rows` rows of `seq_len` runs in; refuses a count
        that does not divide the rows (each micro-batch has the same compiled shape)."""
        if self.micro_batches:
            if rows % self.micro_batches:
                raise ValueError(
                    f"--micro_batches {self.micro_batches} must divide the step's {rows} rows "
                    "(batch_records x rows per record, or the warm start's batch)"
                )
            return self.micro_batches
        if not remat:
            return 1
        per = max(1, AUTO_MICRO_BATCH_TOKENS // seq_len)
        while rows % per:
            per -= 1
        return rows // per


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
