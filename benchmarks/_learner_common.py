"""Data, timing and step-call helpers shared by the learner benchmark sections."""

from __future__ import annotations

import contextlib
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests"))  # _learner_data.random_record
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- output
def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


# ----------------------------------------------------------------------------- data
def make_records(first_seed: int, n: int, rows: int, seq_len: int):
    from _learner_data import random_record

    from core.policy.model.config import ModelConfig

    vocab = ModelConfig().vocab_size
    return [random_record(first_seed + i, rows=rows, seq_len=seq_len, vocab=vocab) for i in range(n)]


def publish_records(emu, topic: str, records) -> tuple[float, int]:
    """Publish encoded records with their attributes; returns (seconds, bytes)."""
    from core.contracts import pubsub_io
    from core.contracts.records import attributes, encode

    payloads = [(encode(r), attributes(r)) for r in records]
    t0 = time.perf_counter()
    futures = [pubsub_io.publish(emu.publisher(), topic, data, **attrs) for data, attrs in payloads]
    for f in futures:
        f.result(timeout=60)
    return time.perf_counter() - t0, sum(len(d) for d, _ in payloads)


class PhaseTimer:
    """Wraps core.contracts.pubsub_io.pull / ack and trainer.learning.data.consumer.decode with timers (the
    consumer looks them up at call time, so the real poll runs with the wrappers)."""

    def __init__(self):
        self.s = {"pull": 0.0, "decode": 0.0, "ack": 0.0}
        self.pulls = self.empty_pulls = self.messages = 0

    @contextlib.contextmanager
    def installed(self):
        from core.contracts import pubsub_io
        from trainer.learning.data import consumer

        orig = pubsub_io.pull, pubsub_io.ack, consumer.decode

        def pull(*a, **k):
            t0 = time.perf_counter()
            out = orig[0](*a, **k)
            self.s["pull"] += time.perf_counter() - t0
            self.pulls += 1
            self.empty_pulls += not out
            self.messages += len(out)
            return out

        def ack(*a, **k):
            t0 = time.perf_counter()
            try:
                return orig[1](*a, **k)
            finally:
                self.s["ack"] += time.perf_counter() - t0

        def decode(*a, **k):
            t0 = time.perf_counter()
            try:
                return orig[2](*a, **k)
            finally:
                self.s["decode"] += time.perf_counter() - t0

        pubsub_io.pull, pubsub_io.ack, consumer.decode = pull, ack, decode
        try:
            yield self
        finally:
            pubsub_io.pull, pubsub_io.ack, consumer.decode = orig


class StepCall:
    """The learner's compiled step for one batch shape (Learner._executable: the layout it
    chose), run on one real train_step first, and called as train_step calls it:
    (params, opt_state, ref_params, batch, frozen)."""

    def __init__(self, learner, records):
        from trainer.learning.step.learner import batch_from_records

        learner.train_step(records)  # compiles the shape and chooses its layout
        self.compiled = learner._executable(batch_from_records(records))

    def flops(self, learner) -> float:
        """XLA's FLOPs for one compiled step (cost analysis of the compiled call)."""
        cost = self.compiled.cost_analysis()
        if isinstance(cost, (list, tuple)):
            cost = cost[0]
        return float(cost.get("flops", 0.0)) if cost else 0.0

    def call_with(self, learner, device_batch):
        """One compiled step on a device-resident batch, state threaded as train_step does."""
        learner.params, learner.opt_state, metrics = self.compiled(
            learner.params, learner.opt_state, learner._reference(), device_batch, learner.frozen
        )
        return metrics
