"""The engine's token draw (core/policy/sampling/draw.py): the softmax's distribution, its exact
log-probs, never a zero-probability token, and greedy equal to argmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy.sampling import draw


def test_samples_follow_the_softmax_across_blocks_and_padding():
    """A vocabulary of 2,500 (three blocks, the last padded): the empirical frequencies of
    a few hot tokens in every block match their probabilities."""
    vocab, n = 2500, 4000
    logits = np.full(vocab, -4.0, np.float32)
    hot = [3, 1020, 1023, 1024, 2048, 2499]
    logits[hot] = [2.0, 1.0, 1.5, 0.5, 2.5, 1.0]
    probs = np.asarray(jax.nn.softmax(jnp.asarray(logits)))
    batch = jnp.asarray(np.tile(logits, (n, 1)))
    tokens, logp = jax.jit(draw.sample)(batch, jax.random.key(0))
    tokens = np.asarray(tokens)
    for t in hot:
        freq = np.mean(tokens == t)
        assert abs(freq - probs[t]) < 4 * np.sqrt(probs[t] * (1 - probs[t]) / n) + 1e-3, (t, freq, probs[t])
    np.testing.assert_allclose(logp, np.log(probs[tokens]), rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**30), vocab=st.sampled_from([7, 1024, 1500, 3000]), zeros=st.floats(0.0, 0.95))
def test_a_zero_probability_token_is_never_drawn(seed, vocab, zeros):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(16, vocab)).astype(np.float32) * 5
    logits[rng.random((16, vocab)) < zeros] = -np.inf
    logits[:, rng.integers(vocab)] = 0.0  # every row has some mass
    tokens, logp = draw.sample(jnp.asarray(logits), jax.random.key(seed))
    tokens = np.asarray(tokens)
    assert np.all(np.isfinite(logits[np.arange(16), tokens]))
    want = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), -1))[np.arange(16), tokens]
    np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", [5, 1024, 3001])
def test_greedy_is_the_first_maximum_with_its_log_prob(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(8, vocab)).astype(np.float32)
    logits[0, [1, vocab - 1]] = 50.0  # a tie: the first wins, as jnp.argmax
    tokens, logp = draw.greedy(jnp.asarray(logits))
    np.testing.assert_array_equal(tokens, np.argmax(logits, -1))
    want = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), -1))[np.arange(8), np.argmax(logits, -1)]
    np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-5)
