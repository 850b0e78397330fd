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


def global_batch(local: dict, mesh) -> dict:
    """One global [rows, seq] batch over the data axis from each process's own rows.

    Multi-host data feeding: every learner process pulls its own share of the records from
    the same Pub/Sub subscription (Pub/Sub spreads a subscription's messages over its
    subscribers) and contributes those rows; nothing is broadcast. We chose that over
    "process 0 consumes and broadcasts" because the alternative funnels every record
    through one host (its network and decoding) and adds a broadcast of the whole batch
    to every step, which grows with the number of hosts; with shares, data throughput
    scales with the hosts. What it needs is that every process calls the step with the
    same global shape, which fixed-shape records give: each process contributes the same
    number of records of one RecordShape, so the global batch is that times the process
    count. (Deciding *when* to step, with which bucket, still has to be agreed across
    processes, e.g. by process 0's choice over the distributed key-value store; that part
    belongs to the data plane and is not built yet.)

    `local`: field -> [local rows, seq] host array, the same local shape on every process;
    the global batch has process_count times the rows, each process's on its own devices'
    block of the data axis (the order of rows does not change the loss). With one process
    this is a plain device_put onto batch_sharding(mesh).
    """
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (v.shape[0] * jax.process_count(), *v.shape[1:]))
        for k, v in local.items()
    }
