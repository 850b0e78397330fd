"""Several decode steps per device call (core/policy/sampling/decode_loop.py, Sampler.decode_loop):
the same tokens as one step a call with the same keys, stop checks on the device, cache
reads cut to the filled part, and the chat formats' stop sequences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sampling import decode_loop
from core.policy.sampling.sampler import Sampler, cast_params, resolve_decode_steps, serving_dtype
from core.policy.text.chat_format import chat_format_for
from core.policy.text.tokenizer import BYTE_TOKENIZER, load_tokenizer
from tests import _hf_tokenizers as tiny

CFG = ModelConfig(max_seq_len=128)
LENGTH, SLOTS, K = 64, 5, 6


@pytest.fixture(scope="module")
def params():
    return split_params(init_model(CFG, seed=3))[1]


def _prefilled(params, steps: int, greedy: bool):
    """A sampler whose slots hold prompts of different lengths (slot 3 idle), and the token
    each sampled after its prompt. Reads are cut at 16, 32 or 64 positions."""
    sampler = Sampler(CFG, SLOTS, LENGTH, prefill=16, seed=7, greedy=greedy, decode_steps=steps, smallest_window=16)
    lengths = np.array([5, 12, 3, 1, 9])
    prompts = np.random.default_rng(0).integers(0, 256, (SLOTS, 16)).astype(np.int32)
    first, _ = sampler.step(params, prompts, np.zeros(SLOTS), lengths)
    return sampler, lengths, first


def _ends(recent, stops):
    return any(len(s) and tuple(recent[-len(s) :]) == tuple(s) for s in stops)


def _one_step_calls(sampler, params, tokens, start, budget, stops, use, recent, steps):
    """What decode_loop does, as one `step` call per token: the reference."""
    ids, logps, recent = [], [], [list(r) for r in recent]
    tokens, live = tokens.copy(), budget > 0
    if not live.any():  # nothing to decode: no step, no key used
        return np.zeros((len(tokens), 0), np.int32), np.zeros((len(tokens), 0)), np.zeros(len(tokens), np.int32)
    for i in range(steps):
        nxt, lp = sampler.step(params, tokens[:, None], np.where(live, start + i, start), live.astype(np.int32))
        ids.append(nxt)
        logps.append(lp)
        tokens = np.where(live, nxt, tokens)
        for s in np.flatnonzero(live):
            recent[s] = [*recent[s][1:], int(nxt[s])]
        ended = [(i + 1 >= budget[s]) or (use[s] and _ends(recent[s], stops)) for s in np.flatnonzero(live)]
        if any(ended):
            break
    n = np.where(live, len(ids), 0)
    return np.stack(ids, 1), np.stack(logps, 1), n


@pytest.mark.parametrize("greedy", [False, True])
def test_multi_token_decode_equals_one_token_steps(params, greedy):
    """Call after call, as the engine makes them: each slot's tokens, log-probs and counts
    equal one `step` call per token from the same key, stops spanning calls included. Some
    calls end on a stop sequence mid-loop, some on a spent budget; idle slots stay idle."""
    loop, lengths, first = _prefilled(params, K, greedy)
    ref, _, first_ref = _prefilled(params, 1, greedy)
    np.testing.assert_array_equal(first, first_ref)
    # Stop sequences that do fire: tokens the reference itself samples (a probe sampler).
    probe, _, _ = _prefilled(params, 1, greedy)
    no_stops = np.zeros(SLOTS, bool)
    empty = np.full((SLOTS, decode_loop.STOP_LEN), -1, np.int32)
    live = np.array([20, 20, 20, 0, 20])
    seen, _, _ = _one_step_calls(probe, params, first, lengths, live, (), no_stops, empty, K)
    stops = [(int(seen[0, 2]),), (int(seen[2, 3]), int(seen[2, 4]))]
    if greedy:  # a random model's argmax repeats itself: the stop would fire at once
        stops = [(int(seen[1, 2]), int(seen[1, 3]))]
    use = np.array([True, True, True, False, False])  # slot 4 ignores the stops: only its budget ends it
    budget = np.array([20, 20, 20, 0, 7])
    tokens, start, recent = first.copy(), lengths.copy(), empty.copy()
    why = []
    for _ in range(8):
        got = loop.decode_loop(params, tokens, start, budget, stop_sequences=stops, use_stops=use, recent=recent)
        want = _one_step_calls(ref, params, tokens, start, budget, stops, use, recent, K)
        n = got[2]
        np.testing.assert_array_equal(n, want[2])
        if not n.any():
            break
        for s in np.flatnonzero(n):
            np.testing.assert_array_equal(got[0][s, : n[s]], want[0][s, : n[s]])
            np.testing.assert_allclose(got[1][s, : n[s]], want[1][s, : n[s]], atol=2e-5)
        assert n[3] == 0 and (n == n.max()).sum() == (budget > 0).sum()
        for s in np.flatnonzero(n):  # the host's side: take the tokens, end turns
            new = got[0][s, : n[s]]
            recent[s] = np.concatenate([recent[s], new])[-decode_loop.STOP_LEN :]
            tokens[s], start[s], budget[s] = new[-1], start[s] + n[s], budget[s] - n[s]
            if budget[s] == 0:
                why.append(("budget", int(n.max())))
            elif use[s] and _ends(recent[s].tolist(), stops):
                why.append(("stop", int(n.max())))
                budget[s] = 0  # its turn is over: the slot idles
    assert any(w == "stop" and n < K for w, n in why), why
    assert any(w == "budget" and n < K for w, n in why), why
    assert jnp.array_equal(jax.random.key_data(loop._key), jax.random.key_data(ref._key))


def test_device_bound_decode_runs_every_step_in_one_call(params):
    """The timing use: budget K everywhere, no stops: K tokens per slot from one call."""
    sampler, lengths, first = _prefilled(params, K, False)
    ids, logps, n = sampler.decode_loop(params, first, lengths, np.full(SLOTS, K))
    assert ids.shape == logps.shape == (SLOTS, K) and n.tolist() == [K] * SLOTS
    assert np.all(logps < 0) and np.all((ids >= 0) & (ids < CFG.vocab_size))


def test_reads_only_the_filled_cache_one_variant_per_window(params):
    """A read cut to the first W positions gives the full read's logits; warmup compiles one
    decode variant per window (and the catch-up step and row copy), and no call adds one."""
    model = init_model(CFG, seed=3)
    cache = model.init_cache(2, LENGTH)
    tokens = np.random.default_rng(1).integers(0, 256, (2, 12)).astype(np.int32)
    _, cache = model.decode(tokens, np.zeros(2, np.int32), cache)
    full, _ = model.decode(tokens[:, :1], np.array([12, 7], np.int32), cache)
    cut, _ = model.decode(tokens[:, :1], np.array([12, 7], np.int32), cache, read_len=16)
    np.testing.assert_allclose(cut, full, atol=1e-5)

    sampler = Sampler(CFG, SLOTS, LENGTH, prefill=16, decode_steps=K, smallest_window=16)
    assert sampler.windows == (16, 32, 64)
    sampler.warmup(params)
    assert sampler.compiled_variants() == 3 + 2
    for at in (0, 20, 40, 58):
        sampler.decode_loop(params, np.ones(SLOTS), np.full(SLOTS, at), np.full(SLOTS, K))
    assert sampler.compiled_variants() == 3 + 2


def test_windows_and_stop_table():
    assert decode_loop.windows(448) == (128, 256, 448)
    assert decode_loop.windows(512) == (128, 256, 512)
    assert decode_loop.windows(100) == (100,)
    assert decode_loop.window_for((128, 256, 448), 129) == 256
    assert decode_loop.window_for((128, 256, 448), 0) == 128
    long = tuple(range(40, 40 + decode_loop.STOP_LEN + 4))
    ids, lens = decode_loop.stop_table(((7,), (1, 2, 3), long, *[(9,)] * 10))
    assert ids.shape == (decode_loop.STOP_ROWS, decode_loop.STOP_LEN) and lens[:3].tolist() == [1, 3, 16]
    recent = np.full((4, decode_loop.STOP_LEN), -1, np.int32)
    recent[0, -1] = 7  # ends with (7,)
    recent[1, -3:] = (1, 2, 3)
    recent[2, -2:] = (2, 3)  # (1, 2, 3) cut by the turn's start: no
    recent[3, :] = long[-decode_loop.STOP_LEN :]  # a long sequence: its last STOP_LEN ids
    assert decode_loop.ends_with_stop(recent, ids, lens).tolist() == [True, True, False, True]
    ids, lens = decode_loop.stop_table(())
    assert not decode_loop.ends_with_stop(recent, ids, lens).any()


def test_chat_formats_stop_sequences_end_their_turns(tmp_path):
    """Each format's device stop sequences are turn ends to its own is_turn_end."""
    formats = [chat_format_for(BYTE_TOKENIZER)]
    for family in ("qwen2", "llama3"):
        tok = load_tokenizer(tiny.write(tmp_path / family, family))
        formats.append(chat_format_for(tok, template_vars={"date_string": "26 Jul 2024"}))
    for fmt in formats:
        sequences = fmt.stop_sequences()
        assert sequences and len(sequences) <= decode_loop.STOP_ROWS
        for seq in sequences:
            assert 0 < len(seq) <= decode_loop.STOP_LEN
            assert fmt.is_turn_end([*fmt.tokenizer.encode("ok "), *seq]), (fmt.name, seq)
    assert len(formats[0].stop_sequences()) == 3  # </call>, </answer>, eos


def test_serving_dtype_and_bfloat16_decode(params):
    """auto is float32 on a CPU; a bfloat16 cache and params (an accelerator's) decode too."""
    assert serving_dtype("auto") == jnp.float32 and serving_dtype("bfloat16") == jnp.bfloat16
    assert resolve_decode_steps(0) == 1 and resolve_decode_steps(5) == 5
    with pytest.raises(ValueError, match="dtype"):
        serving_dtype("float16")
    half = cast_params(params, jnp.bfloat16)
    assert {x.dtype for x in jax.tree.leaves(half)} == {jnp.dtype(jnp.bfloat16)}
    sampler = Sampler(CFG, SLOTS, LENGTH, dtype=jnp.bfloat16, decode_steps=K)
    assert sampler.cache[0][0].dtype == jnp.bfloat16
    _, logps, n = sampler.decode_loop(half, np.ones(SLOTS), np.arange(SLOTS), np.full(SLOTS, K))
    assert n.tolist() == [K] * SLOTS and np.all(np.isfinite(logps)) and np.all(logps <= 0)
