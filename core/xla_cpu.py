"""XLA flags for the CPU backend, set before JAX starts it (it reads XLA_FLAGS once).

XLA's CPU scheduler, by default, orders a computation for concurrency at the price of
memory: it keeps buffers alive that a memory-minimising order frees, and it undoes
rematerialisation (jax.checkpoint saved nothing: SmolLM2-135M's fwd+bwd over 1,152 tokens
took 3.97 GB of temporaries with remat and 4.18 GB without). Off, the same step takes 0.29 GB
for four layers with remat instead of 0.73 GB, at the same speed (docs/MODELS.md). With
one or two cores there is little concurrency to buy anyway.
"""

from __future__ import annotations

import os

FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def configure() -> None:
    """Adds FLAGS to XLA_FLAGS unless the user set those flags already."""
    current = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in FLAGS if f.split("=")[0] not in current]
    if missing:
        os.environ["XLA_FLAGS"] = " ".join([current, *missing]).strip()
