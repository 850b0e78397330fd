"""The params trees a policy version holds, on their way in and out of the store: the
dtype cast publish applies, and the checks and casts load applies against a target.
(Orbax honours a jax target's dtypes and shapes, but restores numpy leaves as stored.)"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from core.contracts.store_errors import StoreError


def _is_float(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _cast_floats(tree: Any, dtype) -> Any:
    """Floating leaves to dtype (bf16 halves what workers download); others unchanged."""
    return jax.tree.map(lambda x: x.astype(dtype) if _is_float(x) and x.dtype != dtype else x, tree)


def as_stored(params: Any, dtype=None) -> Any:
    """The params as a version stores them: host numpy arrays, floating leaves in `dtype`
    (the cast publish applies). A delta is encoded against exactly these bytes."""
    return jax.tree.map(np.asarray, _cast_floats(params, dtype) if dtype is not None else params)


def as_target(params: Any, target: Any, what: str = "params") -> Any:
    """Host params (stored dtypes) as load returns them for `target`: cast to its dtypes,
    checked (StoreError), and on the device for jax targets (Orbax does that itself)."""
    params = _to_target_dtypes(params, target)
    _check_matches(params, target, what)
    return jax.tree.map(_placed_like, params, target)


def _placed_like(x: np.ndarray, want: Any):
    """A host array where `want` has it: on its sharding (jax targets), else on the host."""
    if isinstance(want, jax.Array):
        return jax.device_put(x, want.sharding)
    if isinstance(want, jax.ShapeDtypeStruct):
        return jax.device_put(x, want.sharding) if want.sharding is not None else jnp.asarray(x)
    return x


def _to_target_dtypes(params: Any, target: Any) -> Any:
    """Orbax honours the target dtype for jax targets, but restores numpy targets at the
    stored dtype: cast float leaves (e.g. a bf16-published version) to what the target wants."""

    def cast(got, want):
        return got.astype(want.dtype) if _is_float(got) and _is_float(want) and got.dtype != want.dtype else got

    try:
        return jax.tree.map(cast, params, target)
    except ValueError:
        return params  # structure differs: _check_matches reports it


def _check_matches(params: Any, target: Any, what: str) -> None:
    """Orbax checks shapes for jax arrays but restores numpy leaves at their stored
    shape, so verify the result against the target ourselves."""
    if jax.tree.structure(params) != jax.tree.structure(target):
        raise StoreError(f"cannot restore {what}: structure differs from the target")
    for (key, got), want in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(target)):
        if hasattr(want, "shape") and (got.shape, got.dtype) != (tuple(want.shape), want.dtype):
            raise StoreError(
                f"cannot restore {what}: {jax.tree_util.keystr(key)} is {got.dtype}{list(got.shape)},"
                f" target wants {want.dtype}{list(want.shape)}"
            )
