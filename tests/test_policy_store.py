"""Policy store on real disk with real Orbax: readers only ever see whole, intact versions."""

import hashlib
import json
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _trees import abstract, assert_tree_equal, params_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.contracts.store import LATEST, METADATA, ChecksumError, PolicyStore, StoreError


@pytest.fixture
def store(tmp_path):
    return PolicyStore(str(tmp_path / "store"))


def test_empty_store(store):
    assert store.latest_version() is None
    assert store.load_latest(abstract(params_for(0))) is None
    assert store.versions() == []


def test_publish_and_load_latest(store):
    store.publish(0, params_for(0), {"step": 0})
    store.publish(1, params_for(1), {"step": 10})
    assert store.latest_version() == 1
    version, params = store.load_latest(abstract(params_for(0)))
    assert version == 1
    assert_tree_equal(params, params_for(1))
    assert_tree_equal(store.load(0, abstract(params_for(0))), params_for(0))
    assert store.read_metadata(1)["metadata"] == {"step": 10}
    pointer = json.loads((store.root / LATEST).read_text())
    assert pointer["version"] == 1 and pointer["path"].endswith("policies/00000001")


def test_load_follows_target_structure_and_dtype(store):
    store.publish(0, params_for(3))
    target = abstract(params_for(0))
    target["dense"]["kernel"] = jax.ShapeDtypeStruct((4, 3), jnp.bfloat16)
    out = store.load(0, target)
    assert out["dense"]["kernel"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out["dense"]["kernel"], np.float32), 3.0)
    with pytest.raises(StoreError, match="cannot restore"):  # wrong shape
        store.load(0, {**target, "embed": jax.ShapeDtypeStruct((6, 2), jnp.int32)})
    with pytest.raises(StoreError, match="cannot restore"):  # missing leaf
        store.load(0, {"dense": target["dense"]})


def test_a_relative_root_works_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Orbax itself refuses a relative checkpoint path
    store = PolicyStore("runs/store")
    store.publish(0, params_for(0), {"step": 0})
    monkeypatch.chdir("/")
    assert store.root == tmp_path / "runs" / "store"
    assert_tree_equal(store.load(0, abstract(params_for(0))), params_for(0))


def test_crash_between_data_and_pointer(store):
    store.publish(0, params_for(0))
    store.publish(1, params_for(1))
    store._write_version(2, params_for(2))  # the writer dies before _write_pointer
    assert store.latest_version() == 1
    version, params = store.load_latest(abstract(params_for(0)))
    assert version == 1
    assert_tree_equal(params, params_for(1))
    # On restart the learner republishes 2 over the orphan and readers then move to it.
    store.publish(2, params_for(20))
    version, params = store.load_latest(abstract(params_for(0)))
    assert version == 2
    assert_tree_equal(params, params_for(20))


# Orbax's async machinery reports its closed event loop after the failed save; harmless here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_failed_save_leaves_latest_alone_and_can_be_retried(store):
    store.publish(0, params_for(0))
    with pytest.raises(ValueError, match="dtype"):  # TensorStore cannot write object arrays: dies midway
        store.publish(1, {**params_for(1), "bad": np.array([object()])})
    assert store.latest_version() == 0 and store.versions() == [0]
    assert_tree_equal(store.load_latest(abstract(params_for(0)))[1], params_for(0))
    store.publish(1, params_for(1))  # the retry overwrites whatever the failed save left
    assert_tree_equal(store.load_latest(abstract(params_for(0)))[1], params_for(1))


def test_partial_directories_are_never_returned(store):
    store.publish(1, params_for(1))
    # An Orbax tmp dir left by a killed save, and a version dir with data but no commit marker.
    tmp = store.policies_dir / "00000002.orbax-checkpoint-tmp-1234567"
    tmp.mkdir(parents=True)
    (tmp / "junk").write_text("x")
    store._write_version(3, params_for(3))
    (store.version_path(3) / METADATA).unlink()
    (store.policies_dir / "00000004").mkdir()  # empty dir, as after a crash at mkdir
    assert store.versions() == [1]
    assert store.latest_version() == 1
    assert store.load_latest(abstract(params_for(0)))[0] == 1
    for v in (2, 3, 4, 5):
        with pytest.raises(StoreError, match="missing or incomplete"):
            store.load(v, abstract(params_for(0)))
    # Even if LATEST were pointed at an incomplete version, load refuses it.
    store._write_pointer(3)
    with pytest.raises(StoreError, match="missing or incomplete"):
        store.load_latest(abstract(params_for(0)))


def test_non_increasing_version_raises(store):
    store.publish(5, params_for(5))
    for v in (5, 4, 0):
        with pytest.raises(ValueError, match="greater than LATEST"):
            store.publish(v, params_for(v))
    with pytest.raises(ValueError, match="non-negative int"):
        store.publish(-1, params_for(0))
    assert store.latest_version() == 5
    assert store.versions() == [5]  # the refused publishes wrote nothing


def test_gc_keeps_latest_and_newest(store):
    for v in range(5):
        store.publish(v, params_for(v))
    store._write_version(6, params_for(6))  # in flight: newer than LATEST, must survive
    stale_tmp = store.policies_dir / "00000001.orbax-checkpoint-tmp-99"
    stale_tmp.mkdir()
    live_tmp = store.policies_dir / "00000007.orbax-checkpoint-tmp"  # a save in progress
    live_tmp.mkdir()
    deleted = store.gc(keep=2)
    assert deleted == [0, 1, 2]
    assert store.versions() == [3, 4, 6]
    assert not stale_tmp.exists() and live_tmp.exists()
    assert_tree_equal(store.load_latest(abstract(params_for(0)))[1], params_for(4))
    assert store.gc(keep=1) == [3]
    assert store.versions() == [4, 6]
    with pytest.raises(ValueError):
        store.gc(keep=0)


@pytest.mark.parametrize(
    "content",
    ["", "{not json", '{"path": "x"}', '{"version": "3"}', '{"version": -2}', "[1]", '{"version": "../../etc"}'],
)
def test_corrupt_latest_raises_store_error(store, content):
    store.publish(0, params_for(0))
    (store.root / LATEST).write_text(content)
    with pytest.raises(StoreError, match="corrupt"):
        store.latest_version()
    with pytest.raises(StoreError):
        store.load_latest(abstract(params_for(0)))


def test_a_hostile_pointer_path_cannot_lead_outside_the_store(store, tmp_path):
    """LATEST's "path" is for people: readers derive the directory from the version number
    (an int, formatted), so a pointer naming another directory loads from the store anyway."""
    store.publish(0, params_for(0))
    elsewhere = PolicyStore(str(tmp_path / "elsewhere"))
    elsewhere.publish(1, params_for(1))
    pointer = json.loads((store.root / LATEST).read_text())
    pointer["path"] = os.fspath(elsewhere.version_path(1))
    (store.root / LATEST).write_text(json.dumps(pointer))
    version, params = store.load_latest(abstract(params_for(0)))
    assert version == 0
    assert_tree_equal(params, params_for(0))


def test_pointer_write_leaves_no_temp_files(store):
    store.publish(0, params_for(0))
    store.publish(1, params_for(1))
    assert sorted(os.listdir(store.root)) == [LATEST, "policies"]


def test_bf16_publish_restores_into_target_dtype(store):
    params = params_for(2)
    params["dense"]["kernel"] = jnp.full((4, 3), 1 / 3, jnp.float32)  # not representable in bf16
    store.publish(0, params, {"step": 1}, dtype=jnp.bfloat16)
    meta = store.read_metadata(0)
    assert meta["dtype"] == "bfloat16" and meta["metadata"] == {"step": 1}
    rounded = np.asarray(params["dense"]["kernel"].astype(jnp.bfloat16).astype(jnp.float32))
    for target in (abstract(params), jax.tree.map(np.asarray, params)):  # jax and numpy targets
        out = store.load(0, target)
        assert_tree_equal(out["embed"], params["embed"])  # ints are never cast
        assert out["dense"]["kernel"].dtype == np.float32
        np.testing.assert_array_equal(np.asarray(out["dense"]["kernel"]), rounded)
    assert store.read_metadata(0)["dtype"] == "bfloat16"


def test_bf16_halves_what_workers_download(store):
    def du(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)

    big = {"w": jax.random.normal(jax.random.key(0), (256, 256), jnp.float32)}
    store.publish(0, big)
    store.publish(1, big, dtype=jnp.bfloat16)
    f32, bf16 = du(store.version_path(0)), du(store.version_path(1))
    assert bf16 < 0.6 * f32, (f32, bf16)
    assert store.read_metadata(0)["dtype"] is None


# ---- checksum manifest ------------------------------------------------------------------


def _files_of(store, version) -> dict[str, Path]:
    """The version's files except its metadata.json, by '/'-separated relative path."""
    root = Path(os.fspath(store.version_path(version)))
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file() and p.name != METADATA}


def test_metadata_carries_a_manifest_of_every_file(store):
    store.publish(0, params_for(0), {"step": 0})
    meta = store.read_metadata(0)
    files = _files_of(store, 0)
    assert meta["manifest_version"] == 1
    assert sorted(meta["manifest"]) == sorted(files) and any(p.parent.name == "d" for p in files.values())
    for rel, p in files.items():
        data = p.read_bytes()
        assert meta["manifest"][rel] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_a_flipped_bit_in_any_file_is_refused_naming_it(store):
    store.publish(0, params_for(0))
    target = abstract(params_for(0))
    for rel, p in _files_of(store, 0).items():
        original = p.read_bytes()
        p.write_bytes(original[:-1] + bytes([original[-1] ^ 0x01]))
        with pytest.raises(ChecksumError, match=f"checksum mismatch in {re.escape(rel)}") as e:
            store.load(0, target)
        assert isinstance(e.value, StoreError)  # what the pollers catch
        p.write_bytes(original)
    assert_tree_equal(store.load(0, target), params_for(0))


def test_a_truncated_missing_or_extra_file_is_refused(store):
    store.publish(0, params_for(0))
    target = abstract(params_for(0))
    rel, p = max(_files_of(store, 0).items(), key=lambda kv: kv[1].stat().st_size)
    original = p.read_bytes()
    os.truncate(p, len(original) // 2)
    with pytest.raises(ChecksumError, match=f"checksum mismatch in {re.escape(rel)}: {len(original) // 2} bytes"):
        store.load(0, target)
    p.unlink()
    with pytest.raises(ChecksumError, match=f"missing file {re.escape(rel)}"):
        store.load(0, target)
    p.write_bytes(original)
    (p.parent / "stray").write_bytes(b"x")
    with pytest.raises(ChecksumError, match=r"unexpected file (.*/)?stray "):
        store.load_latest(target)
    (p.parent / "stray").unlink()
    assert_tree_equal(store.load(0, target), params_for(0))


def test_a_legacy_version_without_manifest_needs_allow_unverified(store):
    store.publish(0, params_for(0))
    marker = store.version_path(0) / METADATA
    meta = json.loads(marker.read_text())
    del meta["manifest"], meta["manifest_version"]
    marker.write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=r"no checksum manifest.*allow_unverified=True"):
        store.load(0, abstract(params_for(0)))
    legacy = PolicyStore(store.root, allow_unverified=True)
    assert_tree_equal(legacy.load(0, abstract(params_for(0))), params_for(0))
    # allow_unverified never waives a manifest that is there.
    legacy.publish(1, params_for(1))
    p = next(iter(_files_of(legacy, 1).values()))
    p.write_bytes(p.read_bytes() + b"\0")
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        legacy.load(1, abstract(params_for(0)))


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    store = PolicyStore(str(tmp_path_factory.mktemp("flip") / "store"))
    store.publish(0, params_for(0))
    return store, _files_of(store, 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10**6), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_single_flipped_bit_in_any_file_is_caught(published, which, where, bit):
    store, files = published
    rel = sorted(files)[which % len(files)]
    p = files[rel]
    original = p.read_bytes()
    at = int(where * len(original))
    p.write_bytes(original[:at] + bytes([original[at] ^ (1 << bit)]) + original[at + 1 :])
    try:
        with pytest.raises(ChecksumError, match=f"checksum mismatch in {re.escape(rel)}"):
            store.verify(0)
    finally:
        p.write_bytes(original)
    store.verify(0)
