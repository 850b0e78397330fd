"""Banded attention (core/policy/model/banded_attention.py): the dense segment-causal result on
every non-padding token whenever no segment is longer than the span, in the attention
itself, in the model's logits and gradients, and in the learner's step; and a record with
a longer segment is refused before it is trained."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts import pubsub_io
from core.contracts.records import PackedRecord, TrajectoryInfo, empty_record_arrays, encode
from core.policy.model import transformer as model_module
from core.policy.model.banded_attention import Band, band_block, banded_attention
from core.policy.model.config import FULL, SLIDING, ModelConfig
from core.policy.model.transformer import init_model, segment_causal_mask, split_params, token_logprobs, window_mask
from trainer.learning.data.consumer import RecordConsumer
from trainer.learning.step.learner import Learner, LearnerConfig

SLIDING_CFG = ModelConfig(  # Gemma-like: a sliding layer then a full one, its own score divisor
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_size=16,
    qk_norm=True,
    query_pre_attn_scalar=24.0,
    layer_types=(SLIDING, FULL),
    sliding_window=8,
)


def _pack(rng, rows: int, t: int, span: int):
    """segment_ids, positions [rows, t]: segments of 1..span tokens, with padding runs
    between or after them (validate() allows both)."""
    seg, pos = np.zeros((rows, t), np.int32), np.zeros((rows, t), np.int32)
    for r in range(rows):
        col, k = 0, 0
        while col < t:
            n = int(rng.integers(1, min(span, t - col) + 1))
            if rng.random() < 0.2:
                col += n  # a padding run: segment 0, positions 0
                continue
            k += 1
            seg[r, col : col + n], pos[r, col : col + n] = k, np.arange(n)
            col += n
    return seg, pos


def _dense(q, k, v, seg, pos, window, divisor):
    """The model's dense path: repeated KV heads, the [B, 1, T, T] mask, softmax."""
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    mask = segment_causal_mask(seg)
    if window:
        mask = mask & window_mask(pos, window)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / divisor
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


# (t, block, span, window, (n_heads, n_kv_heads)): a span of 1, spans that are and are not a
# multiple of the block, a span past the row, rows that are not whole blocks, windows
# shorter and longer than the span, plain, grouped and multi-query heads. A fixed list, so
# each compiles once and the examples vary the packing and the values.
CASES = [
    (64, 16, 16, 0, (4, 4)),
    (64, 8, 1, 0, (4, 2)),
    (100, 16, 37, 5, (4, 2)),
    (100, 32, 64, 0, (6, 1)),
    (128, 16, 48, 16, (4, 2)),
    (128, 8, 80, 100, (4, 1)),
    (96, 32, 200, 3, (2, 2)),
    (48, 16, 17, 1, (4, 2)),
]


@functools.cache
def _both(span: int, block: int, window: int):
    def run(q, k, v, seg, pos, divisor):
        return banded_attention(q, k, v, Band(seg, pos, span, block), window, divisor), _dense(
            q, k, v, seg, pos, window, divisor
        )

    return jax.jit(run, static_argnums=5)


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(CASES), seed=st.integers(0, 2**16), divisor=st.sampled_from([1.0, 2.0, 2.8284271]))
def test_banded_equals_dense_on_every_real_token(case, seed, divisor):
    t, block, span, window, (hq, hkv) = case
    rng = np.random.default_rng(seed)
    seg, pos = _pack(rng, 2, t, min(span, t))
    q = jnp.asarray(rng.normal(size=(2, t, hq, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, t, hkv, 8)), jnp.float32) for _ in range(2))
    got, want = _both(span, block, window)(q, k, v, seg, pos, divisor)
    assert got.shape == want.shape and bool(jnp.isfinite(got).all())  # padding included: no NaN
    real = seg > 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=1e-5)


def test_block_choice_keeps_short_rows_dense():
    assert band_block(256, 256) is None  # one trajectory per row: nothing to skip
    assert band_block(512, 256) == 64  # keys 320 of 512 per query block
    assert band_block(1024, 256) == 64
    assert band_block(320, 256) is None  # 5 blocks of 64 keys: the whole row
    assert band_block(128, 32, 16) == 16
    assert band_block(64, 32, 32) is None  # two blocks of keys: the whole row
    with pytest.raises(ValueError, match="span"):
        band_block(128, 0)


def _model_inputs(seed: int, rows: int = 3, t: int = 128, span: int = 32):
    rng = np.random.default_rng(seed)
    seg, pos = _pack(rng, rows, t, span)
    tokens = rng.integers(0, 256, (rows, t)).astype(np.int32)
    return tokens, seg, pos


@pytest.mark.parametrize("cfg", [ModelConfig(), SLIDING_CFG], ids=["tiny", "sliding"])
def test_model_logits_and_grads_match_dense(cfg):
    graphdef, params = split_params(init_model(cfg, seed=3))
    tokens, seg, pos = _model_inputs(1)
    real = seg > 0
    assert band_block(tokens.shape[1], 32, 16) is not None  # the banded path is the one exercised

    def loss(p, span):
        logits = nnx.merge(graphdef, p)(tokens, seg, pos, span=span, block=16 if span else None)
        logp = token_logprobs(logits, tokens) * (real & (pos > 0))
        return -logp.sum(), logits

    both = jax.jit(lambda p: [jax.value_and_grad(loss, has_aux=True)(p, span) for span in (None, 32)])
    ((l_dense, dense), g_dense), ((l_band, band), g_band) = both(params)
    np.testing.assert_allclose(np.asarray(band)[real], np.asarray(dense)[real], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(float(l_band), float(l_dense), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_band), jax.tree.leaves(g_dense)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_span_on_short_rows_is_the_dense_path_exactly():
    """A row no longer than the band traces to the very same program as without a span."""
    graphdef, params = split_params(init_model(ModelConfig(), seed=0))
    tokens, seg, pos = _model_inputs(2, t=64, span=64)

    def program(span):
        return str(jax.make_jaxpr(lambda p: nnx.merge(graphdef, p)(tokens, seg, pos, span=span))(params))

    assert program(64) == program(None) != program(16)


def _record(seed: int, rows: int, t: int, span: int, record_id: str = "rec") -> PackedRecord:
    """A valid record whose segments are 6..span tokens (a 3-token prompt, then generated)."""
    rng = np.random.default_rng(seed)
    a, infos = empty_record_arrays(rows, t), []
    for r in range(rows):
        col, k = 0, 0
        while t - col >= 6:
            n = int(rng.integers(6, min(span, t - col) + 1))
            k, sl = k + 1, slice(col, col + n)
            gen = np.arange(n) >= 3
            a["tokens"][r, sl] = rng.integers(0, 256, n)
            a["segment_ids"][r, sl], a["positions"][r, sl], a["loss_mask"][r, sl] = k, np.arange(n), gen
            a["behaviour_logprobs"][r, sl] = np.where(gen, rng.uniform(-7, -4, n), 0)
            a["advantages"][r, sl] = np.where(gen, rng.normal(), 0)
            a["policy_versions"][r, sl] = np.where(gen, 0, -1)
            infos.append(TrajectoryInfo(f"{record_id}-{r}-{k}", r, k, n, 0.0, "finished"))
            col += n
    return PackedRecord(record_id=record_id, trajectories=infos, **a).validate()


def test_learner_step_with_span_matches_dense_and_refuses_longer_segments(monkeypatch):
    calls = []
    monkeypatch.setattr(model_module, "banded_attention", lambda *a, **k: calls.append(1) or banded_attention(*a, **k))
    cfg, lcfg = ModelConfig(max_seq_len=64), LearnerConfig(batch_records=1, learning_rate=1e-2)
    dense, banded = Learner(cfg, lcfg), Learner(cfg, lcfg, span=40)
    rec = _record(0, 2, 128, 40)
    m_dense = dense.train_step([rec])
    assert not calls
    m_band = banded.train_step([rec])
    assert calls  # traced through the banded path (once per layer)
    for key in ("losses/policy_loss", "losses/grad_norm", "losses/entropy"):
        assert m_band[key] == pytest.approx(m_dense[key], rel=1e-5, abs=1e-7), key
    with pytest.raises(ValueError, match="longer than the learner's span 40"):
        banded.train_step([_record(1, 2, 128, 64)])


def test_consumer_dead_letters_a_segment_longer_than_the_layout(monkeypatch):
    """Like a record of an undeclared shape: rejected with the reason, published to the
    dead-letter topic and acked; a record within the layout is accepted."""
    short, long_ = _record(0, 2, 128, 32, "short"), _record(1, 2, 128, 128, "long")
    assert int(long_.positions.max()) + 1 > 32
    messages = [
        types.SimpleNamespace(
            ack_id=f"ack-{r.record_id}",
            message=types.SimpleNamespace(data=encode(r), attributes={}, message_id=r.record_id),
        )
        for r in (short, long_)
    ]
    acked, dead = [], []
    done = types.SimpleNamespace(result=lambda timeout=None: "id")
    monkeypatch.setattr(pubsub_io, "subscriber_client", lambda: object())
    monkeypatch.setattr(pubsub_io, "publisher_client", lambda: object())
    monkeypatch.setattr(pubsub_io, "pull", lambda *a, **k: messages)
    monkeypatch.setattr(pubsub_io, "ack", lambda sub, subscription, ids: acked.extend(ids))
    monkeypatch.setattr(pubsub_io, "publish", lambda pub, topic, data, **attrs: dead.append(attrs) or done)
    consumer = RecordConsumer("sub", {(2, 128)}, "dead", max_trajectory_len=32)
    got = consumer.poll()
    assert [r.record_id for r in got] == ["short"]
    assert consumer.rejected == 1 and acked == ["ack-long"]
    assert "longer than the layout's max_trajectory_len 32" in dead[0]["error"]
