"""A learner of several JAX processes on this machine, joined as Vertex AI joins replicas.

Each process gets the `CLUSTER_SPEC` Vertex AI sets (workerpool0: the primary, process 0;
workerpool1: the others), with every address on 127.0.0.1, so the learner's own start-up
(trainer/cloud/distributed.py) runs `jax.distributed.initialize` exactly as it would on
Vertex, with CPU collectives over gloo. Process 0 owns the data plane; the others follow
it (trainer/learning/step/lockstep.py). Logs: learner.log (process 0), learner-1.log, ...
"""

from __future__ import annotations

import json
import time

from localstack.emulators.pubsub import free_port


def learner_envs(processes: int, env: dict) -> list[tuple[str, dict]]:
    """(log file name, environment) per learner process, process 0 first."""
    if processes <= 1:
        return [("learner.log", env)]
    ports = [free_port() for _ in range(processes)]
    cluster = {
        "workerpool0": [f"127.0.0.1:{ports[0]}"],
        "workerpool1": [f"127.0.0.1:{p}" for p in ports[1:]],
    }
    out = []
    for i in range(processes):
        task = {"type": "workerpool0", "index": 0} if i == 0 else {"type": "workerpool1", "index": i - 1}
        spec = {"cluster": cluster, "environment": "cloud", "task": task, "job": {}}
        clean = {k: v for k, v in env.items() if k != "TF_CONFIG"}
        out.append(("learner.log" if i == 0 else f"learner-{i}.log", {**clean, "CLUSTER_SPEC": json.dumps(spec)}))
    return out


def wait_followers(followers: list, timeout_s: float) -> list[str]:
    """Once process 0 has exited: what each other process ended with ("" when it exited 0)."""
    deadline = time.monotonic() + timeout_s
    while any(f.poll() is None for f in followers) and time.monotonic() < deadline:
        time.sleep(0.2)
    problems = []
    for i, f in enumerate(followers, start=1):
        rc = f.poll()
        if rc != 0:
            still = "still running" if rc is None else f"exited with {rc}"
            problems.append(f"learner process {i} {still}:\n{f.log_tail()}")
    return problems
