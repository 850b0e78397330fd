"""Placing the learner on a device mesh: logical axis names -> mesh axes.

The model annotates every parameter with logical axes ("embed", "q_heads", "mlp", ...).
The rules below map them onto a ("data", "model") mesh: the batch is split over "data",
the wide dimensions of the weights over "model", everything else is replicated. One
table to change for another layout.
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

LOGICAL_RULES = {
    "batch": "data",
    "vocab": "model",
    "q_heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "embed": None,
}


def make_mesh(data: int, model: int = 1) -> jax.sharding.Mesh:
    # Auto axes: GSPMD propagates shardings through the step; only inputs and the
    # persistent state are placed explicitly.
    return jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def _mesh_spec(spec: PartitionSpec) -> PartitionSpec:
    return PartitionSpec(*(LOGICAL_RULES.get(axis) if axis is not None else None for axis in spec))


def param_shardings(params: nnx.State, mesh) -> nnx.State:
    """NamedShardings for the params State, from the logical annotations."""
    specs = nnx.get_partition_spec(params)
    return jax.tree.map(
        lambda s: NamedSharding(mesh, _mesh_spec(s)), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )


def batch_sharding(mesh) -> NamedSharding:
    """Rows of a [rows, seq] batch over the data axis."""
    return NamedSharding(mesh, PartitionSpec("data", None))
