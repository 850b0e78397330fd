"""Two real JAX processes on this machine, started as a Vertex AI custom job starts its
replicas: CLUSTER_SPEC names workerpool0 (process 0, the coordinator) and workerpool1
(process 1); trainer/cloud/distributed.py joins them, with CPU collectives over gloo and 2
virtual CPU devices each, a (data=4, model=1) mesh across both. Each runs
tests/_two_process_worker.py, feeding the step its own record (sharding.global_batch).

- the two-process step equals one process's step on the whole batch;
- both write a checkpoint at step 1; process 1 is SIGKILLed after step 2 and the survivor
  is stopped; both restarted restore step 1 exactly and redo step 2 to the uninterrupted
  run's params and optimizer state;
- only process 0 publishes policy versions and writes telemetry;
- nothing is left running.
"""

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from _two_process_worker import LEARNER, MODEL, batch_records

from core.contracts.store import PolicyStore
from localstack.launch.processes import ProcessGroup, group_alive
from trainer.learning.persistence.checkpoint import LearnerCheckpointer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

WORKER = Path(__file__).with_name("_two_process_worker.py")
WAIT_S = 240  # per phase; on 2 idle cores a phase takes well under a minute
RTOL, ATOL = 1e-5, 1e-6


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def vertex_env(process_id: int, ports: list[int]) -> dict:
    """What Vertex AI sets on replica `process_id` of a job with one replica per pool."""
    spec = {
        "cluster": {"workerpool0": [f"127.0.0.1:{ports[0]}"], "workerpool1": [f"127.0.0.1:{ports[1]}"]},
        "environment": "cloud",
        "task": {"type": f"workerpool{process_id}", "index": 0},
        "job": {"worker_pool_specs": [{"replica_count": "1"}, {"replica_count": "1"}]},
    }
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    return {**env, "CLUSTER_SPEC": json.dumps(spec), "CLOUD_ML_JOB_ID": "two-process-test"}


def start_pair(phase: str, out: Path, cache: Path) -> list[ProcessGroup]:
    ports = free_ports(2)
    common = {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "LOCAL_DEVICES": "2",
        # The resumed pair reuses what the first compiled (each phase compiles the same steps).
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "WORKER_LIMIT_S": str(WAIT_S + 30),  # the worker's own hard stop
    }
    cmd = [sys.executable, str(WORKER), phase, str(out)]
    return [ProcessGroup(cmd, out / f"{phase}-p{i}.log", {**vertex_env(i, ports), **common}).start() for i in (0, 1)]


def wait_until(done, pair: list[ProcessGroup], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        failed = [(i, pg.poll()) for i, pg in enumerate(pair) if pg.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            logs = "\n".join(f"--- process {i}:\n{pg.log_tail(3000)}" for i, pg in enumerate(pair))
            pytest.fail(f"{what}: {'exited ' + str(failed) if failed else f'not after {timeout_s}s'}\n{logs}")
        time.sleep(0.2)


def load(out: Path, name: str, pid: int) -> dict[str, np.ndarray]:
    with np.load(out / f"{name}-p{pid}.npz") as f:
        return dict(f)


def leaves(dump: dict, prefix: str) -> list[np.ndarray]:
    return [dump[f"{prefix}{i}"] for i in range(sum(k.startswith(prefix) and k[1:].isdigit() for k in dump))]


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b))


def assert_same(a: dict, b: dict, *, exact: bool) -> None:
    for prefix in ("p", "o"):
        xs, ys = leaves(a, prefix), leaves(b, prefix)
        assert len(xs) == len(ys) > 0
        for x, y in zip(xs, ys):
            if exact:
                np.testing.assert_array_equal(x, y)
            else:
                np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)


def one_process_step() -> tuple[dict, list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """The learner's own step (no mesh, one process) on the same two records: its metrics,
    params, optimizer state and (clipped) gradients."""
    import jax
    from flax import nnx

    from trainer.learning.step.learner import Learner

    learner = Learner(MODEL, LEARNER)
    metrics = learner.train_step(batch_records(1))
    params = [np.asarray(x) for x in jax.tree.leaves(learner.params_dict())]
    adam = next(s for s in jax.tree.leaves(learner.opt_state, is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu"))
    grads = [np.asarray(m) / (1 - 0.9) for m in jax.tree.leaves(nnx.to_pure_dict(adam.mu))]  # step 1: mu = (1-b1) g
    return metrics, params, [np.asarray(x) for x in jax.tree.leaves(learner.opt_state)], grads


def our_workers() -> list[psutil.Process]:
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and str(WORKER) in " ".join(p.cmdline()):
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_two_processes_step_checkpoint_resume_and_publish_as_one(tmp_path):
    out, cache = tmp_path / "run", tmp_path / "jax-cache"
    out.mkdir()
    started = time.monotonic()
    pairs = [start_pair("first", out, cache)]
    try:
        ref_metrics, ref_params, ref_opt, ref_grads = one_process_step()  # meanwhile, here
        first = pairs[0]
        wait_until(lambda: all((out / f"ready-p{i}").exists() for i in (0, 1)), first, WAIT_S, "first run")
        # A checkpoint at step 1 is durable and step 2 is done; process 1 dies.
        os.kill(first[1].pid, signal.SIGKILL)
        first[1].proc.wait(timeout=30)
        # The survivor is stuck in (or fails at) its next collective with no peer: a job
        # whose replica died is restarted as a whole, so it is stopped, never waited for.
        try:
            first[0].proc.wait(timeout=10)
        except Exception:
            first[0].stop(term_grace_s=2)
        assert first[0].poll() is not None and first[1].poll() == -signal.SIGKILL
        killed_at = time.monotonic()

        pairs.append(start_pair("resume", out, cache))
        second = pairs[1]
        wait_until(lambda: all(pg.poll() == 0 for pg in second), second, WAIT_S, "resumed run")
        resumed_s = time.monotonic() - killed_at
    finally:
        for pair in pairs:
            for pg in pair:
                pg.stop(term_grace_s=2)

    # (1) The two-process step is the one-process step: loss, gradients, updated params.
    step1 = [load(out, "step1", i) for i in (0, 1)]
    assert_same(step1[0], step1[1], exact=True)  # both processes hold the same global state
    for name in ("losses/policy_loss", "losses/grad_norm"):
        assert float(step1[0][f"m:{name}"]) == pytest.approx(ref_metrics[name], rel=RTOL)
    # Adam's moments are the gradient (and its square), element by element.
    for x, y in zip(leaves(step1[0], "o"), ref_opt, strict=True):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=RTOL * float(np.abs(y).max()))
    # Adam's first update is lr * g / (|g| + 1e-8): where a gradient is near 1e-8, the
    # rounding of its sum (in another order over 4 devices) moves the update by up to lr.
    # Elsewhere (|g| > 1e-5) the params agree to float precision.
    params, lr = leaves(step1[0], "p"), LEARNER.learning_rate
    tiny = [np.abs(g) <= 1e-5 for g in ref_grads]
    for x, y, t in zip(params, ref_params, tiny, strict=True):
        np.testing.assert_allclose(x[~t], y[~t], rtol=RTOL, atol=ATOL)
        assert np.all(np.abs(x[t] - y[t]) <= 2 * lr)
    assert sum(int(t.sum()) for t in tiny) <= 1e-2 * sum(x.size for x in params)
    well = max(float(np.abs(x[~t] - y[~t]).max()) for x, y, t in zip(params, ref_params, tiny))
    print(
        f"two-process vs one-process step: loss {float(step1[0]['m:losses/policy_loss'])!r} vs "
        f"{ref_metrics['losses/policy_loss']!r}; params max |diff| {max_abs_diff(params, ref_params):.3g} "
        f"({well:.3g} where |grad| > 1e-5; {sum(int(t.sum()) for t in tiny)} elements with |grad| <= 1e-5)"
    )

    # (2) The restart restores exactly what step 1 saved, and its step 2 is the
    # uninterrupted run's step 2.
    for i in (0, 1):
        restored = load(out, "restored", i)
        assert int(restored["step"]) == 1
        assert_same(restored, step1[0], exact=True)
        redone, uninterrupted = load(out, "resumed2", i), load(out, "step2", 0)
        assert int(redone["step"]) == 2
        assert float(redone["m:losses/policy_loss"]) == pytest.approx(
            float(uninterrupted["m:losses/policy_loss"]), rel=RTOL
        )
        assert_same(redone, uninterrupted, exact=False)
    resume_diff = max_abs_diff(leaves(redone, "p"), leaves(uninterrupted, "p"))
    print(f"resumed step 2 vs uninterrupted: params max |diff| {resume_diff:.3g}")
    assert LearnerCheckpointer(out / "ckpt", read_only=True).all_steps() == [1, 2]

    # Only process 0 published (v0 at the start, v1 after the resume) and wrote telemetry.
    assert sorted(p.name for p in out.glob("published-*")) == ["published-v0-p0", "published-v1-p0"]
    assert PolicyStore(out / "store").latest_version() == 1
    assert any(f.is_file() for f in (out / "logs-p0").rglob("*"))
    assert not (out / "logs-p1").exists() or not any(f.is_file() for f in (out / "logs-p1").rglob("*"))

    # (3) Nothing is left running: neither worker nor anything it started.
    assert our_workers() == []
    assert all(pg.poll() is not None and not group_alive(pg.pid) for pair in pairs for pg in pair)
    print(f"total {time.monotonic() - started:.0f}s (resume {resumed_s:.0f}s)")
