"""One prompt in, a continuation out: KV-cached decoding of a single sequence.

What `agentic-rl generate` runs. The prompt is fed in one chunk, then one token per step,
through the same `Transformer.decode` the rollout engine uses (so this also checks the
cached path against another implementation). Each generated token's log-prob is taken at
temperature 1, whatever temperature sampled it: the number the learner would compute.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core.policy.model.transformer import Transformer, split_params


@dataclasses.dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    ids: list[int]  # generated, the stop token included when one ended it
    logprobs: list[float]  # natural log of each generated token's probability at temperature 1
    stopped_by: str  # "eos" or "length"


def generate(
    model: Transformer,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    eos_ids: tuple[int, ...] = (),
    greedy: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
) -> Generation:
    prompt_ids = [int(i) for i in prompt_ids]
    if not prompt_ids:
        raise ValueError("the prompt is empty: at least one token is needed to condition on")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be > 0 (or use greedy), got {temperature}")
    cfg = model.cfg
    length = len(prompt_ids) + max_new_tokens
    if length > cfg.max_seq_len:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"max_seq_len {cfg.max_seq_len}"
        )
    too_big = [i for i in prompt_ids if not 0 <= i < cfg.vocab_size]
    if too_big:
        raise ValueError(f"prompt ids {too_big[:5]} are outside the model's vocabulary ({cfg.vocab_size})")
    graphdef, params = split_params(model)
    cache = model.init_cache(1, length)
    step = jax.jit(functools.partial(_step, graphdef, greedy))
    key = jax.random.key(seed)
    temp = jnp.float32(1.0 if greedy else temperature)
    tokens, start = np.asarray([prompt_ids], np.int32), 0
    ids, logprobs, stopped_by = [], [], "length"
    for _ in range(max_new_tokens):
        key, sub = jax.random.split(key)
        nxt, logp, cache = step(params, cache, tokens, np.asarray([start], np.int32), temp, sub)
        token = int(nxt)
        ids.append(token)
        logprobs.append(float(logp))
        if token in eos_ids:
            stopped_by = "eos"
            break
        start += tokens.shape[1]
        tokens = np.asarray([[token]], np.int32)
    return Generation(prompt_ids, ids, logprobs, stopped_by)


def _step(graphdef, greedy, params, cache, tokens, start, temperature, key):
    logits, cache = nnx.merge(graphdef, params).decode(tokens, start, cache)
    last = logits[0, -1].astype(jnp.float32)
    nxt = jnp.argmax(last) if greedy else jax.random.categorical(key, last / temperature)
    return nxt, jax.nn.log_softmax(last)[nxt], cache
