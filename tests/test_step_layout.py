"""A step's layout (remat, micro-batches) is chosen by memory, not by model size: the
fastest layout XLA's memory analysis says fits in what is free (or in --step_memory_gb),
remat off before on and fewer micro-batches before more; XLA's own out-of-memory refusal
at compile counts as "does not fit", and when nothing fits the refusal names each layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from core.policy.model.config import ModelConfig
from core.policy.model.flops import count_params
from core.policy.model.lora import LoraConfig
from trainer.learning.step import layout, memory
from trainer.learning.step.gradients import ComputeConfig, Layout
from trainer.learning.step.learner import Learner, LearnerConfig

# Long rows and several layers, so that keeping every activation costs visibly more than
# keeping each layer's input. One row: the layouts are remat off, then on.
CFG = ModelConfig(n_layers=4, max_seq_len=256, vocab_size=300)
ROWS, T = 1, 256


def _just_fits(extra: int) -> int:
    """A free-memory figure in which `extra` bytes just fit (the check keeps headroom)."""
    return int((extra + memory.HEADROOM_BYTES) / memory.HEADROOM_FRACTION) + 1


def _learner(monkeypatch, free: int, compute: ComputeConfig | None = None) -> Learner:
    monkeypatch.setattr(memory, "free_bytes", lambda device=None: free)
    learner = Learner(CFG, LearnerConfig(batch_records=1, compute=compute or ComputeConfig()))
    learner.compile_for(ROWS, T)
    return learner


def test_a_fake_free_memory_figure_picks_remat_off_when_it_fits_and_on_when_it_does_not(monkeypatch):
    roomy = _learner(monkeypatch, 10**12)
    assert roomy.layouts[(ROWS, T)] == Layout(False, 1)  # room for everything: the fastest
    off = roomy.memory[(ROWS, T)].extra_bytes
    on = _learner(monkeypatch, 10**12, ComputeConfig(remat="on")).memory[(ROWS, T)].extra_bytes
    assert on < off * 0.8, (on, off)  # what the choices below rest on
    assert _learner(monkeypatch, _just_fits(off)).layouts[(ROWS, T)] == Layout(False, 1)
    assert _learner(monkeypatch, _just_fits(off) - 1).layouts[(ROWS, T)] == Layout(True, 1)
    # A budget below what is free binds the same way.
    budget = ComputeConfig(memory_gb=(off - 1) / memory.GB)
    assert _learner(monkeypatch, 10**12, budget).layouts[(ROWS, T)] == Layout(True, 1)


def test_fewer_micro_batches_come_before_remat(monkeypatch):
    """The search's order and skips with stated needs per layout (XLA's analysis faked):
    2 micro-batches without remat fit, so remat is never compiled."""
    needs = {Layout(False, 1): 10, Layout(False, 2): 6, Layout(False, 4): 3, Layout(True, 1): 2}
    compiled = []
    monkeypatch.setattr(memory, "measure", lambda lay, free: memory.StepMemory(0, needs[lay] * 2**30, free))

    def compile_layout(lay):
        compiled.append(lay)
        return lay

    free = _just_fits(7 * 2**30)
    assert layout.choose(compile_layout, ComputeConfig(), 4, "the step", "hint", free, "tpu")[1] == Layout(False, 2)
    assert compiled == [Layout(False, 1), Layout(False, 2)]


def _small_step():
    return jax.jit(lambda x: x * 2).lower(jnp.ones(8)).compile()


def test_xlas_out_of_memory_at_compile_counts_as_not_fitting():
    """On an accelerator XLA refuses a program bigger than its memory at compile
    (RESOURCE_EXHAUSTED); the search takes the next layout, and the numbers XLA gave are kept."""
    oom = "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
    oom += "Used 21.49G of 15.48G hbm."

    def compile_layout(lay):
        if not lay.remat:
            raise jax.errors.JaxRuntimeError(oom)
        return _small_step()

    free = 16 * 2**30
    _, chosen, found, tried = layout.choose(compile_layout, ComputeConfig(), 1, "the step", "hint", free)
    assert chosen == Layout(True, 1) and found.fits()
    assert tried[0][0] == Layout(False, 1) and tried[0][1].extra_bytes == int(21.49 * 2**30)

    def always(lay):
        raise jax.errors.JaxRuntimeError(oom)

    with pytest.raises(memory.StepDoesNotFit) as refused:
        layout.choose(always, ComputeConfig(), 2, "the learner step at 2x1024", "lower the rows", free, "tpu")
    text = str(refused.value)
    assert text.startswith("the learner step at 2x1024 fits in no layout (17.2 GB are free): ") and text.endswith(
        "lower the rows"
    ), text
    for lay in ComputeConfig().layouts(2, "tpu"):
        assert f"{lay}: 23.1 GB (23.1 GB while it runs)" in text, text


def test_other_compile_errors_are_not_taken_for_memory():
    def broken(lay):
        raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: something else")

    with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT"):
        layout.choose(broken, ComputeConfig(), 1, "the step", "hint", 2**34)


def test_a_layout_that_cannot_fit_is_skipped_without_compiling():
    """m micro-batches need at least E(1) / m: a count whose floor is over the limit is
    never compiled."""
    compiled = []

    def compile_layout(lay):
        compiled.append(lay)
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Used 40.0G of 16.0G hbm")

    with pytest.raises(memory.StepDoesNotFit, match="skipped"):
        layout.choose(compile_layout, ComputeConfig(remat="off"), 4, "the step", "hint", 16 * 2**30, "tpu")
    assert compiled == [Layout(False, 1), Layout(False, 4)]  # 2 micro-batches need >= 20 GB: not tried


def test_an_optimizer_state_that_cannot_fit_is_refused_before_it_is_made(monkeypatch):
    """A full fine-tune whose Adam moments do not fit beside its params is refused with the
    numbers, before any step (Qwen2.5-1.5B on a 16 GB chip: 6.2 GB of params, 12.3 GB of moments)."""
    tiny = ModelConfig(vocab_size=300)
    params = 4 * count_params(tiny)  # f32 bytes; Adam's moments need twice that
    monkeypatch.setattr(memory, "free_bytes", lambda device=None: int((memory.HEADROOM_BYTES + params) / 0.9))
    with pytest.raises(memory.StepDoesNotFit, match=r"the learner's state needs .* GB are free: train a LoRA"):
        Learner(tiny, LearnerConfig(batch_records=1))
    assert Learner(tiny, LearnerConfig(batch_records=1, lora=LoraConfig(rank=2))).params  # an adapter's fit
