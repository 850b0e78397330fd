"""Fixed-shape KV-cached sampling over S slots that records behaviour log-probs.

One call feeds each slot a chunk of up to P known tokens (prompt, environment output,
or the token it sampled last) into its KV cache and samples the token that follows the
last valid one. Shapes compiled: every slot with P = 1 (`step`), or up to K such steps
fed back on the device (`decode_loop`, core/policy/sampling/decode_loop.py), and `prefill_slots`
chosen slots with P = `prefill` (`prefill_rows`) for catching up on prompts and
observations. On an accelerator a decode call reads only the filled part of the cache:
the smallest of a few static lengths (`windows`) covering it, one compiled variant each,
all compiled by `warmup`; nothing else ever recompiles. Sampling is at temperature 1 so the recorded
log-prob is exactly the learner's log-prob of the same token under the same parameters.
`greedy=True` (temperature 0) takes the argmax instead, and another `temperature` draws
at it (evaluation only: such tokens are not samples of the policy and never reach
training; each temperature compiles its own calls).

Params may be given as they come (an nnx.State) or `place`d once per policy version: its
leaves on the device, flattened once (a State's flattening costs about 0.4 ms a call at
SmolLM2's 242 leaves, a fraction of a decode step on an accelerator).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core import heap
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import abstract_model, split_params
from core.policy.sampling import decode_loop

DTYPES = ("auto", "float32", "bfloat16")
# Decode steps per device call on an accelerator (decode_steps 0, auto); a CPU runs one: its
# while loop costs about 5% more a step than the one-step call (SmolLM2, 64 slots), and a
# host round trip is small beside its step.
ACCELERATOR_DECODE_STEPS = 16


def resolve_decode_steps(steps: int) -> int:
    """decode_steps as configured; 0 (auto) is 1 on a CPU, ACCELERATOR_DECODE_STEPS otherwise."""
    if steps < 0:
        raise ValueError(f"decode_steps must be >= 0 (0: auto), got {steps}")
    return steps or (1 if jax.default_backend() == "cpu" else ACCELERATOR_DECODE_STEPS)


def serving_dtype(name: str):
    """The dtype params and KV cache are served in: `auto` is bfloat16 on an accelerator
    (decoding reads every weight per step: half the bytes) and float32 on a CPU (XLA:CPU's
    bfloat16 matmuls are slower than its float32 ones)."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}")
    if name == "auto":
        return jnp.dtype(jnp.bfloat16 if jax.default_backend() != "cpu" else jnp.float32)
    return jnp.dtype(name)


def cast_params(params, dtype):
    """params with their floating leaves in dtype, on the device (a no-op where they are)."""
    dtype = jnp.dtype(dtype)
    cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype else x
    return jax.device_put(jax.tree.map(cast, params))


@dataclasses.dataclass(frozen=True, eq=False)
class Placed:
    """Params as the jitted calls take them: leaves committed to the device, and their
    structure (a static argument: one hash a call, not a flattening)."""

    leaves: tuple
    treedef: Any


class Sampler:
    def __init__(
        self,
        cfg: ModelConfig,
        slots: int,
        length: int,
        prefill: int = 16,
        seed: int = 0,
        greedy: bool = False,
        temperature: float = 1.0,
        prefill_slots: int | None = None,
        dtype=jnp.float32,
        decode_steps: int = 0,
        smallest_window: int | None = None,
    ):
        """dtype: the KV cache's (the params' own dtype is whatever the policy source gives).
        decode_steps: K, the decode steps one engine call runs on the device (1: `step`; 0:
        auto, `resolve_decode_steps`). smallest_window: the shortest cache read (`windows`);
        default: decode_loop.SMALLEST_WINDOW on an accelerator, the whole cache on a CPU,
        where a shorter read gained nothing (SmolLM2, 64 slots, a 306-long cache: a read of
        128 ran as fast as the whole, one of 256 35% slower)."""
        if length > cfg.max_seq_len:
            raise ValueError(
                f"sampler length {length} exceeds the model's max_seq_len {cfg.max_seq_len} (lower max_tokens)"
            )
        if slots < 1 or prefill < 1:
            raise ValueError(f"need slots >= 1 and prefill >= 1, got {slots}, {prefill}")
        self.cfg, self.slots, self.length, self.prefill = cfg, slots, length, prefill
        self.temperature = 0.0 if greedy else float(temperature)
        self.decode_steps = resolve_decode_steps(decode_steps)
        # How many slots one catch-up call feeds (`prefill_rows`): only those with input pay
        # for a chunk of `prefill` tokens, not every slot.
        self.prefill_slots = min(prefill_slots or slots, slots)
        if smallest_window is None:
            smallest_window = length if jax.default_backend() == "cpu" else decode_loop.SMALLEST_WINDOW
        self.windows = decode_loop.windows(length, smallest_window)
        model = abstract_model(cfg)  # shapes only: the weights come from the policy store
        self.graphdef, self.abstract_params = split_params(model)
        self.cache = model.init_cache(slots, length, dtype)
        self._key = jax.random.key(seed)
        # Static: (treedef, temperature[, read_len | steps, read_len]). Every mode runs over
        # the one cache (`temperature` may change between calls: the evaluator scores each
        # version sampled, then greedy, and a second cache would double its memory).
        self._step = jax.jit(
            functools.partial(_chunk_step, self.graphdef), static_argnums=(0, 1, 2), donate_argnums=(4,)
        )
        self._rows_step = jax.jit(
            functools.partial(_rows_step, self.graphdef), static_argnums=(0, 1), donate_argnums=(3,)
        )
        self._loop = jax.jit(
            functools.partial(decode_loop.run, self.graphdef), static_argnums=(0, 1, 2, 3), donate_argnums=(5,)
        )
        self._copy = jax.jit(functools.partial(_copy_rows), donate_argnums=(0,))  # its own cache (count)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @greedy.setter
    def greedy(self, on: bool) -> None:
        """On: the argmax; off: temperature 1, the policy's own distribution."""
        self.temperature = 0.0 if on else 1.0

    def place(self, params) -> Placed:
        """params flattened and committed to the device; the engine does it once per version."""
        if isinstance(params, Placed):
            return params
        leaves, treedef = jax.tree.flatten(params)
        return Placed(tuple(jax.device_put(leaves)), treedef)

    def step(self, params, tokens: np.ndarray, start: np.ndarray, n_valid: np.ndarray | None = None):
        """tokens [S, P] (P is 1 or `prefill`), written at positions start[s] + 0..P-1;
        only the first n_valid[s] are real (default: all). Returns per slot a token
        sampled to follow its last valid token, and that token's log-prob. Slots with
        n_valid 0 write junk beyond their content, which later writes overwrite."""
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim == 1:
            tokens = tokens[:, None]
        n_valid = np.full(self.slots, tokens.shape[1], np.int32) if n_valid is None else np.asarray(n_valid, np.int32)
        start = np.asarray(start, np.int32)
        read_len = self._window(start, n_valid)
        return self._run_step(self.place(params), read_len, tokens, start, n_valid)

    def _run_step(self, placed: Placed, read_len, tokens, start, n_valid):
        self._key, key = jax.random.split(self._key)
        args = (placed.treedef, self.temperature, read_len, placed.leaves, self.cache)
        nxt, logp, self.cache = self._step(*args, tokens, start, n_valid, key)
        return np.asarray(nxt), np.asarray(logp)

    def decode_loop(
        self,
        params,
        tokens: np.ndarray,
        start: np.ndarray,
        budget: np.ndarray,
        steps: int | None = None,
        stop_sequences=(),
        use_stops: np.ndarray | None = None,
        recent: np.ndarray | None = None,
    ):
        """Up to `steps` (default decode_steps) decode steps in one device call.

        tokens [S]: each slot's last token, not yet cached, fed at position start[s];
        budget [S]: how many tokens the slot may sample (0: the slot is not decoding and its
        cache is left as it is, bar junk at start[s], past its content); stop_sequences:
        token-id sequences that end a turn (ChatFormat.stop_sequences; at most
        decode_loop.STOP_ROWS of at most STOP_LEN ids are checked on the device);
        use_stops [S] (default all): the slots whose turn ends on them; recent
        [S, decode_loop.STOP_LEN]: each slot's turn's last generated ids, right-aligned, -1
        before the turn (default none). The loop stops after `steps`, or once any slot has
        spent its budget or ended on a stop sequence. Returns numpy (ids [S, steps] int32,
        log-probs [S, steps] float32, n [S]: how many of each row are real; the same for
        every slot that decoded). The key is split once per step run, exactly as that many
        `step` calls split it, so both give the same tokens. To time the device-bound
        decode step: budget = steps for every slot, no stop sequences."""
        steps = self.decode_steps if steps is None else steps
        tokens, start = np.asarray(tokens, np.int32).reshape(-1), np.asarray(start, np.int32)
        budget = np.asarray(budget, np.int32)
        use_stops = np.ones(self.slots, bool) if use_stops is None else np.asarray(use_stops, bool)
        if recent is None:
            recent = np.full((self.slots, decode_loop.STOP_LEN), -1, np.int32)
        stops = decode_loop.stop_table(tuple(tuple(int(t) for t in s) for s in stop_sequences))
        read_len = self._window(start, np.minimum(budget, steps))
        return self._run_loop(self.place(params), steps, read_len, tokens, start, budget, use_stops, recent, stops)

    def _run_loop(self, placed: Placed, steps, read_len, tokens, start, budget, use_stops, recent, stops):
        static = (placed.treedef, self.temperature, steps, read_len)
        out, logp, n, self.cache, self._key = self._loop(
            *static,
            placed.leaves,
            self.cache,
            tokens,
            start,
            budget,
            use_stops,
            np.asarray(recent, np.int32),
            stops,
            self._key,
        )
        return jax.device_get((out, logp, n))

    def _window(self, start: np.ndarray, n: np.ndarray) -> int:
        """The cache length a call must read: its slots that feed anything end below it."""
        live = n > 0
        end = int((start[live] + n[live]).max()) if live.any() else 0
        return decode_loop.window_for(self.windows, end)

    def prefill_rows(self, params, rows: np.ndarray, tokens: np.ndarray, start: np.ndarray, n_valid: np.ndarray):
        """`step` for the `prefill_slots` distinct slots `rows` only: tokens [K, prefill].
        Rows with n_valid 0 (padding) write junk beyond their slot's content, as in `step`."""
        placed = self.place(params)
        self._key, key = jax.random.split(self._key)
        args = (np.asarray(rows, np.int32), np.asarray(tokens, np.int32), np.asarray(start, np.int32))
        nxt, logp, self.cache = self._rows_step(
            placed.treedef, self.temperature, placed.leaves, self.cache, *args, np.asarray(n_valid, np.int32), key
        )
        return np.asarray(nxt), np.asarray(logp)

    def copy_rows(self, pairs: list[tuple[int, int]]) -> None:
        """Each (src, dst): slot dst's cache becomes a copy of slot src's (a group's shared
        prompt, prefilled once). Up to prefill_slots pairs per call, one compiled shape; a
        short call repeats its first pair (the same write twice, whatever the order)."""
        k = self.prefill_slots
        for i in range(0, len(pairs), k):
            part = pairs[i : i + k]
            part = part + [part[0]] * (k - len(part))
            src, dst = (np.array(x, np.int32) for x in zip(*part))
            self.cache = self._copy(self.cache, src, dst)

    def warmup(self, params) -> None:
        """Compiles what the engine runs up front, so no episode pays for compilation: the
        decode call (`step`, or `decode_loop` when decode_steps > 1) at every window, the
        catch-up step and the row copy. The cache only gets junk past every slot's content."""
        placed, s = self.place(params), self.slots
        zeros = np.zeros(s, np.int32)
        for w in self.windows:
            if self.decode_steps == 1:
                self._run_step(placed, w, np.zeros((s, 1), np.int32), zeros, zeros)
            else:
                recent = np.full((s, decode_loop.STOP_LEN), -1, np.int32)
                stops = decode_loop.stop_table(())
                self._run_loop(placed, self.decode_steps, w, zeros, zeros, zeros, np.ones(s, bool), recent, stops)
        k = self.prefill_slots
        self.prefill_rows(placed, np.arange(k), np.zeros((k, self.prefill), np.int32), np.zeros(k), np.zeros(k))
        self.cache = self._copy(self.cache, np.zeros(k, np.int32), np.zeros(k, np.int32))
        heap.release()  # the compiler's working memory

    def compiled_variants(self) -> int:
        return sum(f._cache_size() for f in (self._step, self._rows_step, self._loop, self._copy))


def _chunk_step(graphdef, treedef, temperature, read_len, leaves, cache, tokens, start, n_valid, key):
    last = jnp.clip(n_valid - 1, 0, tokens.shape[1] - 1)
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    logits, cache = model.decode(tokens, start, cache, last=last, read_len=read_len)  # [S, vocab]
    nxt, logp = decode_loop.pick(logits, key, temperature)
    return nxt, logp, cache


def _copy_rows(cache, src, dst):
    """Cache rows src copied onto rows dst (padding pairs copy a row onto itself: a no-op)."""
    return tuple((k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in cache)


def _rows_step(graphdef, treedef, temperature, leaves, cache, rows, tokens, start, n_valid, key):
    """_chunk_step on the cache rows of some slots (the whole cache read): gathered,
    stepped, written back."""
    sub = tuple((k[rows], v[rows]) for k, v in cache)
    nxt, logp, sub = _chunk_step(graphdef, treedef, temperature, None, leaves, sub, tokens, start, n_valid, key)
    cache = tuple((k.at[rows].set(sk), v.at[rows].set(sv)) for (k, v), (sk, sv) in zip(cache, sub))
    return nxt, logp, cache
