"""The continuous-batching engine: exact log-probs, no recompiles, latency hiding, swaps."""

import asyncio
import contextlib
import itertools
import time

import jax
import numpy as np
import pytest
from flax import nnx

import environments
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params, token_logprobs
from core.policy.sampling.sampler import Placed, Sampler
from core.policy.text import tokenizer
from core.policy.text.chat_format import ByteFormat
from rollout.engine import InferenceEngine, Sequence
from rollout.episodes import EpisodeLimits, run_group

CFG = ModelConfig(max_seq_len=128)


@pytest.fixture(scope="module")
def model():
    graphdef, params = split_params(init_model(CFG, seed=2))
    fwd = jax.jit(lambda p, t, s, q: token_logprobs(nnx.merge(graphdef, p)(t, s, q), t))
    return params, fwd


def _full_logprobs(fwd, params, tokens):
    t = np.zeros((1, 128), np.int32)
    t[0, : len(tokens)] = tokens
    seg = (np.arange(128) < len(tokens)).astype(np.int32)[None]
    return np.asarray(fwd(params, t, seg, np.arange(128)[None] * seg))[0, : len(tokens)]


async def _chatty_episode(engine, rng_seed, turns=3):
    """Prompt, then model turns interleaved with environment text of varied length."""
    rng = np.random.default_rng(rng_seed)
    seq = Sequence.start([tokenizer.BOS] + list(rng.integers(0, 256, rng.integers(3, 30))))
    for _ in range(turns):
        await engine.generate(seq, int(rng.integers(1, 8)), lambda g: False)
        await asyncio.sleep(float(rng.uniform(0, 0.02)))  # a tool call
        seq.extend_env(list(rng.integers(0, 256, rng.integers(1, 20))))
    await engine.generate(seq, 3, lambda g: False)
    engine.release(seq)
    return seq


@pytest.mark.parametrize(("slots", "steps"), [(2, 1), (5, 1), (12, 1), (5, 4), (12, 4)])
def test_recorded_logprobs_equal_full_forward(model, slots, steps):
    """12 concurrent episodes on fewer slots: slots are reused, histories re-fed in
    chunks, yet every generated token's log-prob is the full-sequence log-prob, whether a
    decode call runs one step or up to 4 (with cache reads cut at 32, 64 or 128)."""
    params, fwd = model
    sampler = Sampler(CFG, slots=slots, length=128, prefill=8, decode_steps=steps, smallest_window=32)
    engine = InferenceEngine(sampler, lambda: (params, 0))

    async def many():
        return await asyncio.gather(*(_chatty_episode(engine, i) for i in range(12)))

    seqs = asyncio.run(many())
    for seq in seqs:
        gen = np.asarray(seq.loss_mask) == 1
        assert gen.sum() >= 4
        full = _full_logprobs(fwd, params, seq.tokens)
        np.testing.assert_allclose(np.asarray(seq.logprobs)[gen], full[gen], atol=2e-4)
    # A decode call per window (32, 64, 128), the prefill width and a row copy, nothing else.
    assert sampler.compiled_variants() <= 5
    if slots < 12:
        assert engine.stats["refeeds"] > 0
    stats = engine.stats
    assert stats["decode_device_steps"] <= stats["decode_calls"] * steps
    if steps > 1:
        assert stats["decode_tokens"] > stats["decode_calls"] * 1.2  # several tokens a call


@pytest.mark.parametrize("slots", [4, 16])
def test_a_group_prefills_its_shared_prompt_once_and_scores_as_if_alone(model, slots):
    """Two groups of 8 episodes, each group one prompt: the first episode of a group feeds
    the prompt, the others copy its cache rows, and every sampled token's log-prob is
    still the full forward's (on 4 slots the copies come from slots that moved on too)."""
    params, fwd = model
    rng = np.random.default_rng(7)
    prompts = [[tokenizer.BOS] + list(rng.integers(0, 256, 40)) for _ in range(2)]

    async def episode(engine, prompt, i):
        seq = Sequence.start(prompt)
        await engine.generate(seq, 6, lambda g: False)
        seq.extend_env(list(np.random.default_rng(i).integers(0, 256, 5)))
        await engine.generate(seq, 4, lambda g: False)
        engine.release(seq)
        return seq

    def run(share: bool):
        sampler = Sampler(CFG, slots=slots, length=128, prefill=8, prefill_slots=4)
        engine = InferenceEngine(sampler, lambda: (params, 0), share_prompts=share)

        async def both():
            return await asyncio.gather(*(episode(engine, prompts[i // 8], i) for i in range(16)))

        return asyncio.run(both()), engine, sampler

    seqs, engine, sampler = run(share=True)
    for seq in seqs:
        gen = np.asarray(seq.loss_mask) == 1
        full = _full_logprobs(fwd, params, seq.tokens)
        np.testing.assert_allclose(np.asarray(seq.logprobs)[gen], full[gen], atol=2e-4)
    _, alone, _ = run(share=False)
    copied = 14 if slots == 16 else 6  # every follower; on 4 slots some leaders lose their slot first
    assert engine.stats["shared_prompt_tokens"] >= copied * 40
    assert engine.stats["fed_tokens"] <= alone.stats["fed_tokens"] - copied * 40
    assert alone.stats["shared_prompt_tokens"] == 0
    assert (sampler._step._cache_size(), sampler._rows_step._cache_size(), sampler._copy._cache_size()) == (1, 1, 1)


def test_prompts_with_a_common_prefix_copy_it_and_score_as_if_alone(model):
    """Twelve different tasks behind one 48-token system prefix (a checkpoint's system turn
    and tools block), all arriving at once: each fresh episode copies the prefix from a slot
    that caches it (or waits while one prefills it) instead of feeding it, and every sampled
    token's log-prob is still the full forward's."""
    params, fwd = model
    rng = np.random.default_rng(11)
    system = [tokenizer.BOS] + list(rng.integers(0, 256, 47))
    prompts = [system + list(rng.integers(0, 256, 6 + i)) for i in range(12)]

    def run(share: bool):
        sampler = Sampler(CFG, slots=4, length=128, prefill=8, prefill_slots=4)
        engine = InferenceEngine(sampler, lambda: (params, 0), share_prompts=share)

        async def episode(i):
            seq = Sequence.start(prompts[i])
            await engine.generate(seq, 5, lambda g: False)
            engine.release(seq)
            return seq

        async def all_():
            return await asyncio.gather(*(episode(i) for i in range(12)))

        return asyncio.run(all_()), engine

    seqs, engine = run(share=True)
    for seq in seqs:
        gen = np.asarray(seq.loss_mask) == 1
        assert gen.sum() == 5
        np.testing.assert_allclose(
            np.asarray(seq.logprobs)[gen], _full_logprobs(fwd, params, seq.tokens)[gen], atol=2e-4
        )
    _, alone = run(share=False)
    # Every episode but the first: the others wait for it to prefill the prefix, then copy it.
    assert engine.stats["shared_prompt_tokens"] >= 11 * 48
    assert engine.stats["fed_tokens"] <= alone.stats["fed_tokens"] - 11 * 48
    assert alone.stats["shared_prompt_tokens"] == 0


class _FixedWaitEnv(environments.Environment):
    """Every step waits `latency` s (asyncio.sleep, as a tool does), whatever the model wrote, well-formed or
    not; the episode finishes after `turns` steps. Each wait is logged with the tokens the engine generated
    meanwhile. With a shared `lock`, steps run one at a time: an engine that blocks on each tool call."""

    def __init__(self, latency, turns, engine, log, lock=None):
        self.latency, self.turns, self.engine, self.log, self.lock = latency, turns, engine, log, lock

    async def reset(self, task):
        self.steps = 0
        return task.prompt

    async def step(self, action_text):
        self.steps += 1
        async with self.lock or contextlib.nullcontext():
            t0, tokens0 = time.perf_counter(), self.engine.stats["generated_tokens"]
            await asyncio.sleep(self.latency)
            self.log.append((t0, time.perf_counter(), self.engine.stats["generated_tokens"] - tokens0))
        done = self.steps >= self.turns
        info = {"status": environments.EpisodeStatus.FINISHED} if done else {}
        return environments.StepResult("" if done else "<result>0</result>", 0.0, done, info)


def _run_waiting_groups(sampler, params, groups, group_size, turns, latency, serialise=False):
    """Runs groups x group_size concurrent episodes of `_FixedWaitEnv`: (trajectories, wait log, wall time)."""
    engine = InferenceEngine(sampler, lambda: (params, 0))
    limits = EpisodeLimits(max_new_tokens_per_turn=4, max_tokens=128)  # room for every turn: none truncates
    task = environments.Task("wait-0", "Compute 10-15. ", "-5")
    log = []

    async def main():
        lock = asyncio.Lock() if serialise else None
        envs = [[_FixedWaitEnv(latency, turns, engine, log, lock) for _ in range(group_size)] for _ in range(groups)]
        return await asyncio.gather(*(run_group(engine, e, task, f"r{i}", limits) for i, e in enumerate(envs)))

    t0 = time.perf_counter()
    out = asyncio.run(main())
    return [t for g in out for t in g], log, time.perf_counter() - t0


def _max_concurrent(log):
    """The most waits in progress at one instant."""
    edges = sorted([(t0, 1) for t0, _, _ in log] + [(t1, -1) for _, t1, _ in log])  # an end sorts before a start
    return max(itertools.accumulate(d for _, d in edges))


def _check_waits_happened(trajs, log, n, turns, latency):
    """Every episode ran all its turns and every turn really waited `latency`."""
    assert len(trajs) == n
    assert all(t.num_turns == turns and t.status == "finished" for t in trajs), [(t.num_turns, t.status) for t in trajs]
    assert len(log) == n * turns
    assert min(t1 - t0 for t0, t1, _ in log) >= latency - 1e-3
    assert min(t.env_latency_s for t in trajs) >= turns * latency - 1e-3


def test_tool_waits_overlap_across_episodes(model):
    """While episodes wait on their tools the engine decodes for the others, so the waits overlap: 48 episodes
    (more than the 32 slots, so they are admitted in waves) x 3 steps x 0.4 s take about 3 waits, not 144."""
    params, _ = model
    sampler = Sampler(CFG, slots=32, length=128)
    sampler.warmup(params)
    groups, group_size, turns, latency = 12, 4, 3, 0.4
    n = groups * group_size
    trajs, log, elapsed = _run_waiting_groups(sampler, params, groups, group_size, turns, latency)
    _check_waits_happened(trajs, log, n, turns, latency)
    serial = n * turns * latency  # 57.6 s if each wait blocked everything else
    total_wait = sum(t.env_latency_s for t in trajs)
    assert total_wait >= serial - 0.1, (total_wait, serial)
    assert elapsed < min(serial / 2, total_wait / 4, 6 * turns * latency), (elapsed, total_wait)
    assert _max_concurrent(log) >= 32, _max_concurrent(log)
    # The engine kept decoding (the later waves, the early finishers) during many of the waits.
    assert sum(tokens > 0 for _, _, tokens in log) >= n // 2, [tokens for _, _, tokens in log]

    # Negative control: with the steps serialised by a lock (a pipeline that blocks on each tool call), the
    # same waits happen but the overlap assertions above would fail: no two at once, wall time >= their sum.
    turns, latency = 2, 0.1
    trajs, log, elapsed = _run_waiting_groups(sampler, params, 2, 2, turns, latency, serialise=True)
    _check_waits_happened(trajs, log, 4, turns, latency)
    assert _max_concurrent(log) == 1 and elapsed >= 4 * turns * latency, (_max_concurrent(log), elapsed)


@pytest.mark.parametrize(("steps", "swap_after"), [(1, 10), (4, 2)])
def test_policy_swap_between_steps_is_recorded_per_token(model, steps, swap_after):
    """The version changes between calls, never inside one; the params are placed on the
    device once per version, not per call."""
    params, _ = model
    sampler = Sampler(CFG, slots=4, length=128, decode_steps=steps)
    state = {"calls": 0}
    other = jax.tree.map(lambda x: x, params)  # version 1: the same weights, another object

    def source():
        state["calls"] += 1
        return (params, 0) if state["calls"] <= swap_after else (other, 1)

    placed = []
    place = sampler.place

    def counted(p):
        if not isinstance(p, Placed):  # the engine hands its placed params to each call
            placed.append(p)
        return place(p)

    sampler.place = counted
    engine = InferenceEngine(sampler, source)

    async def one():
        seq = Sequence.start([tokenizer.BOS, 65, 66])
        await engine.generate(seq, 20, lambda g: False)
        return seq

    seq = asyncio.run(one())
    versions = np.asarray(seq.versions)[np.asarray(seq.loss_mask) == 1]
    assert set(versions.tolist()) == {0, 1}
    assert np.all(np.diff(versions) >= 0)  # a later token never carries an older version
    assert len(placed) == 2 and placed[0] is params and placed[1] is other


@pytest.mark.parametrize("steps", [1, 4])
def test_generation_stops_at_max_tokens(model, steps):
    params, _ = model
    engine = InferenceEngine(Sampler(CFG, slots=1, length=128, decode_steps=steps), lambda: (params, 0), max_tokens=20)

    async def one():
        seq = Sequence.start([tokenizer.BOS] + [70] * 10)
        n = await engine.generate(seq, 100, lambda g: False)
        return seq, n

    seq, n = asyncio.run(one())
    assert len(seq.tokens) == 20 and n == 20 - 11


class _SplitStops(ByteFormat):
    """The device and the host disagree on turn ends: the device stops on eight ids, the
    host ends a turn on ids divisible by 5 (one of the eight among them)."""

    def stop_sequences(self):
        return tuple((t,) for t in range(1, 9))

    def is_turn_end(self, generated):
        return generated[-1] % 5 == 0


def test_the_host_judges_turn_ends_the_device_only_shortcuts_them(model):
    """Where the device stops on an id the host does not end the turn on, the slot goes on
    in the next call; where the host ends a turn the device ran past, the surplus is dropped
    (counted) and the cache beyond the turn is junk that later writes overwrite. Either way
    each turn ends exactly at its first host stop (or its budget), and every log-prob is
    the full forward's."""
    params, fwd = model
    sampler = Sampler(CFG, slots=6, length=128, prefill=8, decode_steps=8)
    engine = InferenceEngine(sampler, lambda: (params, 0), chat_format=_SplitStops())
    fmt, turns = engine.chat_format, []

    async def episode(i):
        rng = np.random.default_rng(i)
        seq = Sequence.start([tokenizer.BOS, *rng.integers(0, 256, 6 + i)])
        for _ in range(4):
            before = len(seq.tokens)
            n = await engine.generate(seq, 24, fmt.is_turn_end)
            turns.append(seq.tokens[before : before + n])
            seq.extend_env([int(t) for t in rng.integers(0, 256, 3)])
        engine.release(seq)
        return seq

    async def all_():
        return await asyncio.gather(*(episode(i) for i in range(10)))

    seqs = asyncio.run(all_())
    for turn in turns:
        assert turn and not any(t % 5 == 0 for t in turn[:-1]), turn
        assert turn[-1] % 5 == 0 or len(turn) == 24, turn
    for seq in seqs:
        gen = np.asarray(seq.loss_mask) == 1
        np.testing.assert_allclose(
            np.asarray(seq.logprobs)[gen], _full_logprobs(fwd, params, seq.tokens)[gen], atol=2e-4
        )
    stats = engine.stats
    assert stats["surplus_tokens"] > 0
    kept = stats["decode_tokens"] - stats["surplus_tokens"]
    # The rest were sampled by catch-up calls, each for up to prefill_slots slots.
    assert 0 <= stats["generated_tokens"] - kept <= stats["prefill_steps"] * sampler.prefill_slots
    # The device stopped on ids the host let pass (the turn went on): some turns hold one.
    assert any(t in range(1, 9) for turn in turns for t in turn[:-1] if t % 5), turns
