"""A step within memory, computing what the plain step computes: log-probs in chunks equal
the plain log-softmax, a rematerialised step equals the plain one, micro-batched gradients
equal the whole batch's (every loss), and a step that cannot fit is refused before it runs."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _learner_data import random_record
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy.model.config import ModelConfig
from core.policy.model.logprobs import token_logprobs_and_entropy
from core.policy.model.transformer import init_model, token_logprobs
from localstack.launch.processes import ProcessGroup
from trainer.learning.step import losses, memory
from trainer.learning.step.gradients import ComputeConfig, Layout, Numerics
from trainer.learning.step.learner import Learner, LearnerConfig

CFG = ModelConfig(max_seq_len=64, vocab_size=300)


# Each shape compiles: a few, varied, and the same few every run (derandomized), so the
# persistent compilation cache (the Makefile's) serves them after the first run.
@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    rows=st.integers(1, 3),
    t=st.integers(2, 40),
    chunk=st.integers(1, 64),
    seed=st.integers(0, 2**16),
    tied=st.booleans(),
)
def test_chunked_log_probs_and_entropy_equal_the_plain_log_softmax(rows, t, chunk, seed, tied):
    rng = np.random.default_rng(seed)
    vocab, d = 37, 8
    w = jnp.asarray(rng.normal(size=(d, vocab)) * 3, jnp.float32)
    hidden = jnp.asarray(rng.normal(size=(rows, t, d)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, (rows, t)), jnp.int32)
    logp, ent, plain_logp, plain_ent = _chunked_and_plain(w, hidden, tokens, chunk, tied)
    np.testing.assert_allclose(logp, plain_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent[:, 1:], plain_ent, rtol=1e-4, atol=1e-4)  # a metric, not a gradient
    assert np.all(np.asarray(logp[:, 0]) == 0) and np.all(np.asarray(ent[:, 0]) == 0)


@functools.partial(jax.jit, static_argnums=(3, 4))  # one compile per example, not one per op
def _chunked_and_plain(w, hidden, tokens, chunk, tied):
    head = (lambda h: h @ w) if tied else (lambda h: (h @ w).astype(jnp.float32))
    logp, ent = token_logprobs_and_entropy(head, hidden, tokens, chunk)
    logits = head(hidden)
    plain = jax.nn.log_softmax(logits[:, :-1], -1)
    return logp, ent, token_logprobs(logits, tokens), -jnp.sum(jnp.exp(plain) * plain, -1)


def test_chunked_log_prob_gradients_equal_the_plain_ones():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(8, 37)), jnp.float32)
    hidden = jnp.asarray(rng.normal(size=(2, 20, 8)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 37, (2, 20)), jnp.int32)
    chunked = jax.grad(lambda w, h: token_logprobs_and_entropy(lambda x: x @ w, h, tokens, 7)[0].sum(), (0, 1))
    plain = jax.grad(lambda w, h: token_logprobs(h @ w, tokens).sum(), (0, 1))
    for a, b in zip(chunked(w, hidden), plain(w, hidden)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _grads(compute: ComputeConfig, loss: losses.LossConfig | None = None, records=None):
    loss = loss or losses.LossConfig()
    lcfg = LearnerConfig(batch_records=2, compute=compute, loss=loss)
    learner = Learner(CFG, lcfg, model=init_model(CFG, 0))
    if loss.kl_coef:
        learner.set_reference(jax.tree.map(lambda x: x * 0.9, learner.params))
    (value, metrics), grads = learner.loss_and_grads(
        records or [random_record(1, vocab=300), random_record(2, vocab=300)]
    )
    return float(value), {k: float(v) for k, v in metrics.items()}, nnx.to_pure_dict(grads)


def _assert_same(a, b, rtol=1e-4, atol=1e-6):
    (la, ma, ga), (lb, mb, gb) = a, b
    np.testing.assert_allclose(la, lb, rtol=rtol, atol=atol)
    assert ma.keys() == mb.keys()
    for k in ma:
        np.testing.assert_allclose(ma[k], mb[k], rtol=rtol, atol=atol, err_msg=k)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def test_a_rematerialised_step_equals_the_plain_step():
    plain = _grads(ComputeConfig(remat="off", micro_batches=1))
    assert plain[0] != 0 and any(np.abs(g).max() > 0 for g in jax.tree.leaves(plain[2]))
    _assert_same(_grads(ComputeConfig(remat="on", micro_batches=1)), plain)


@pytest.mark.parametrize(
    "loss",
    [
        losses.LossConfig(),
        losses.LossConfig(aggregation="seq-mean-token-mean", kl_coef=0.1),
        losses.LossConfig(aggregation="seq-mean-token-sum", algorithm="gspo_token", norm_len=32.0),
        losses.LossConfig(algorithm="decoupled_ppo", tis_cap=2.0),
    ],
    ids=["ppo-token-mean", "seq-mean-kl", "gspo-seq-sum", "decoupled-tis"],
)
@pytest.mark.parametrize("micro", [2, 8])  # the fewest and the most: 4 takes no path they do not
def test_micro_batched_gradients_equal_the_whole_batchs(loss, micro):
    _assert_same(_grads(ComputeConfig(remat="on", micro_batches=micro), loss), _whole_batch_grads(loss))


@functools.cache  # one per loss and worker: each micro-batch count compares with the same step
def _whole_batch_grads(loss: losses.LossConfig):
    return _grads(ComputeConfig(remat="off", micro_batches=1), loss)


def test_layouts_are_tried_fastest_first_and_a_fixed_count_must_divide_the_rows():
    off = [Layout(False, m) for m in (1, 2, 4)]
    on = [Layout(True, m) for m in (1, 2, 4)]
    # On an accelerator: remat off before on, fewer micro-batches first.
    assert ComputeConfig().layouts(4, "tpu") == off + on
    assert ComputeConfig(remat="on").layouts(4, "tpu") == on and ComputeConfig(remat="off").layouts(4, "tpu") == off
    assert ComputeConfig(micro_batches=2).layouts(4, "tpu") == [Layout(False, 2), Layout(True, 2)]
    assert ComputeConfig().layouts(3, "gpu") == [Layout(False, 1), Layout(False, 3), Layout(True, 1), Layout(True, 3)]
    # On a CPU one row a micro-batch (a smaller working set runs faster there), unless fixed.
    assert ComputeConfig().layouts(4, "cpu") == [Layout(False, 4), Layout(True, 4)]
    assert ComputeConfig(micro_batches=2).layouts(4, "cpu") == [Layout(False, 2), Layout(True, 2)]
    with pytest.raises(ValueError, match="must divide the step's 8 rows"):
        ComputeConfig(micro_batches=3).layouts(8)
    with pytest.raises(ValueError, match="remat"):
        ComputeConfig(remat="sometimes")


def test_a_step_that_cannot_fit_is_refused_before_it_runs_with_the_numbers(monkeypatch):
    learner = Learner(CFG, LearnerConfig(batch_records=2))
    before = jax.tree.map(np.array, learner.params)
    monkeypatch.setattr(memory, "free_bytes", lambda device=None: 1_000_000)
    with pytest.raises(memory.StepDoesNotFit) as refused:
        learner.train_step([random_record(1, vocab=300), random_record(2, vocab=300)])
    text = str(refused.value)
    assert "the learner step at 8x64 fits in no layout (0.0 GB are free)" in text, text
    # Every layout is named with what it needs (on a CPU: one row a micro-batch, remat off, then on).
    assert "remat off, 8 micro-batch(es): 0.0 GB" in text and "remat on, 8 micro-batch(es): 0.0 GB" in text, text
    assert "lower the rows per step" in text
    assert learner.steps == 0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(learner.params), strict=True):
        np.testing.assert_array_equal(a, b)  # nothing ran, nothing was donated
    monkeypatch.setattr(memory, "free_bytes", lambda device=None: 64 * 10**9)
    assert learner.compile_for(8, 64).fits()


def test_the_memory_analysis_sees_what_the_step_needs():
    """XLA's analysis is the check's input: a bigger batch needs more, and the params,
    optimizer state and batch are counted as resident."""
    learner = Learner(CFG, LearnerConfig(batch_records=1, compute=ComputeConfig(remat="off", micro_batches=1)))
    small, big = learner.compile_for(4, 64), learner.compile_for(16, 64)
    assert big.extra_bytes > small.extra_bytes > 0
    state = sum(x.nbytes for x in jax.tree.leaves((learner.params, learner.opt_state)))
    assert small.resident_bytes >= state


def test_free_memory_is_read_from_the_host():
    free = memory.host_free_bytes()
    assert free is not None and 0 < free < 2**50


def test_a_process_killed_by_sigkill_is_reported_with_its_last_memory(tmp_path):
    """What the demo says of a child the OS's out-of-memory killer ends: not a bare -9."""
    hold = "import time; x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(60)"
    with ProcessGroup([sys.executable, "-c", hold], tmp_path / "log") as pg:
        deadline = time.monotonic() + 30
        while pg.poll() is None and pg.last_rss < 290 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(pg.pid, signal.SIGKILL)
        while pg.poll() is None:
            time.sleep(0.05)
        text = pg.exit_description()
    assert "killed by SIGKILL (-9)" in text and "out-of-memory" in text, text
    assert 0.25 <= pg.last_rss / 2**30 < 1 and "last resident memory was 0.3 GB" in text, text


def test_compute_numerics_follow_the_device_unless_set():
    auto = ComputeConfig()
    assert auto.numerics("cpu") == Numerics(jnp.dtype("float32"), "xla", 512)
    assert auto.numerics("tpu") == Numerics(jnp.dtype("bfloat16"), "splash", 2048)
    assert auto.numerics("gpu") == Numerics(jnp.dtype("bfloat16"), "xla", 2048)
    fixed = ComputeConfig(dtype="float32", attention="xla", logit_chunk=128)
    assert fixed.numerics("tpu") == Numerics(jnp.dtype("float32"), "xla", 128)
    with pytest.raises(ValueError, match="logit_chunk"):
        ComputeConfig(logit_chunk=-1)
    with pytest.raises(ValueError, match="attention"):
        ComputeConfig(attention="flash")


def test_the_learner_job_refuses_a_step_that_cannot_fit(tmp_path, monkeypatch, capsys):
    """`agentic-rl learner` exits 2 naming the numbers, before any warm start (the planner and
    the demo take the same path)."""
    from trainer import task
    from trainer.learning import builder

    # Room for the optimizer's state (under 1 MB), none for any layout of the step.
    monkeypatch.setattr(memory, "free_bytes", lambda device=None: int((memory.HEADROOM_BYTES + 3e6) / 0.9))
    monkeypatch.setattr(builder, "check_resources", lambda cfg: None)  # no Pub/Sub needed to get there
    warm = []
    monkeypatch.setattr(builder, "warm_start", lambda *a, **k: warm.append(1))
    args = ["--requests_topic=t", "--records_subscription=s", f"--policy_root={tmp_path}", "--warmstart_steps=5"]
    # main() installs a root handler on this test's captured stderr: give the old ones back.
    monkeypatch.setattr(logging.root, "handlers", list(logging.root.handlers))
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # nor its SIGTERM handler
    assert task.main(args) == 2
    err = capsys.readouterr().err  # main logs to stderr
    assert "refused: the learner step at 4x1024 fits in no layout" in err and "GB are free" in err, err[-2000:]
    assert not warm
