"""Fixed-shape KV-cached sampling over S slots that records behaviour log-probs.

One call feeds each slot a chunk of up to P known tokens (prompt, environment output,
or the token it sampled last) into its KV cache and samples the token that follows the
last valid one. Two shapes are compiled: every slot with P = 1 (`step`, decoding), and
`prefill_slots` chosen slots with P = `prefill` (`prefill_rows`) for
catching up on prompts and observations; nothing else ever recompiles. Sampling is at
temperature 1 so the recorded log-prob is exactly the learner's log-prob of the same
token under the same parameters. `greedy=True` takes the argmax instead (evaluation
only: such tokens are not samples of the policy and never reach training).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core import heap
from core.policy import draw
from core.policy.config import ModelConfig
from core.policy.model import abstract_model, split_params


class Sampler:
    def __init__(
        self,
        cfg: ModelConfig,
        slots: int,
        length: int,
        prefill: int = 16,
        seed: int = 0,
        greedy: bool = False,
        prefill_slots: int | None = None,
        dtype=jnp.float32,
    ):
        """dtype: the KV cache's (the params' own dtype is whatever the policy source gives)."""
        if length > cfg.max_seq_len:
            raise ValueError(
                f"sampler length {length} exceeds the model's max_seq_len {cfg.max_seq_len} (lower max_tokens)"
            )
        if slots < 1 or prefill < 1:
            raise ValueError(f"need slots >= 1 and prefill >= 1, got {slots}, {prefill}")
        self.cfg, self.slots, self.length, self.prefill, self.greedy = cfg, slots, length, prefill, greedy
        # How many slots one catch-up call feeds (`prefill_rows`): only those with input pay
        # for a chunk of `prefill` tokens, not every slot.
        self.prefill_slots = min(prefill_slots or slots, slots)
        model = abstract_model(cfg)  # shapes only: the weights come from the policy store
        self.graphdef, self.abstract_params = split_params(model)
        self.cache = model.init_cache(slots, length, dtype)
        self._key = jax.random.key(seed)
        # Both modes over the one cache (`greedy` may change between calls: the evaluator
        # scores each version sampled, then greedy, and a second cache would double its memory).
        self._steps = {
            g: (
                jax.jit(functools.partial(_chunk_step, self.graphdef, g), donate_argnums=(1,)),
                jax.jit(functools.partial(_rows_step, self.graphdef, g), donate_argnums=(1,)),
            )
            for g in (False, True)
        }
        self._copy = jax.jit(functools.partial(_copy_rows), donate_argnums=(0,))  # its own cache (count)

    @property
    def _step(self):
        return self._steps[self.greedy][0]

    @property
    def _rows_step(self):
        return self._steps[self.greedy][1]

    def step(self, params, tokens: np.ndarray, start: np.ndarray, n_valid: np.ndarray | None = None):
        """tokens [S, P] (P is 1 or `prefill`), written at positions start[s] + 0..P-1;
        only the first n_valid[s] are real (default: all). Returns per slot a token
        sampled to follow its last valid token, and that token's log-prob. Slots with
        n_valid 0 write junk beyond their content, which later writes overwrite."""
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim == 1:
            tokens = tokens[:, None]
        n_valid = np.full(self.slots, tokens.shape[1], np.int32) if n_valid is None else np.asarray(n_valid, np.int32)
        self._key, key = jax.random.split(self._key)
        nxt, logp, self.cache = self._step(params, self.cache, tokens, np.asarray(start, np.int32), n_valid, key)
        return np.asarray(nxt), np.asarray(logp)

    def prefill_rows(self, params, rows: np.ndarray, tokens: np.ndarray, start: np.ndarray, n_valid: np.ndarray):
        """`step` for the `prefill_slots` distinct slots `rows` only: tokens [K, prefill].
        Rows with n_valid 0 (padding) write junk beyond their slot's content, as in `step`."""
        self._key, key = jax.random.split(self._key)
        args = (np.asarray(rows, np.int32), np.asarray(tokens, np.int32), np.asarray(start, np.int32))
        nxt, logp, self.cache = self._rows_step(params, self.cache, *args, np.asarray(n_valid, np.int32), key)
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
        """Compiles the decode step and the catch-up step up front, so no episode pays for
        compilation (the engine runs only these two shapes)."""
        self.step(params, np.zeros((self.slots, 1), np.int32), np.zeros(self.slots), np.zeros(self.slots))
        k = self.prefill_slots
        self.prefill_rows(params, np.arange(k), np.zeros((k, self.prefill), np.int32), np.zeros(k), np.zeros(k))
        self.cache = self._copy(self.cache, np.zeros(k, np.int32), np.zeros(k, np.int32))
        heap.release()  # the compiler's working memory

    def compiled_variants(self) -> int:
        steps = sum(f._cache_size() for pair in self._steps.values() for f in pair)
        return steps + self._copy._cache_size()


def _chunk_step(graphdef, greedy, params, cache, tokens, start, n_valid, key):
    last = jnp.clip(n_valid - 1, 0, tokens.shape[1] - 1)
    logits, cache = nnx.merge(graphdef, params).decode(tokens, start, cache, last=last)  # [S, vocab]
    nxt, logp = draw.greedy(logits) if greedy else draw.sample(logits, key)
    return nxt, logp, cache


def _copy_rows(cache, src, dst):
    """Cache rows src copied onto rows dst (padding pairs copy a row onto itself: a no-op)."""
    return tuple((k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in cache)


def _rows_step(graphdef, greedy, params, cache, rows, tokens, start, n_valid, key):
    """_chunk_step on the cache rows of some slots: gathered, stepped, written back."""
    sub = tuple((k[rows], v[rows]) for k, v in cache)
    nxt, logp, sub = _chunk_step(graphdef, greedy, params, sub, tokens, start, n_valid, key)
    cache = tuple((k.at[rows].set(sk), v.at[rows].set(sv)) for (k, v), (sk, sv) in zip(cache, sub))
    return nxt, logp, cache
