"""Behaviour cloning on oracle episodes, before the first policy version.

A randomly initialised policy never solves a task, so every group-relative advantage
is 0 and RL has nothing to learn from. A short supervised warm start on transcripts of
the environment's scripted oracle (driven through the real environment) gives the
initial policy a non-zero success rate; RL then improves on it.
"""

from __future__ import annotations

import asyncio
import functools

import jax
import numpy as np
import optax
from flax import nnx

import environments
from trainer.policy import tokenizer
from trainer.policy.model import token_logprobs


async def oracle_transcript(env_name: str, task: environments.Task, max_turns: int = 8):
    """(tokens, loss_mask) of one oracle episode, tokenised as the rollout side does."""
    env, oracle = environments.make(env_name), environments.oracle(env_name)
    tokens = [tokenizer.BOS] + tokenizer.encode(await env.reset(task))
    mask = [0] * len(tokens)
    observations: list[str] = []
    for _ in range(max_turns):
        action = tokenizer.encode(oracle(task, observations))
        tokens += action
        mask += [1] * len(action)
        result = await env.step(tokenizer.decode(action))
        if result.done:
            return tokens, mask, result.reward
        obs = tokenizer.encode(result.observation)
        tokens += obs
        mask += [0] * len(obs)
        observations.append(result.observation)
    return tokens, mask, 0.0


def oracle_rows(env_name: str, tasks, seq_len: int) -> dict[str, np.ndarray]:
    """One transcript per row: tokens, segment_ids, positions, loss_mask [len(tasks), seq_len]."""
    n = len(tasks)
    out = {k: np.zeros((n, seq_len), np.int32) for k in ("tokens", "segment_ids", "positions", "loss_mask")}
    for i, task in enumerate(tasks):
        toks, mask, _ = asyncio.run(oracle_transcript(env_name, task))
        toks, mask = toks[:seq_len], mask[:seq_len]
        out["tokens"][i, : len(toks)] = toks
        out["segment_ids"][i, : len(toks)] = 1
        out["positions"][i, : len(toks)] = np.arange(len(toks))
        out["loss_mask"][i, : len(toks)] = mask
    return out


def _sft_step(graphdef, tx, params, opt_state, batch):
    def loss_fn(p):
        logits = nnx.merge(graphdef, p)(batch["tokens"], batch["segment_ids"], batch["positions"])
        mask = batch["loss_mask"].astype(np.float32)
        return -(token_logprobs(logits, batch["tokens"]) * mask).sum() / mask.sum()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def warm_start(
    graphdef,
    params,
    env_name: str,
    tasks,
    steps: int,
    batch_rows: int = 32,
    seq_len: int = 160,
    learning_rate: float = 3e-3,
    seed: int = 0,
):
    """Returns (params, [loss per step]) after `steps` supervised steps on oracle rows."""
    data = oracle_rows(env_name, tasks, seq_len)
    tx = optax.adam(learning_rate)
    opt_state = tx.init(params)
    step = jax.jit(functools.partial(_sft_step, graphdef, tx))
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        idx = rng.integers(0, len(tasks), batch_rows)
        params, opt_state, loss = step(params, opt_state, {k: v[idx] for k, v in data.items()})
        losses.append(float(loss))
    return params, losses
