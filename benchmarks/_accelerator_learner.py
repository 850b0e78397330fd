"""The learner half of benchmarks/accelerator.py: the project's own Learner on random weights
of a real config's shape, one batch shape at a time.

A row: the layout the memory search chose, compile seconds (every layout it compiled),
the step's median time after a warm-up step, trained tokens/s, model FLOPs
(core/policy/model/flops.py: 6 N a token plus causal attention within segments) per second as
MFU against the vendor's peak and against the matmul peak measured in the same run, and
the step's memory: XLA's analysis (params, optimizer state, batch, plus what it needs
while it runs) and the device's own peak.
"""

from __future__ import annotations

import dataclasses
import gc
import time

import jax
import jax.numpy as jnp
import numpy as np
from _real_model_learner import batch as random_batch
from _real_model_learner import packed_record

from core.policy.formats.hf_presets import preset_config
from core.policy.model.lora import LoraConfig
from core.policy.model.transformer import init_model
from trainer.learning.step.gradients import ComputeConfig, cast_floats
from trainer.learning.step.learner import Learner, LearnerConfig
from trainer.learning.step.memory import StepDoesNotFit


@dataclasses.dataclass(frozen=True)
class LearnerCase:
    model: str  # a core/policy/formats/hf_presets.py name, or "tiny" (ModelConfig's defaults at vocab 300)
    rows: int
    seq_len: int
    segments: int = 1  # trajectories per row: span = seq_len // segments
    lora_rank: int = 0
    dtype: str = "auto"
    attention: str = "auto"
    remat: str = "auto"
    micro_batches: int = 0
    logit_chunk: int = 0
    note: str = ""

    @property
    def label(self) -> str:
        seg = f", {self.segments} segments" if self.segments > 1 else ""
        lora = f", LoRA {self.lora_rank}" if self.lora_rank else ""
        return f"{self.model} {self.rows} x {self.seq_len}{seg}{lora}"


def model_config(name: str):
    if name == "tiny":
        from core.policy.model.config import ModelConfig

        return ModelConfig(vocab_size=300, max_seq_len=2048)
    return preset_config(name)


def record(case: LearnerCase, vocab: int):
    return packed_record(random_batch(case.rows, case.seq_len, case.segments, vocab))


def _device_peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def run(case: LearnerCase, steps: int, vendor_peak: float, measured_peak: float | None) -> dict:
    """One case's row (or its refusal: the project's StepDoesNotFit with its numbers)."""
    cfg = model_config(case.model)
    compute = ComputeConfig(
        remat=case.remat,
        micro_batches=case.micro_batches,
        logit_chunk=case.logit_chunk,
        dtype=case.dtype,
        attention=case.attention,
    )
    lcfg = LearnerConfig(batch_records=1, learning_rate=1e-5, compute=compute, lora=LoraConfig(rank=case.lora_rank))
    out = {"case": dataclasses.asdict(case), "label": case.label}
    t0 = time.perf_counter()
    model = init_model(cfg, 0)
    if case.lora_rank:  # the frozen base is only read in the compute dtype: never hold it in f32
        from flax import nnx

        graphdef, state = nnx.split(model)
        del model
        state = cast_floats(state, compute.numerics().dtype)
        model = nnx.merge(graphdef, state)
        del state
    span = case.seq_len // case.segments if case.segments > 1 else None
    learner = Learner(cfg, lcfg, model=model, span=span)
    del model
    out["init_s"] = time.perf_counter() - t0
    rec = record(case, cfg.vocab_size)
    try:
        learner.compile_for(case.rows, case.seq_len)
    except StepDoesNotFit as e:
        out["refused"] = str(e)
        return out
    shape = (case.rows, case.seq_len)
    lay, mem, tries = learner.layouts[shape], learner.memory[shape], learner.layout_tries[shape]
    t0 = time.perf_counter()
    learner.train_step([rec])
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        metrics = learner.train_step([rec])  # returns host floats: the step is done
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    tokens = int((rec.segment_ids > 0).sum())
    flops = learner.step_flops([rec])
    num = learner.numerics
    out.update(
        layout=str(lay),
        remat=lay.remat,
        micro_batches=lay.micro_batches,
        dtype=str(num.dtype),
        attention=num.attention,
        logit_chunk=num.logit_chunk,
        compile_s=learner.compile_s[shape],
        compiles=sum(found is not None for _, found in tries),
        layouts_tried=[f"{lay}: {'skipped' if f is None else round(f.extra_bytes / 1e9, 2)}" for lay, f in tries],
        first_step_s=first,
        step_s=step_s,
        step_s_all=times,
        tokens=tokens,
        tokens_per_s=tokens / step_s,
        model_flops=flops,
        mfu=flops / step_s / vendor_peak,
        mfu_measured_peak=flops / step_s / measured_peak if measured_peak else None,
        xla_resident_gb=mem.resident_bytes / 1e9,
        xla_extra_gb=mem.extra_bytes / 1e9,
        device_peak_gb=(_device_peak_bytes() or 0) / 1e9 or None,
        loss=metrics["losses/total_loss"],
        grad_norm=metrics["losses/grad_norm"],
    )
    del learner
    gc.collect()
    jax.clear_caches()
    return out


def matmul_peak(n: int, repeats: int = 10, dtype=jnp.bfloat16) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (mean of `repeats` after a warm-up)."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = f(a)
    out.block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - t0)


def hbm_bandwidth(mb: int, repeats: int = 10) -> float:
    """Bytes/s of a reduction that reads `mb` MB once per call (what a decode step is bound by)."""
    x = jnp.ones((mb * 2**20 // 2,), jnp.bfloat16)
    f = jax.jit(lambda x: jnp.sum(x.astype(jnp.float32)))
    f(x).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = f(x)
    out.block_until_ready()
    return x.nbytes * repeats / (time.perf_counter() - t0)


def profile(case: LearnerCase, steps: int = 3, top: int = 25) -> dict:
    """Where a step's device time goes: `steps` steps under jax.profiler, the device's
    XLA ops summed by name (ms a step, share), the largest first."""
    import collections
    import glob
    import tempfile

    cfg = model_config(case.model)
    compute = ComputeConfig(remat=case.remat, micro_batches=case.micro_batches, dtype=case.dtype,
                            attention=case.attention, logit_chunk=case.logit_chunk)  # fmt: skip
    span = case.seq_len // case.segments if case.segments > 1 else None
    learner = Learner(cfg, LearnerConfig(batch_records=1, compute=compute), model=init_model(cfg, 0), span=span)
    rec = record(case, cfg.vocab_size)
    learner.train_step([rec])
    where = tempfile.mkdtemp()
    with jax.profiler.trace(where):
        for _ in range(steps):
            learner.train_step([rec])
    files = glob.glob(f"{where}/**/*.xplane.pb", recursive=True)
    data = jax.profiler.ProfileData.from_file(files[0])
    totals, counts = collections.Counter(), collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if "Ops" not in line.name:
                continue
            for ev in line.events:
                totals[ev.name] += ev.duration_ns
                counts[ev.name] += 1
    whole = sum(totals.values()) or 1
    rows = [
        {"op": name, "ms_per_step": ns / steps / 1e6, "share": ns / whole, "count_per_step": counts[name] / steps}
        for name, ns in totals.most_common(top)
    ]
    lines = sorted({line.name for plane in data.planes if plane.name.startswith("/device:") for line in plane.lines})
    out = {"label": case.label, "layout": str(learner.layouts[(case.rows, case.seq_len)]), "device_lines": lines}
    out.update(device_ms_per_step=whole / steps / 1e6, top=rows)
    del learner
    gc.collect()
    jax.clear_caches()
    return out
