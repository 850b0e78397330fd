"""One process of a two-process learner; tests/test_two_process_learner.py starts two with
the CLUSTER_SPEC Vertex AI sets (workerpool0 = process 0, the coordinator; workerpool1 =
process 1) and 2 virtual CPU devices each: a (data=4, model=1) mesh across both.

    python tests/_two_process_worker.py first|resume OUT_DIR

first: fresh start, publish v0, step 1, checkpoint step 1 (durable), step 2, then keep
stepping until killed (the test SIGKILLs process 1 here). resume: restore step 1, step 2,
publish v1, checkpoint step 2, exit. Each process trains on its own share of the records
(trainer/learning/step/sharding.py global_batch says why) and writes `<name>-p<pid>.npz`: the
step's metrics and the gathered params and optimizer state.
"""

import faulthandler
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np
from _learner_data import random_record

from core import config
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.telemetry import trace
from trainer.cloud.distributed import maybe_initialize_distributed, read_vertex_env
from trainer.config import LearnerJobConfig
from trainer.learning import builder as B
from trainer.learning.persistence.checkpoint import LearnerCheckpointer
from trainer.learning.persistence.publisher import PolicyPublisher
from trainer.learning.run_stats import RunStats
from trainer.learning.step.learner import Learner, LearnerConfig, batch_from_records
from trainer.learning.step.sharding import global_batch, make_mesh

T0 = time.monotonic()
MODEL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, mlp_dim=64, max_seq_len=32)
LEARNER = LearnerConfig(batch_records=2, learning_rate=1e-2)
WAIT_MS = 200_000


def batch_records(step: int) -> list:
    """The two records of train step `step` (1, 2, ...): 4 rows of 32 tokens each."""
    return [random_record(10 * step + i, rows=4, seq_len=32) for i in range(2)]


def barrier(name: str) -> None:
    """Every process gets here before any goes on: the coordination service's barrier (no
    collective). Gloo gives a collective's first run 30 s for every process to join, which
    a process still compiling on a starved CPU can miss."""
    from jax._src import distributed

    distributed.global_state.client.wait_at_barrier(name, timeout_in_ms=WAIT_MS)


def train_step(learner: Learner, share: list) -> dict[str, float]:
    """Learner.train_step, fed with this process's share of the batch only (what
    Learner.train_step does with the whole batch on one process)."""
    batch = global_batch(batch_from_records(share), learner.mesh)
    step = learner._executable(batch)  # compiled ahead of its first run, everywhere
    if not learner.steps_compiled:
        barrier(f"train step compiled {learner.steps}")
        learner.steps_compiled = True
    learner.params, learner.opt_state, metrics = step(
        learner.params, learner.opt_state, learner._reference(), batch, learner.frozen
    )
    learner.steps += 1
    return {k: float(v) for k, v in metrics.items()}


def dump(out: Path, name: str, learner: Learner, metrics: dict) -> None:
    """The global params and optimizer state, from this process's own replica (the model
    axis is 1: every leaf is whole on every device; no collective, nothing to compile)."""
    params, opt = jax.tree.leaves(learner.params_dict()), jax.tree.leaves(learner.opt_state)
    assert all(x.is_fully_replicated for x in params + opt)
    params, opt = [x.addressable_data(0) for x in params], [x.addressable_data(0) for x in opt]
    arrays = {f"p{i}": np.asarray(x) for i, x in enumerate(params)}
    arrays.update({f"o{i}": np.asarray(x) for i, x in enumerate(opt)})
    arrays.update({f"m:{k}": np.float64(v) for k, v in metrics.items()})
    arrays["step"] = np.int64(learner.steps)
    tmp = out / f"{name}-p{jax.process_index()}.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, out / f"{name}-p{jax.process_index()}.npz")  # the test never reads half a file


def note(what: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] process {jax.process_index()}: {what}", flush=True)


class RecordingStore(PolicyStore):
    """The real store, leaving a mark of which process wrote each version."""

    def publish(self, version, params, *args, **kwargs):
        (Path(os.fspath(self.root)).parent / f"published-v{version}-p{jax.process_index()}").touch()
        return super().publish(version, params, *args, **kwargs)


def main(phase: str, out: Path, dist) -> None:
    pid, local = jax.process_index(), int(os.environ.get("LOCAL_DEVICES", 2))
    assert dist.initialized and dist.process_index == pid and jax.process_count() == 2, dist
    assert jax.device_count() == 2 * local and jax.local_device_count() == local, jax.devices()
    note(f"joined: {jax.devices()}")
    learner = Learner(MODEL, LEARNER, make_mesh(jax.device_count(), 1))
    learner.steps_compiled = False
    ckpt = LearnerCheckpointer(out / "ckpt", max_to_keep=None)
    job = config.build(
        LearnerJobConfig, requests_topic="t", records_subscription="s", policy_root=str(out), env="guess"
    )
    start = B.restore_or_initialise(learner, ckpt, job)  # no warm start: the checkpoint, or the initial params
    note(f"learner built, {start}")
    publisher = PolicyPublisher(RecordingStore(str(out / "store")), learner, ckpt, version=start.version)
    barrier("built")
    publisher.publish_start(start.resumed)  # is_primary defaults to process 0's
    note(f"published {publisher.published}")
    if phase == "first":
        assert not start.resumed
        metrics = train_step(learner, batch_records(1)[pid : pid + 1])
        note("step 1")
        dump(out, "step1", learner, metrics)
        publisher.checkpoint(feeder_position=1, consumed_ids={"rec-10": 0, "rec-11": 0})
        ckpt.wait_until_finished()
        note("checkpointed step 1")
        dump(out, "step2", learner, train_step(learner, batch_records(2)[pid : pid + 1]))
        note("step 2")
        (out / f"ready-p{pid}").touch()
        while True:  # until killed: process 1 is SIGKILLed somewhere in here
            train_step(learner, batch_records(3)[pid : pid + 1])
    assert start.resumed_from_step == 1 and learner.steps == 1, start
    assert (start.version, start.feeder_position, start.consumed_ids) == (0, 1, {"rec-10": 0, "rec-11": 0})
    dump(out, "restored", learner, {})
    metrics = train_step(learner, batch_records(2)[pid : pid + 1])
    dump(out, "resumed2", learner, metrics)
    note("step 2")
    publisher.publish()
    publisher.checkpoint(feeder_position=2, consumed_ids={})
    tel = B.make_telemetry(str(out / f"logs-p{pid}"), trace.make_tracer(None, "learner"), RunStats())
    tel.writer.write(learner.steps, metrics)
    tel.close()
    ckpt.close()
    note("published v1, checkpointed step 2")
    (out / f"done-p{pid}").touch()


if __name__ == "__main__":
    # Never outlive the test, whatever happens (a peer dies inside a collective, say): every
    # thread's stack to the log, then exit.
    faulthandler.dump_traceback_later(float(os.environ.get("WORKER_LIMIT_S", 300)), exit=True)
    # As trainer.task does: join the cluster the Vertex environment describes, before any
    # JAX work (it raises if the backend has already started).
    main(sys.argv[1], Path(sys.argv[2]), maybe_initialize_distributed(read_vertex_env()))
