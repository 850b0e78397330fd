"""Delta policy versions (core/contracts/store_delta.py) on a real store with real Orbax:
they rebuild exactly the bytes a full version holds, corruption of any kind is refused as
ChecksumError, gc keeps their bases, and readers apply them to the base they hold."""

import itertools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import zstandard
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.contracts import store_delta
from core.contracts.store import METADATA, ChecksumError, PolicyStore, StoreError, as_stored
from core.contracts.store_delta import DATA_FILE, DeltaMismatch, should_be_full
from core.policy.formats.hf_weights import load_checkpoint
from core.policy.model.config import model_config
from core.policy.model.lora import LoraConfig
from core.policy.model.transformer import abstract_model, abstract_tree, split_params
from core.policy.versions import VersionLoader, base_params
from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint
from rollout.policy_poller import PolicyHandle
from trainer.learning.persistence.publisher import PolicyPublisher
from trainer.learning.step.learner import Learner, LearnerConfig

BF16 = np.dtype(ml_dtypes.bfloat16)
_dirs = itertools.count()


def _bits(tree) -> dict:
    """Each leaf's dtype, shape and raw bytes: equal bits, NaN payloads and -0.0 included."""
    return {p: (x.dtype, x.shape, np.asarray(x).tobytes()) for p, x in store_delta.leaf_items(tree)}


def _random_leaf(rng, shape, dtype) -> np.ndarray:
    """Any bit pattern (NaNs and infinities too), so the test sees bits, not values."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
    return rng.integers(0, np.iinfo(width).max, size=shape, dtype=width, endpoint=True).view(dtype)


def _changed(rng, x: np.ndarray, share: float) -> np.ndarray:
    """x with about `share` of its elements given other random bits."""
    mask = rng.random(x.shape) < share
    return np.where(mask, _random_leaf(rng, x.shape, x.dtype), x)


trees = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31),
        "shapes": st.lists(st.lists(st.integers(0, 9), max_size=3), min_size=1, max_size=4),
        "dtypes": st.lists(st.sampled_from(["float32", "bfloat16", "int32"]), min_size=4, max_size=4),
        "share": st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)),
    }
)


def _pair(spec) -> tuple[dict, dict]:
    """A random (base, new) tree pair: new differs from base in about `share` of its elements."""
    rng = np.random.default_rng(spec["seed"])
    base = {
        f"l{i}": {"w": _random_leaf(rng, tuple(shape), np.dtype(BF16 if dt == "bfloat16" else dt))}
        for i, (shape, dt) in enumerate(zip(spec["shapes"], spec["dtypes"]))
    }
    new = jax.tree.map(lambda x: _changed(rng, x, spec["share"]), base)
    return base, new


@settings(max_examples=60, deadline=None)
@given(spec=trees)
def test_a_delta_decodes_to_the_exact_bits(spec):
    base, new = _pair(spec)
    delta = store_delta.encode(new, base)
    assert _bits(store_delta.decode(delta.header(), b"".join(delta.parts), base)) == _bits(new)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31),
    shapes=st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=2), min_size=1, max_size=3),
    bf16_leaves=st.booleans(),
    publish_bf16=st.booleans(),
    share=st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)),
)
def test_publish_and_load_rebuild_the_bytes_a_full_version_holds(
    tmp_path, seed, shapes, bf16_leaves, publish_bf16, share
):
    rng = np.random.default_rng(seed)
    dtype = jnp.bfloat16 if publish_bf16 else None
    leaf_dtype = BF16 if bf16_leaves else np.float32
    base = {f"l{i}": rng.standard_normal(shape).astype(leaf_dtype) for i, shape in enumerate(map(tuple, shapes))}
    new = {k: np.where(rng.random(x.shape) < share, x + 1, x).astype(leaf_dtype) for k, x in base.items()}
    store = PolicyStore(str(tmp_path / f"store{next(_dirs)}"))
    store.publish(0, base, dtype=dtype)
    store.publish(1, new, dtype=dtype, delta_of=0)
    store.publish(2, new, dtype=dtype)  # the same params as a full version: the reference
    assert "delta_of" in store.read_metadata(1) and "delta_of" not in store.read_metadata(2)
    stored = store_delta.stored_target(store.read_metadata(2)["leaves"], new)
    full = store.load(2, stored)
    assert _bits(full) == _bits(as_stored(new, dtype))
    assert _bits(store.load(1, stored)) == _bits(full)  # rebuilt from the base read from the store
    target = abstract_tree(base)  # the reader's own dtypes: cast as a full version's load casts
    assert _bits(store.load(1, target)) == _bits(store.load(2, target))
    held = store.load(0, store_delta.stored_target(store.read_metadata(0)["leaves"], base))
    assert _bits(store.load_delta(1, held, 0)) == _bits(full)  # applied to a base in hand
    assert _bits(store.load_delta(1, jax.device_put(held), 0, target)) == _bits(store.load(2, target))


# ---- refused -------------------------------------------------------------------------------------


@pytest.fixture
def two(tmp_path):
    """A full version 0 and a delta 1 of it, and what 1 holds."""
    rng = np.random.default_rng(0)
    base = {"a": rng.standard_normal((64, 32)).astype(np.float32), "b": np.arange(50, dtype=np.int32)}
    new = {"a": _changed(rng, base["a"], 0.1), "b": base["b"] + 1}
    store = PolicyStore(str(tmp_path / "store"))
    store.publish(0, base)
    store.publish(1, new, delta_of=0)
    return store, base, new


def _both_refused(store, base, match, error=ChecksumError):
    with pytest.raises(error, match=match):
        store.load(1, abstract_tree(base))
    with pytest.raises(error, match=match):
        store.load_delta(1, base, 0)


def test_a_flipped_byte_in_the_delta_is_refused(two):
    store, base, new = two
    data = store.version_path(1) / DATA_FILE
    original = data.read_bytes()
    for at in (0, len(original) // 2, len(original) - 1):
        data.write_bytes(original[:at] + bytes([original[at] ^ 0x10]) + original[at + 1 :])
        _both_refused(store, base, f"checksum mismatch in {DATA_FILE}")
    data.write_bytes(original)
    assert _bits(store.load(1, abstract_tree(base))) == _bits(new)


def test_a_truncated_or_missing_delta_is_refused(two):
    store, base, _ = two
    data = store.version_path(1) / DATA_FILE
    os.truncate(data, os.path.getsize(data) - 7)
    _both_refused(store, base, f"checksum mismatch in {DATA_FILE}")
    data.unlink()
    _both_refused(store, base, f"missing file {DATA_FILE}")


def test_a_delta_whose_base_is_gone_is_refused(two):
    store, base, _ = two
    shutil.rmtree(store.version_path(0))
    with pytest.raises(ChecksumError, match="base version 0 is missing"):
        store.load(1, abstract_tree(base))


def _tamper(store, change) -> None:
    marker = store.version_path(1) / METADATA
    meta = json.loads(marker.read_text())
    change(meta)
    marker.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda m: m["delta"]["leaves"][0].update(sha256="0" * 64), DeltaMismatch, "does not reconstruct"),
        (lambda m: m["delta"]["leaves"][0].update(length=3), ChecksumError, "starts at|index says"),
        (lambda m: m["delta"]["leaves"][0].update(shape=[32, 64]), StoreError, "differ|is float32"),
        (lambda m: m["delta"]["leaves"][0].update(dtype="object"), ChecksumError, "malformed"),
        (lambda m: m["delta"]["leaves"][0].update(encoding="pickle"), ChecksumError, "malformed"),
        (lambda m: m["delta"].update(format=2), StoreError, "unknown delta format 2"),
        (lambda m: m["delta"].update(leaves=m["delta"]["leaves"][:1]), ChecksumError, "index says"),
        (lambda m: m.update(delta_of=5), ChecksumError, "base version 5 is missing"),
    ],
)
def test_a_tampered_index_is_refused(two, change, error, match):
    store, base, _ = two
    _tamper(store, change)
    with pytest.raises(error, match=match):
        store.load(1, abstract_tree(base))


def test_a_frame_claiming_more_bytes_than_its_leaf_is_refused_before_decompressing():
    base = {"w": np.zeros(10, np.float32)}
    delta = store_delta.encode({"w": np.ones(10, np.float32)}, base)
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 10**7)
    header = delta.header()
    header["leaves"][0].update(encoding="xor", length=len(bomb))
    with pytest.raises(ChecksumError, match="decompresses to 10000000 bytes, not 40"):
        store_delta.decode(header, bomb, base)


def test_applying_a_delta_to_another_base_is_refused(two):
    store, base, _ = two
    with pytest.raises(StoreError, match="not a delta of version 3"):
        store.load_delta(1, base, 3)
    wrong = {**base, "a": base["a"] + 1}  # the right shapes, other bits
    with pytest.raises(DeltaMismatch):
        store.load_delta(1, wrong, 0)


# ---- writer rules and gc ----------------------------------------------------------------------------


def test_no_chains_and_the_base_must_fit(two):
    store, _, new = two
    with pytest.raises(ValueError, match="version 1 is itself a delta"):
        store.publish(2, new, delta_of=1)
    with pytest.raises(ValueError, match="stored in None, this one would be bfloat16"):
        store.publish(2, new, delta_of=0, dtype=jnp.bfloat16)
    with pytest.raises(StoreError, match="version 7 is missing"):
        store.publish(8, new, delta_of=7)
    assert store.latest_version() == 1 and store.versions() == [0, 1]


def test_gc_keeps_the_base_of_every_kept_delta(tmp_path):
    store = PolicyStore(str(tmp_path / "store"))
    p = lambda v: {"w": np.full((8, 8), v, np.float32)}
    store.publish(0, p(0))
    for v in range(1, 5):
        store.publish(v, p(v), delta_of=0)
    assert store.gc(keep=2) == [1, 2]
    assert store.versions() == [0, 3, 4]
    assert _bits(store.load(4, abstract_tree(p(0)))) == _bits(p(4))
    store.publish(5, p(5))
    store.publish(6, p(6), delta_of=5)
    assert store.gc(keep=2) == [0, 3, 4]
    assert store.versions() == [5, 6]


def test_bytes_are_recorded_for_full_and_delta_versions(two):
    store, _, _ = two
    for v in (0, 1):
        meta = store.read_metadata(v)
        assert meta["bytes"] == sum(e["bytes"] for e in meta["manifest"].values()) > 0
    assert store.read_metadata(1)["bytes"] < store.read_metadata(0)["bytes"]


def test_should_be_full():
    assert should_be_full(3, 0, every_k=0)  # deltas off
    assert should_be_full(3, None, every_k=4)  # nothing to delta against
    assert [should_be_full(v, 0, every_k=4) for v in range(1, 6)] == [False, False, False, True, True]
    assert all(should_be_full(v, v - 1, every_k=1) for v in range(1, 4))  # 1: every version full
    assert not should_be_full(2, 0, 4, delta_bytes=50, full_bytes=100, max_share=0.5)
    assert should_be_full(2, 0, 4, delta_bytes=51, full_bytes=100, max_share=0.5)


# ---- the publisher and the readers ----------------------------------------------------------------


def _perturb(learner, share: float, seed: int) -> None:
    rng = np.random.default_rng(seed)

    def step(x):
        mask = rng.random(x.shape) < share
        return x + jnp.asarray(np.where(mask, 0.01, 0.0).astype(np.asarray(x).dtype))

    learner.params = jax.tree.map(step, learner.params)


@pytest.mark.parametrize("dtype", [None, jnp.bfloat16])
def test_the_publisher_writes_deltas_and_a_loader_applies_them_to_the_base_it_holds(tmp_path, dtype):
    tiny = model_config("tiny")
    learner = Learner(tiny, LearnerConfig(batch_records=1))
    store = PolicyStore(str(tmp_path / "store"))
    publisher = PolicyPublisher(store, learner, None, version=-1, dtype=dtype, delta_every=3, keep_versions=2)
    expected = {}
    for v, share in enumerate([0, 0.03, 0.03, 0.03, 0.03, 1.0]):
        if share:
            _perturb(learner, share, v)
        publisher.publish()
        expected[v] = as_stored(learner.params_dict(), dtype)
    kinds = [w["kind"] for w in publisher.writes]
    # Every 3rd version full; v5 would be a delta, but every element moved: larger than half a full one.
    assert kinds == ["full", "delta", "delta", "full", "delta", "full"], publisher.writes
    assert all(w["bytes"] == store.read_metadata(w["version"])["bytes"] for w in publisher.writes[3:])
    assert max(w["bytes"] for w in publisher.writes if w["kind"] == "delta") < 0.2 * publisher.writes[0]["bytes"]
    assert store.versions() == [3, 4, 5]  # gc kept 3, the base of 4

    template = split_params(abstract_model(tiny))[1]
    target = abstract_tree(learner.params_dict())
    as_served = lambda v: jax.tree.map(lambda x, t: np.asarray(x).astype(t.dtype), expected[v], target)
    loader = VersionLoader(store, tiny, template)
    for v, kind, base_read in [(3, "full", False), (4, "delta", False), (5, "full", False)]:
        state, _ = loader.load(v)
        assert loader.last_load.items() >= {"version": v, "kind": kind, "base_read": base_read}.items()
        assert _bits(nnx.to_pure_dict(state)) == _bits(as_served(v)) == _bits(store.load(v, target))
    full_bytes = store.read_metadata(3)["bytes"]
    fresh = VersionLoader(store, tiny, template)  # holds nothing: reads the base once, then keeps it
    fresh.load(4)
    assert fresh.last_load["base_read"] and fresh.last_load["bytes"] > full_bytes
    fresh.load(4)
    assert not fresh.last_load["base_read"] and fresh.last_load["bytes"] < 0.2 * full_bytes
    assert fresh.last_load["seconds"] > 0


def test_a_rollout_worker_counts_what_each_reload_read_full_against_delta(tmp_path):
    tiny = model_config("tiny")
    learner = Learner(tiny, LearnerConfig(batch_records=1))
    store = PolicyStore(str(tmp_path / "store"))
    publisher = PolicyPublisher(store, learner, None, version=-1, dtype=jnp.bfloat16, delta_every=3)
    handle = PolicyHandle(store, split_params(abstract_model(tiny))[1])
    for v in range(3):
        if v:
            _perturb(learner, 0.03, v)
        publisher.publish()
        assert handle.maybe_reload(force=True) and handle.version == v
    totals = handle.reload_totals  # what the worker's telemetry row reports as policy_reload_*
    assert (totals["full_n"], totals["delta_n"]) == (1, 2), totals
    assert totals["full_bytes"] == store.read_metadata(0)["bytes"]
    assert totals["delta_bytes"] == sum(store.read_metadata(v)["bytes"] for v in (1, 2))
    assert totals["delta_bytes"] < 0.2 * totals["full_bytes"] and totals["full_s"] > 0 and totals["delta_s"] > 0
    # The loading thread decodes a delta itself: it spent CPU, and no more than the wall time.
    assert 0 < totals["delta_cpu_s"] <= totals["delta_s"] + 0.01, totals


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen2", "qwen2")


def test_adapter_versions_take_deltas_too(tmp_path, qwen2):
    cfg, model = load_checkpoint(qwen2)
    lora = LoraConfig(rank=4)
    learner = Learner(cfg, LearnerConfig(batch_records=1, lora=lora), model=model, tokenizer_source=str(qwen2))
    store = PolicyStore(str(tmp_path / "store"))
    publisher = PolicyPublisher(store, learner, None, version=-1, delta_every=4)
    loader = VersionLoader(store, cfg, split_params(abstract_model(cfg))[1], base_params(str(qwen2)))
    for v in range(3):
        _perturb(learner, 0.03, v)
        publisher.publish()
        state, meta = loader.load(v)
        assert meta["metadata"]["lora"]["rank"] == 4
        assert loader.last_load["kind"] == ("full" if v == 0 else "delta") and not loader.last_load["base_read"]
        got, want = nnx.to_pure_dict(state), learner.full_params_dict()
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert [w["kind"] for w in publisher.writes] == ["full", "delta", "delta"]
