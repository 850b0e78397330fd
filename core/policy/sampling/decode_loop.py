"""Several decode steps per device call: a `lax.while_loop` over up to K one-token steps.

One call per token costs a host round trip per token (dispatch, a sync on the sampled
ids, Python over the slots), which on an accelerator is most of a step. Here every slot
with a budget feeds its last token, samples the next (core/policy/sampling/draw.py, the key split
exactly as K successive one-token calls split it), feeds that one back, and so on, all on
the device; [S, K] ids and log-probs come back in one transfer.

The loop ends after K steps, or as soon as any slot ends its turn: its budget is spent
(the turn's new tokens, the sequence's room) or its generated tokens end with one of a
few stop sequences (`stop_table`). The host can then hand its slot out or start its tool
call. The device's stop check is a shortcut only: the host re-checks every token with the
format's own `stop()` and drops what a slot sampled past it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core.policy.sampling import draw

# The stop sequences' fixed shape (one compiled variant): at most STOP_ROWS sequences of
# at most STOP_LEN ids. A longer sequence keeps its last STOP_LEN ids (the device may then
# stop early, which the host corrects); ones beyond STOP_ROWS are not checked on the device
# (a slot then runs on to the loop's end, and the host drops the surplus).
STOP_ROWS = 8
STOP_LEN = 16
SMALLEST_WINDOW = 128


def windows(length: int, smallest: int = SMALLEST_WINDOW) -> tuple[int, ...]:
    """The cache lengths a decode call may read: powers of two from `smallest`, then
    `length` itself; one compiled variant each."""
    out, w = [], smallest
    while w < length:
        out.append(w)
        w *= 2
    return (*out, length)


def window_for(buckets: tuple[int, ...], end: int) -> int:
    """The smallest bucket covering cache positions [0, end)."""
    return next((w for w in buckets if w >= end), buckets[-1])


@functools.lru_cache(maxsize=16)
def stop_table(sequences: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    """(ids [STOP_ROWS, STOP_LEN] int32, right-aligned, -1 before each sequence; lengths
    [STOP_ROWS], 0 for an unused row)."""
    ids, lens = np.full((STOP_ROWS, STOP_LEN), -1, np.int32), np.zeros(STOP_ROWS, np.int32)
    for i, seq in enumerate(s[-STOP_LEN:] for s in sequences[:STOP_ROWS] if len(s)):
        ids[i, STOP_LEN - len(seq) :] = seq
        lens[i] = len(seq)
    return ids, lens


def ends_with_stop(recent, ids, lens):
    """recent [S, L] (the last L generated ids, -1 before the turn) -> [S] bool: whether
    they end with one of the table's sequences."""
    need = jnp.arange(STOP_LEN)[None, :] >= (STOP_LEN - lens)[:, None]  # [M, L]: the ids each row checks
    same = (recent[:, None, :] == ids[None]) | ~need[None]  # [S, M, L]
    return jnp.any(jnp.all(same, axis=-1) & (lens > 0)[None], axis=-1)


def pick(logits, key, temperature: float):
    """The next token and its log-prob under the model (temperature 1): drawn at
    `temperature`, the argmax at 0. Only 1 draws what the learner's ratios assume; other
    temperatures are evaluation's (a sweep of v0), their log-probs never trained on."""
    if isinstance(temperature, bool) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if temperature == 0:
        return draw.greedy(logits)
    if temperature == 1:
        return draw.sample(logits, key)
    token, _ = draw.sample(logits.astype(jnp.float32) / temperature, key)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return token, jnp.take_along_axis(logp, token[:, None], axis=1)[:, 0]


def run(
    graphdef, treedef, temperature, steps, read_len, leaves, cache, tokens, start, budget, use_stops, recent, stops, key
):
    """The loop, traced under jit (static: graphdef, treedef, temperature, steps, read_len).

    tokens [S]: each slot's last token, fed at start[S]; budget [S]: tokens it may sample
    (0: not decoding; its junk writes stay at `start`, past its content); use_stops [S]:
    whether its turn ends on `stops` ((ids, lens) of `stop_table`); recent [S, STOP_LEN]:
    its turn's last generated ids. Returns (ids [S, steps], log-probs [S, steps], n [S]
    sampled per slot, cache, the key after as many splits as steps run)."""
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    budget = jnp.minimum(budget, cache[0][0].shape[2] - start)  # never past the cache's end
    active = budget > 0
    s = tokens.shape[0]
    stop_ids, stop_lens = stops
    zero = jnp.zeros(s, jnp.int32)

    def body(carry):
        i, _, tok, cache, recent, key, out, out_logp = carry
        key, sub = jax.random.split(key)
        logits, cache = model.decode(tok[:, None], jnp.where(active, start + i, start), cache, zero, read_len)
        nxt, logp = pick(logits, sub, temperature)
        out, out_logp = out.at[:, i].set(nxt), out_logp.at[:, i].set(logp)
        recent = jnp.where(active[:, None], jnp.concatenate([recent[:, 1:], nxt[:, None]], axis=1), recent)
        ended = (i + 1 >= budget) | (use_stops & ends_with_stop(recent, stop_ids, stop_lens))
        return i + 1, jnp.any(active & ended), jnp.where(active, nxt, tok), cache, recent, key, out, out_logp

    init = (
        jnp.int32(0),
        ~jnp.any(active),
        tokens,
        cache,
        recent,
        key,
        jnp.zeros((s, steps), jnp.int32),
        jnp.zeros((s, steps), jnp.float32),
    )
    i, _, _, cache, _, key, out, out_logp = jax.lax.while_loop(lambda c: (c[0] < steps) & ~c[1], body, init)
    return out, out_logp, jnp.where(active, i, 0), cache, key
