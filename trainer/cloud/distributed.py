"""Where this learner process sits in a Vertex AI custom job, and multi-host JAX start-up.

Vertex AI sets, on every replica (Vertex AI docs, "Using distributed training" and
`CustomJobSpec.base_output_directory`):
- `AIP_MODEL_DIR`, `AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR`: `<base_output_directory>/
  model/`, `checkpoints/`, `logs/` (with a `<trial_id>/` level in hyperparameter tuning jobs);
- `CLOUD_ML_JOB_ID`: the job's id;
- `CLUSTER_SPEC`: JSON `{"cluster": {"workerpool0": ["host:port"], "workerpool1": [...], ...},
  "environment": "cloud", "task": {"type": "workerpool0", "index": 0, "trial": ...}, "job": {...}}`;
- `TF_CONFIG` (distributed jobs only): the same cluster under TensorFlow names (chief or
  master, worker, ps, evaluator). Read only when `CLUSTER_SPEC` is absent.

Locally none of these are set: one process, nothing to initialise.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping

# Pools whose replicas all run the learner, in process-id order. Vertex reserves
# workerpool2 (parameter servers / reduction server) and workerpool3 (evaluators) for
# other roles; this learner does not use them.
TRAINING_POOLS = ("workerpool0", "workerpool1")
_TF_CONFIG_POOLS = {
    "chief": "workerpool0",
    "master": "workerpool0",
    "worker": "workerpool1",
    "ps": "workerpool2",
    "evaluator": "workerpool3",
}


@dataclasses.dataclass(frozen=True)
class VertexEnv:
    """What Vertex AI told this process. Every field is None/empty when run locally."""

    job_id: str | None = None
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    tensorboard_log_dir: str | None = None
    cluster: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    task_type: str | None = None
    task_index: int = 0
    trial: str | None = None

    def __post_init__(self):
        if self.task_type is not None:
            pool = self.cluster.get(self.task_type)
            if pool is None:
                raise ValueError(f"task type {self.task_type!r} is not in the cluster {sorted(self.cluster)}")
            if not 0 <= self.task_index < len(pool):
                raise ValueError(
                    f"task index {self.task_index} out of range for {self.task_type} ({len(pool)} replicas)"
                )
        for pool, addresses in self.cluster.items():
            for a in addresses:
                host, _, port = a.rpartition(":")
                if not host or not port.isdigit():
                    raise ValueError(f"{pool}: address {a!r} is not host:port")

    @property
    def on_vertex(self) -> bool:
        return self.job_id is not None or bool(self.cluster)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Addresses of every learner process, primary first (= process ids)."""
        return tuple(a for p in TRAINING_POOLS for a in self.cluster.get(p, ()))

    @property
    def num_processes(self) -> int:
        return max(1, len(self.hosts))

    @property
    def process_id(self) -> int:
        if self.task_type is None:
            return 0
        if self.task_type not in TRAINING_POOLS:
            raise ValueError(f"{self.task_type} is not a learner pool {TRAINING_POOLS}")
        offset = sum(len(self.cluster.get(p, ())) for p in TRAINING_POOLS[: TRAINING_POOLS.index(self.task_type)])
        return offset + self.task_index

    @property
    def coordinator_address(self) -> str | None:
        """The primary replica's `host:port` from the cluster spec, or None locally."""
        return self.hosts[0] if self.hosts else None


def _parse_cluster(spec: dict, names: Mapping[str, str] | None = None):
    names = names or {}
    cluster = {names.get(k, k): tuple(v) for k, v in (spec.get("cluster") or {}).items()}
    task = spec.get("task") or {}
    task_type = names.get(task.get("type"), task.get("type"))
    return cluster, task_type, int(task.get("index", 0)), task.get("trial")


def read_vertex_env(environ: Mapping[str, str] = os.environ) -> VertexEnv:
    """Parse the variables Vertex AI sets; raises ValueError on a malformed cluster spec."""
    cluster, task_type, index, trial = {}, None, 0, None
    try:
        if environ.get("CLUSTER_SPEC"):
            cluster, task_type, index, trial = _parse_cluster(json.loads(environ["CLUSTER_SPEC"]))
        elif environ.get("TF_CONFIG"):
            cluster, task_type, index, trial = _parse_cluster(json.loads(environ["TF_CONFIG"]), _TF_CONFIG_POOLS)
    except (json.JSONDecodeError, TypeError, AttributeError) as e:
        raise ValueError(f"malformed CLUSTER_SPEC/TF_CONFIG: {e}") from e
    return VertexEnv(
        job_id=environ.get("CLOUD_ML_JOB_ID"),
        model_dir=environ.get("AIP_MODEL_DIR"),
        checkpoint_dir=environ.get("AIP_CHECKPOINT_DIR"),
        tensorboard_log_dir=environ.get("AIP_TENSORBOARD_LOG_DIR"),
        cluster=cluster,
        task_type=task_type,
        task_index=index,
        trial=trial,
    )


@dataclasses.dataclass(frozen=True)
class DistributedInfo:
    process_index: int = 0
    process_count: int = 1
    coordinator_address: str | None = None
    initialized: bool = False  # True only if jax.distributed.initialize() was called

    @property
    def is_primary(self) -> bool:
        return self.process_index == 0


def maybe_initialize_distributed(
    env: VertexEnv | None = None, *, coordinator_port: int | None = None, initialize: Callable[..., None] | None = None
) -> DistributedInfo:
    """Start multi-host JAX when the cluster spec lists more than one learner host.

    Call it first, before any JAX computation (jax.distributed requires that). A no-op on
    a single host or locally. The coordinator is the primary replica (workerpool0[0]) at
    the port the cluster spec gives (Vertex exposes each replica through a service on that
    port, so another port may not be reachable); `coordinator_port` overrides it.
    `initialize` is injectable for tests; it defaults to `jax.distributed.initialize`,
    with CPU collectives over gloo (use_gloo_on_cpu): tests/test_two_process_learner.py
    runs that real path, two processes on localhost with the cluster spec Vertex sets.
    """
    env = env if env is not None else read_vertex_env()
    if env.num_processes <= 1:
        return DistributedInfo()
    host, _, port = env.coordinator_address.rpartition(":")
    address = f"{host}:{coordinator_port or port}"
    if initialize is None:
        import jax

        use_gloo_on_cpu(jax)
        initialize = jax.distributed.initialize
    initialize(coordinator_address=address, num_processes=env.num_processes, process_id=env.process_id)
    return DistributedInfo(env.process_id, env.num_processes, address, True)


def use_gloo_on_cpu(jax) -> None:
    """CPU collectives between processes over TCP (gloo), unless another implementation
    (mpi) was chosen. Without one, a CPU-only multi-process job (CPU replicas, a local
    test) could not run a step sharded over processes. It configures the CPU client only,
    so it is harmless on TPU/GPU hosts; and it must precede the backend's start-up, which
    jax.distributed.initialize() does too."""
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def is_primary(info: DistributedInfo | None = None) -> bool:
    """Only process 0 writes metrics and publishes policies. Without `info` this asks JAX,
    which starts its backend: call maybe_initialize_distributed() before that."""
    if info is not None:
        return info.is_primary
    import jax

    return jax.process_index() == 0
