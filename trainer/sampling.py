"""Fixed-shape KV-cached sampling over B slots that records behaviour log-probs.

The rollout side drives this one token per slot per call: a slot either feeds a known
token (prompt or environment output, teacher-forced into the cache) or the token it
just sampled. One compiled function serves every step, so nothing recompiles after the
first call. Sampling is at temperature 1 so the recorded log-prob is exactly the
learner's log-prob of the same token under the same parameters.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trainer.config import ModelConfig
from trainer.model import init_model, split_params


class Sampler:
    def __init__(self, cfg: ModelConfig, slots: int, length: int, seed: int = 0):
        if length > cfg.max_seq_len:
            raise ValueError(f"sampler length {length} exceeds the model's max_seq_len {cfg.max_seq_len}")
        self.cfg, self.slots, self.length = cfg, slots, length
        model = init_model(cfg)
        self.graphdef, self.abstract_params = split_params(model)
        self.cache = model.init_cache(slots, length)
        self._key = jax.random.key(seed)
        self._step = jax.jit(functools.partial(_decode_step, self.graphdef), donate_argnums=(1,))

    def step(self, params, tokens: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Feed tokens[b] at cache index[b] (== its position). Returns, per slot, a token
        sampled for index[b] + 1 and its log-prob. Idle slots may feed anything at an
        index that will be overwritten later; their outputs are ignored by the caller."""
        self._key, key = jax.random.split(self._key)
        index = np.minimum(index, self.length - 1).astype(np.int32)
        nxt, logp, self.cache = self._step(params, self.cache, tokens.astype(np.int32), index, key)
        return np.asarray(nxt), np.asarray(logp)

    def compiled_variants(self) -> int:
        return self._step._cache_size()


def _decode_step(graphdef, params, cache, tokens, index, key):
    model = nnx.merge(graphdef, params)
    logits, cache = model.decode(tokens, index, cache, index)
    nxt = jax.random.categorical(key, logits, axis=-1)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), nxt[:, None], axis=-1)[:, 0]
    return nxt.astype(jnp.int32), logp, cache
