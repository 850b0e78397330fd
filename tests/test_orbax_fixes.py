"""Two tensorstore leaks under Orbax, each still there upstream, and each worked around:
the metrics call (core/contracts/orbax_fixes.py) and `Spec.to_json`, which Orbax calls when
a restore target has no sharding (core/policy/versions.py gives every target one). With
both, saving and loading policy versions over and over leaves nothing behind."""

import gc

import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
from flax import nnx

from core.contracts import orbax_fixes
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import abstract_model, init_model, split_params
from core.policy.versions import VersionLoader

pytestmark = pytest.mark.usefixtures("walk_only_new_objects")  # the counts walk only what a test makes


def _live(shaped) -> int:
    """Live objects of one leak's own shape (other threads of a shared test process make
    objects too: counting them all would count theirs)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if shaped(o))


def _metrics_list(o) -> bool:  # what the metrics call leaks: [{'value': N}]
    return type(o) is list and len(o) == 1 and type(o[0]) is dict and set(o[0]) == {"value"}


def _transform(o) -> bool:  # what Spec.to_json leaks, among others: an index transform's JSON
    return type(o) is dict and set(o) == {"input_exclusive_max", "input_inclusive_min"}


def test_tensorstores_metrics_call_still_leaks():
    """If this fails, tensorstore fixed it: the workaround can go."""
    per_call = len(ts.experimental_collect_matching_metrics("/tensorstore/"))
    before = _live(_metrics_list)
    for _ in range(500):
        ts.experimental_collect_matching_metrics("/tensorstore/")
    # A list per metric, never freed (counted: those holding one {'value': N}; a process with
    # more kinds of metric leaks other shapes too).
    assert per_call >= 1 and _live(_metrics_list) - before >= 500


def test_publishing_and_loading_versions_leaves_nothing_behind(tmp_path):
    assert orbax_fixes.apply()  # the store applies it on import; idempotent
    store = PolicyStore(str(tmp_path / "store"))
    params = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "b": jnp.ones(4)}  # jax arrays: as a policy
    for v in range(2):
        store.publish(v, params)
        store.load(v, params)
    before = _live(_metrics_list)
    for v in range(2, 22):
        store.publish(v, params)
        got = store.load(v, params)
    del got
    assert _live(_metrics_list) == before  # unpatched: about 720 more here (4 calls a round trip)


def test_tensorstores_spec_to_json_still_leaks(tmp_path):
    """If this fails, tensorstore fixed it: versions.py's `_placed` is then only a speed-up."""
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path)}}
    t = ts.open({**spec, "metadata": {"shape": [8], "chunks": [8], "dtype": "<f4"}}, create=True).result()
    t.write(np.ones(8, np.float32)).result()
    before = _live(_transform)
    for _ in range(100):
        t.spec().to_json()
    assert _live(_transform) - before >= 100


def test_loading_versions_into_bare_shapes_leaves_nothing_behind(tmp_path):
    """The rollout workers and the evaluator load into shapes with no sharding (the sampler's
    abstract params). Unplaced, Orbax read each array's stored metadata, through the leak
    above: 10 loads of the tiny model's 18 arrays left 1,751 lists and dicts (2026-12-06)."""
    cfg, store = ModelConfig(), PolicyStore(str(tmp_path / "store"))
    params = nnx.to_pure_dict(split_params(init_model(cfg))[1])
    for v in range(12):
        store.publish(v, params)
    loader = VersionLoader(store, cfg, split_params(abstract_model(cfg))[1])
    for v in range(2):
        loader.load(v)
    before = _live(_transform)
    for v in range(2, 12):
        state, _ = loader.load(v)
    assert _live(_transform) == before  # unplaced: one per array per load, 180 here
    assert np.array_equal(nnx.to_pure_dict(state)["embed"]["embedding"], params["embed"]["embedding"])
