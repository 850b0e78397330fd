"""The flash kernel path (Pallas splash attention, run by its interpreter off a TPU) gives
the dense segment-causal attention's hidden states and gradients on packed rows: several
segments and padding per row, grouped-query heads, a segment-length band, and a sliding
window layer beside a full one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from core.policy.model.config import FULL, SLIDING, ModelConfig
from core.policy.model.transformer import init_model

T = 256  # two of the kernel's 128-token blocks: a masked-out block is skipped, a partial one is not
UNIFORM = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=128, max_seq_len=T, vocab_size=300)
MIXED = ModelConfig(
    d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, mlp_dim=128, max_seq_len=T, vocab_size=300,
    layer_types=(SLIDING, FULL), sliding_window=24,
)  # fmt: skip


def _packed(rows: int = 2):
    """Rows of segments of 100, 90 and 50 tokens, then 16 of padding (segment 0)."""
    rng = np.random.default_rng(0)
    seg, pos = np.zeros((rows, T), np.int32), np.zeros((rows, T), np.int32)
    start = 0
    for i, n in enumerate((100, 90, 50)):
        seg[:, start : start + n], pos[:, start : start + n] = i + 1, np.arange(n)
        start += n
    tokens = rng.integers(0, 300, (rows, T)).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(seg), jnp.asarray(pos)


@pytest.mark.parametrize("cfg,span", [(UNIFORM, None), (UNIFORM, 100), (MIXED, 100)], ids=["causal", "band", "window"])
def test_splash_attention_equals_the_dense_path(cfg, span):
    tokens, seg, pos = _packed()
    graphdef, params = nnx.split(init_model(cfg, 1))
    real = (seg > 0)[..., None]

    def loss(p, attention):
        h = nnx.merge(graphdef, p).hidden(tokens, seg, pos, span=span, attention=attention)
        return jnp.sum(jnp.where(real, h, 0.0) ** 2), h

    (l_xla, h_xla), g_xla = jax.value_and_grad(loss, has_aux=True)(params, "xla")
    (l_fl, h_fl), g_fl = jax.value_and_grad(loss, has_aux=True)(params, "splash")
    np.testing.assert_allclose(np.where(real, h_fl, 0), np.where(real, h_xla, 0), atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(float(l_fl), float(l_xla), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_fl), jax.tree.leaves(g_xla), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-3, rtol=2e-3)
