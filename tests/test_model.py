"""The policy model: packing invariance, KV-cached decoding, no recompiles."""

import jax
import numpy as np
import pytest
from flax import nnx

from core.policy.model.config import ModelConfig, check_vocab
from core.policy.model.transformer import init_model, split_params, token_logprobs
from core.policy.sampling.sampler import Sampler
from core.policy.text import tokenizer

CFG = ModelConfig(max_seq_len=64)


@pytest.fixture(scope="module")
def model():
    graphdef, params = split_params(init_model(CFG, seed=1))
    fwd = jax.jit(lambda p, t, s, q: token_logprobs(nnx.merge(graphdef, p)(t, s, q), t))
    return params, fwd


def _row(segments, length=48):
    tok, seg, pos = (np.zeros((1, length), np.int32) for _ in range(3))
    start = 0
    for k, s in enumerate(segments, start=1):
        tok[0, start : start + len(s)], seg[0, start : start + len(s)] = s, k
        pos[0, start : start + len(s)] = np.arange(len(s))
        start += len(s)
    return tok, seg, pos


def test_trajectory_logprobs_same_alone_or_packed(model):
    params, fwd = model
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(0, 256, n) for n in (11, 9, 13))
    packed = np.asarray(fwd(params, *_row([a, b, c])))[0]
    for offset, seq in ((0, a), (11, b), (20, c)):
        alone = np.asarray(fwd(params, *_row([seq])))[0]
        # token 0 of a segment has no in-segment prefix: only t >= 1 is defined
        np.testing.assert_allclose(packed[offset + 1 : offset + len(seq)], alone[1 : len(seq)], atol=1e-5)


def test_padding_never_attended(model):
    """Changing padding tokens must not change any real token's log-prob."""
    params, fwd = model
    tok, seg, pos = _row([np.arange(10) + 40])
    base = np.asarray(fwd(params, tok, seg, pos))[0, :10]
    tok2 = tok.copy()
    tok2[0, 10:] = 7
    np.testing.assert_allclose(np.asarray(fwd(params, tok2, seg, pos))[0, :10], base, atol=1e-6)


def test_kv_cached_sampling_matches_full_forward(model):
    params, fwd = model
    sampler = Sampler(CFG, slots=3, length=48, seed=5)
    prompt = [tokenizer.BOS] + tokenizer.encode("Compute 2+3. ")
    seqs, logps = [list(prompt) for _ in range(3)], [[0.0] * len(prompt) for _ in range(3)]
    fed = 0
    while len(seqs[0]) < 40:
        nxt, lp = sampler.step(params, np.array([s[fed] for s in seqs]), np.full(3, fed))
        fed += 1
        if fed == len(seqs[0]):
            for b in range(3):
                seqs[b].append(int(nxt[b]))
                logps[b].append(float(lp[b]))
    tok = np.zeros((3, 48), np.int32)
    tok[:, :40] = seqs
    seg = np.zeros_like(tok)
    seg[:, :40] = 1
    pos = np.tile(np.arange(48), (3, 1)) * seg
    full = np.asarray(fwd(params, tok, seg, pos))
    np.testing.assert_allclose(full[:, len(prompt) : 40], np.array(logps)[:, len(prompt) :], atol=1e-4)
    assert sampler.compiled_variants() == 1


def test_sampler_refuses_length_beyond_model():
    with pytest.raises(ValueError, match="max_seq_len"):
        Sampler(CFG, slots=2, length=CFG.max_seq_len + 1)


def test_model_config_validates():
    with pytest.raises(ValueError):
        ModelConfig(d_model=60, n_heads=8)
    with pytest.raises(ValueError):  # the byte tokenizer's ids reach past a 100-row embedding
        check_vocab(ModelConfig(vocab_size=100), tokenizer.VOCAB_SIZE)


def test_tokenizer_round_trip_and_specials():
    text = "Compute 3*4. <call calc>3*4</call> é"
    ids = tokenizer.encode(text)
    assert max(ids) < 256 and tokenizer.decode(ids) == text
    assert tokenizer.decode(ids + [tokenizer.EOS, tokenizer.BOS]) == text
    assert tokenizer.decode([0xFF, 0xFE]) == "\ufffd\ufffd"  # invalid UTF-8 never raises
