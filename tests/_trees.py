"""Pytree helpers shared by the policy-store and checkpoint tests."""

import jax
import jax.numpy as jnp
import numpy as np

from core.policy.model.transformer import abstract_tree


def params_for(v: int):
    """Distinct values per version, mixed jax/numpy leaves and dtypes."""
    return {
        "dense": {"kernel": jnp.full((4, 3), float(v), jnp.float32), "bias": jnp.arange(3, dtype=jnp.float32) + v},
        "embed": np.full((5, 2), v, np.int32),
    }


abstract = abstract_tree


def assert_tree_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
