"""Each token's log-prob (and the policy's entropy there) from hidden states, a chunk of
tokens at a time: never a [tokens, vocab] tensor for the whole batch.

At a real vocabulary the projection dominates a step's memory: 4 rows of 1,152 tokens at
49,152 words are 906 MB of float32 logits per copy, and log-softmax, its gradient and the
entropy each want one. Here the batch's hidden states are cut into chunks of `chunk`
tokens; each chunk is projected, reduced to its log-probs and entropies, and dropped, under
jax.checkpoint, so the backward pass recomputes a chunk's logits instead of keeping them.
Peak: one chunk's logits (chunk x vocab floats). The result equals the plain
log_softmax(logits)[token] (tests/test_logprobs.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

DEFAULT_CHUNK = 512  # tokens per chunk: 512 x 49,152 float32 logits are 100 MB


def token_logprobs_and_entropy(head, hidden: jax.Array, tokens: jax.Array, chunk: int = DEFAULT_CHUNK):
    """hidden [B, T, d] (final-normed), tokens int [B, T], head: [..., d] -> [..., vocab]
    float32 logits. Returns (logp, entropy), both [B, T]: logp[:, t] is the log-prob of
    tokens[:, t] given the prefix (read from position t - 1; 0 at t = 0), entropy[:, t]
    that distribution's entropy (0 at t = 0), as core.policy.model.transformer.token_logprobs."""
    b, t, d = hidden.shape
    n = b * (t - 1)  # every position but a row's last predicts the next token
    h = hidden[:, :-1].reshape(n, d)
    nxt = tokens[:, 1:].reshape(n)
    # The fewest chunks of at most `chunk` tokens, evened out so the last is not mostly
    # padding (4,604 tokens in chunks of 2,048 would pad to 6,144; in three of 1,535, to 4,605).
    pieces = -(-n // max(1, chunk))
    chunk = -(-n // pieces)
    pad = -n % chunk
    h = jnp.pad(h, ((0, pad), (0, 0))).reshape(-1, chunk, d)
    nxt = jnp.pad(nxt, (0, pad)).reshape(-1, chunk)

    @jax.checkpoint
    def one(args):
        hc, tc = args
        logits = head(hc)  # [chunk, vocab] float32
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tc[:, None], axis=-1)[:, 0] - lse
        probs = jnp.exp(logits - lse[:, None])
        ent = lse - jnp.sum(probs * logits, axis=-1)
        return picked, ent

    logp, ent = jax.lax.map(one, (h, nxt))
    shape = lambda x: jnp.pad(x.reshape(-1)[:n].reshape(b, t - 1), ((0, 0), (1, 0)))
    return shape(logp), jax.lax.stop_gradient(shape(ent))
