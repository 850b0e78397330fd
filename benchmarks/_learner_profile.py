"""The profile section of benchmarks/learner.py: where a train step's time goes."""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests"))  # _learner_data.random_record
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _learner_common import StepCall, make_records  # noqa: E402
from _report import print_table  # noqa: E402


def forward_ms(learner, device_batches, n: int) -> float:
    """Mean ms of the jitted policy forward (logits + token log-probs) on these batches."""
    import jax
    from flax import nnx

    from core.policy.model.transformer import token_logprobs

    @jax.jit
    def fwd(params, batch):
        logits = nnx.merge(learner.graphdef, params)(batch["tokens"], batch["segment_ids"], batch["positions"])
        return token_logprobs(logits, batch["tokens"]).sum()

    jax.block_until_ready(fwd(learner.params, device_batches[0]))
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fwd(learner.params, device_batches[i % len(device_batches)]))
        times.append(time.perf_counter() - t0)
    return statistics.mean(times) * 1e3


def bench_profile(args) -> None:
    """Where one train_step's time goes inside XLA: a jax.profiler trace of --profile_steps
    steps at --batch_records, op CPU time summed over XLA's worker threads, grouped by op
    kind (the fusion name without its number) and by pass (from each op's HLO metadata:
    transpose(jvp(...)) is the backward pass; the rest is the forward and the optimizer)."""
    import collections
    import glob
    import re
    import tempfile

    import jax

    from core.policy.model.config import ModelConfig
    from trainer.learning.step.learner import Learner, LearnerConfig

    shape, b, n = (args.rows, args.seq_len), args.batch_records, args.profile_steps
    learner = Learner(ModelConfig(), LearnerConfig(batch_records=b))
    batch = make_records(600_000, b, *shape)
    call = StepCall(learner, batch)
    hlo = call.compiled.as_text()
    op_meta = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = .*?op_name=\"([^\"]*)\"", line)
        if m:
            op_meta[m.group(1)] = m.group(2)
    for _ in range(2):
        learner.train_step(batch)
    with tempfile.TemporaryDirectory(prefix="learner-prof-") as d:
        t0 = time.perf_counter()
        jax.profiler.start_trace(d)
        for _ in range(n):
            learner.train_step(batch)
        jax.profiler.stop_trace()
        wall_ms = (time.perf_counter() - t0) / n * 1e3
        files = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        if not files:
            print("profile: no trace written; skipped\n", flush=True)
            return
        data = jax.profiler.ProfileData.from_file(files[0])
        by_kind = collections.defaultdict(lambda: [0.0, 0.0])
        for plane in data.planes:
            for line in plane.lines:
                if not line.name.startswith("tf_XLAEigen"):  # XLA:CPU worker threads
                    continue
                for ev in line.events:
                    if ev.name not in op_meta:  # executor bookkeeping, waits
                        continue
                    kind = re.sub(r"\.\d+$", "", ev.name)
                    by_kind[kind]["transpose(" in op_meta[ev.name]] += ev.duration_ns / 1e6 / n
    total = sum(f + bw for f, bw in by_kind.values())
    if not total:
        print("profile: no XLA op events found in the trace; skipped\n", flush=True)
        return
    rows = [
        [k, f + bw, f, bw, (f + bw) / total]
        for k, (f, bw) in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))[: args.profile_top]
    ]
    fwd_total = sum(f for f, _ in by_kind.values())
    rows.append(["all ops", total, fwd_total, total - fwd_total, 1.0])  # all kinds, not only those listed
    print_table(
        f"2b. Inside one train_step (batch_records={b}, {shape[0]}x{shape[1]}): XLA op CPU time per step "
        f"by op kind, {n} profiled steps",
        ["op kind", "CPU ms", "forward+update ms", "backward ms", "share"],
        rows,
        note=(
            f"wall per profiled step {wall_ms:.0f} ms (profiler on); CPU ms sums XLA's worker threads. "
            "ynn_fusion = XNNPACK/YNNPACK dots and attention contractions; copy_*/bitcast_* fusions are "
            "elementwise loops that also change layout (transposes)."
        ),
    )
