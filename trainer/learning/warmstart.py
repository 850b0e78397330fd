"""Behaviour cloning on oracle episodes, before the first policy version.

A randomly initialised policy never solves a task, so every group-relative advantage
is 0 and RL has nothing to learn from. A short supervised warm start on transcripts of
the environment's scripted oracle (driven through the real environment) teaches the
tool-call format and the copying of arguments and results; RL then improves on it.

`direct_frac` leaves RL a decision to learn: that share of the demonstrations state the
answer directly instead of calling the tool. The policy cannot do the arithmetic itself,
so "answer now" mostly fails where "call the tool" succeeds, and the reward tells the two
apart. `direct_at="first_turn"` (the default) makes that one decision at the first action;
"any_turn" answers after a random number of the oracle's calls, which also teaches the
policy to stop half-way through a multi-call task (docs/BENCHMARKS.md has what each did
on the calculator demo).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import environments
from core import heap
from core.config import configclass, knob
from core.contracts.record_shape import DEFAULT_MAX_TRAJECTORY_LEN
from core.policy.model.logprobs import token_logprobs_and_entropy
from core.policy.text.chat_format import ChatFormat, chat_format_for
from core.policy.text.tokenizer import BYTE_TOKENIZER
from environments.registry import DEFAULT_STYLE
from trainer.learning.step import gradients, layout
from trainer.learning.step.gradients import ComputeConfig, Layout, Numerics, cast_floats

SCHEDULES = ("constant", "cosine")
DIRECT_AT = ("first_turn", "any_turn")


@configclass
class WarmStartConfig:
    steps: int = knob(0, "behaviour-cloning steps on oracle episodes before policy v0 (0 = random init)", ge=0)
    batch_rows: int = knob(32, "oracle transcripts per warm-start step", flag="batch", ge=1)
    learning_rate: float = knob(3e-3, "the warm start's peak learning rate", flag="lr", gt=0)
    # Cosine copied sharper than a constant rate on the calculator (docs/BENCHMARKS.md).
    schedule: str = knob(
        "cosine", "cosine: linear warmup, then decay to 0 (sharper copying than a constant rate)", choices=SCHEDULES
    )
    warmup_steps: int = knob(50, "linear warmup steps of the cosine schedule", flag="warmup", ge=0)
    direct_frac: float = knob(
        0.0,
        "share of demonstrations that answer directly instead of calling the tool (RL's decision to learn)",
        ge=0,
        le=1,
    )
    direct_at: str = knob(
        "first_turn",
        "where direct-answer demonstrations answer: at the first action, or after some of the calls",
        choices=DIRECT_AT,
    )
    oracle: str = knob(
        DEFAULT_STYLE,
        "the demonstrations' style: the environment's default expert, or another it registers "
        "(calculator: whole, one call with the whole expression; needs max_ops_per_call to allow it)",
    )
    tasks: int = knob(
        1000, "oracle demonstrations drawn from this many generated train tasks (more tasks: less memorising)", ge=1
    )


@dataclasses.dataclass
class Transcript:
    tokens: list[int]
    loss_mask: list[int]  # 1 on the model's own tokens (its actions, end-of-turn included)
    reward: float = 0.0
    tool_calls: int = 0


async def oracle_transcript(
    env_name: str,
    task: environments.Task,
    max_turns: int = 8,
    answer_after=None,
    fmt: ChatFormat | None = None,
    env_config: dict | None = None,
    style: str = DEFAULT_STYLE,
) -> Transcript:
    """One oracle episode through the real environment, tokenised exactly as the rollout
    side tokenises an episode in the model's chat format `fmt` (default: the byte format):
    the prompt and observations as the episode loop appends them, each action as the model
    would write it (its tool-call syntax and end-of-turn token), the loss on the actions.
    answer_after=k: after k tool observations, answer the task's target directly.
    env_config: the environment's settings (its turn limit, ranges); no tool latency here.
    style: which of the environment's experts demonstrates (environments.oracle)."""
    fmt = fmt or chat_format_for(BYTE_TOKENIZER)
    env = environments.make(env_name, **demo_env_config(env_config))
    oracle = environments.oracle(env_name, style)
    tools = env.tools()
    out = Transcript(fmt.prompt_ids(await env.reset(task), tools), [])
    out.loss_mask = [0] * len(out.tokens)
    observations: list[str] = []
    for _ in range(max_turns):
        text = oracle(task, observations)
        if answer_after is not None and len(observations) >= answer_after:
            text = f"<answer>{task.target}</answer>"
        action = fmt.action_ids(text, tools)
        out.tokens += action
        out.loss_mask += [1] * len(action)
        result = await env.step(fmt.env_action(action, tools))  # what the env makes of the model's tokens
        if result.done:
            out.reward = result.reward
            return out
        obs = fmt.observation_ids(result.observation)
        out.tokens += obs
        out.loss_mask += [0] * len(obs)
        observations.append(result.observation)
        out.tool_calls += 1
    return out


async def oracle_transcripts(
    env_name: str, jobs, fmt, env_config, concurrency: int = 8, style: str = DEFAULT_STYLE
) -> list[Transcript]:
    """Oracle transcripts of (task, answer_after) jobs, in order, `concurrency` at a time:
    an environment whose tool runs elsewhere (code's sandbox processes) overlaps them."""
    slots = asyncio.Semaphore(concurrency)

    async def one(task, after):
        async with slots:
            return await oracle_transcript(
                env_name, task, answer_after=after, fmt=fmt, env_config=env_config, style=style
            )

    return await asyncio.gather(*(one(task, after) for task, after in jobs))


def demo_env_config(env_config: dict | None) -> dict:
    """The run's environment settings for demonstrations: the same tasks and limits, but
    no simulated tool latency (a demonstration needs no waiting)."""
    return {**(env_config or {}), "tool_latency": "none"}


def oracle_rows(
    env_name: str,
    tasks,
    max_seq_len: int,
    direct_frac: float = 0.0,
    seed: int = 0,
    direct_at: str = "first_turn",
    fmt: ChatFormat | None = None,
    env_config: dict | None = None,
    style: str = DEFAULT_STYLE,
) -> dict:
    """One transcript per row: tokens, segment_ids, positions, loss_mask [len(tasks), L],
    L = the longest transcript rounded up to 16 (no row longer than needed), <= max_seq_len."""
    run = functools.partial(oracle_transcripts, env_name, fmt=fmt, env_config=env_config, style=style)
    full = None
    if direct_frac > 0 and direct_at == "any_turn":  # how many calls each task takes
        full = asyncio.run(run([(task, None) for task in tasks]))
    rng = np.random.default_rng(seed)
    answer_after: list[int | None] = []
    for i in range(len(tasks)):
        after = None
        if direct_frac > 0 and rng.random() < direct_frac:
            after = 0
            if full is not None:  # 0 .. calls - 1 tool calls, then answer
                after = int(rng.integers(0, max(full[i].tool_calls, 1)))
        answer_after.append(after)
    transcripts = [
        (t.tokens[:max_seq_len], t.loss_mask[:max_seq_len]) for t in asyncio.run(run(list(zip(tasks, answer_after))))
    ]
    seq_len = min(max_seq_len, -(-max(len(t) for t, _ in transcripts) // 16) * 16)
    out = {k: np.zeros((len(tasks), seq_len), np.int32) for k in ("tokens", "segment_ids", "positions", "loss_mask")}
    for i, (toks, mask) in enumerate(transcripts):
        out["tokens"][i, : len(toks)] = toks
        out["segment_ids"][i, : len(toks)] = 1
        out["positions"][i, : len(toks)] = np.arange(len(toks))
        out["loss_mask"][i, : len(toks)] = mask
    return out


def sft_batches(data: dict, rows: int, steps: int, rng: np.random.Generator):
    """`steps` batches of `rows` demonstrations drawn with replacement: one draw of rows per
    batch for every field, so a row's tokens, loss mask, segments and positions stay one
    transcript's. (A draw per field, from d53cabd until this fix, trained on other
    transcripts' masks and positions: the calculator demo's v0 fell from 0.50 to 0.22-0.24.)"""
    n = len(data["tokens"])
    for _ in range(steps):
        idx = rng.integers(0, n, rows)
        yield {k: v[idx] for k, v in data.items()}


def _sft_loss(graphdef, frozen, num: Numerics, remat: bool, params, batch):
    """Negative log-likelihood of the demonstrated actions: one micro-batch's share of the
    whole batch's token mean (`total`: the whole batch's loss tokens)."""
    params, frozen = cast_floats(params, num.dtype), cast_floats(frozen, num.dtype)
    model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
    tokens = batch["tokens"]
    hidden = model.hidden(tokens, batch["segment_ids"], batch["positions"], remat=remat, attention=num.attention)
    logp, _ = token_logprobs_and_entropy(model.head, hidden, tokens, num.logit_chunk)
    mask = batch["loss_mask"].astype(np.float32)
    return -(logp * mask).sum() / batch["total"][0], {}


def _sft_step(graphdef, tx, num: Numerics, lay: Layout, params, opt_state, frozen, batch):
    """One supervised step on the learner's path (trainer/learning/step/gradients.py): its
    dtype, remat, log-probs in chunks, micro-batches."""
    rows = batch["tokens"].shape[0]
    total = jnp.maximum(batch["loss_mask"].sum(), 1).astype(jnp.float32)
    batch = {**batch, "total": jnp.broadcast_to(total, (rows,))}
    loss_fn = functools.partial(_sft_loss, graphdef, frozen, num, lay.remat)
    (loss, _), grads = gradients.value_and_grad(loss_fn, params, batch, lay.micro_batches)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def _compile_fitting(graphdef, tx, num: Numerics, compute: ComputeConfig, params, opt_state, frozen, batch):
    """The SFT step compiled for this batch's shape in the fastest layout that fits."""
    rows, seq_len = batch["tokens"].shape

    def compile_layout(lay):
        step = jax.jit(functools.partial(_sft_step, graphdef, tx, num, lay), donate_argnums=(0, 1))
        out = step.lower(params, opt_state, frozen, batch).compile()
        heap.release()  # the compiler's working memory, before the step's own
        return out

    what, hint = f"the warm-start step at {rows}x{seq_len}", f"lower --warmstart_batch (now {rows})"
    return layout.choose(compile_layout, compute, rows, what, hint)[0]


def warm_start(
    graphdef,
    params,
    env_name: str,
    tasks,
    cfg: WarmStartConfig,
    fmt: ChatFormat | None = None,
    frozen=None,
    env_config: dict | None = None,
    compute: ComputeConfig | None = None,
    *,
    seq_len: int = DEFAULT_MAX_TRAJECTORY_LEN,
    seed: int = 0,
):
    """Returns (params, [loss per step]) after cfg.steps supervised steps on oracle rows in
    the chat format `fmt`, one transcript of up to `seq_len` tokens (the layout's
    trajectory length) per row, drawn with `seed` (the learner's). With LoRA, `params` are
    the adapter's and `frozen` the base's: only the adapter learns; `params` are donated
    (their arrays are consumed: use the ones returned). compute: the learner's memory
    settings (the same path as its RL step); the step is refused before it runs if it cannot fit in free memory."""
    data = oracle_rows(env_name, tasks, seq_len, cfg.direct_frac, seed, cfg.direct_at, fmt, env_config, cfg.oracle)
    lr = cfg.learning_rate
    if cfg.schedule == "cosine":
        # A warm start shorter than its warmup warms up for all but its last step.
        warmup = max(1, min(cfg.warmup_steps, cfg.steps - 1))
        lr = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(cfg.steps, warmup + 1), 0.0)
    tx = optax.adam(lr)
    opt_state = tx.init(params)
    compute = compute or ComputeConfig()
    num = compute.numerics()
    losses, compiled = [], None
    for batch in sft_batches(data, cfg.batch_rows, cfg.steps, np.random.default_rng(seed)):
        if compiled is None:  # one shape: compiled once, in the fastest layout that fits in free memory
            compiled = _compile_fitting(graphdef, tx, num, compute, params, opt_state, frozen, batch)
        params, opt_state, loss = compiled(params, opt_state, frozen, batch)
        losses.append(float(loss))
    return params, losses
