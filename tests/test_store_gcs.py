"""The policy store on gs:// against a real local GCS server (gcp-storage-emulator):
Orbax writes through TensorStore's GCS driver, markers and LATEST through google-cloud-storage."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _trees import abstract, assert_tree_equal, params_for

from core.contracts.store import LATEST, ChecksumError, PolicyStore, StoreError
from localstack.emulators import gcs as gcs_emulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def gcs():
    """The process-wide emulator (stopped at exit), with its variables in os.environ."""
    emu = gcs_emulator.shared()
    emu.apply_env()
    yield emu
    emu.restore_env()


@pytest.fixture
def store(gcs):
    return PolicyStore(gcs.uri(f"stores/{uuid.uuid4().hex[:8]}"))


def prefix_of(store) -> str:
    return os.fspath(store.root).removeprefix("gs://").split("/", 1)[1]


def test_publish_then_fresh_reader_and_subprocess_reader(gcs, store, tmp_path):
    store.publish(0, params_for(0), {"step": 0})
    store.publish(1, params_for(1), {"step": 10})
    objects = gcs.list_objects(prefix_of(store) + "/")
    assert f"{prefix_of(store)}/LATEST" in objects
    assert f"{prefix_of(store)}/policies/00000001/metadata.json" in objects
    assert not any(o.startswith("gs:") or os.path.exists(o) for o in objects)  # nothing went to local disk

    reader = PolicyStore(os.fspath(store.root))
    assert reader.latest_version() == 1 and reader.versions() == [0, 1]
    version, params = reader.load_latest(abstract(params_for(0)))
    assert version == 1
    assert_tree_equal(params, params_for(1))
    assert reader.read_metadata(1)["metadata"] == {"step": 10}
    # A long-lived poller sees what is published after it first looked (gcsfs would cache
    # the listing forever; Orbax's own epath calls have that cache switched off).
    assert sorted(p.name for p in reader.policies_dir.iterdir()) == ["00000000", "00000001"]
    store.publish(2, params_for(2))
    assert reader.versions() == [0, 1, 2] and reader.latest_version() == 2
    assert sorted(p.name for p in reader.policies_dir.iterdir()) == ["00000000", "00000001", "00000002"]
    store.publish(3, params_for(1))  # the subprocess below must find these arrays

    # A worker in another process knows the emulator only through environment variables.
    script = textwrap.dedent("""
        import json, sys
        import jax, jax.numpy as jnp, numpy as np
        from core.contracts.store import PolicyStore
        target = {"dense": {"kernel": jax.ShapeDtypeStruct((4, 3), jnp.float32),
                            "bias": jax.ShapeDtypeStruct((3,), jnp.float32)},
                  "embed": jax.ShapeDtypeStruct((5, 2), jnp.int32)}
        version, params = PolicyStore(sys.argv[1]).load_latest(target)
        np.savez(sys.argv[2], **{jax.tree_util.keystr(k): np.asarray(x)
                                 for k, x in jax.tree_util.tree_leaves_with_path(params)})
        print(json.dumps({"version": version}))
    """)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": REPO,
        "JAX_PLATFORMS": "cpu",
        **gcs.env(),
    }
    out = tmp_path / "leaves.npz"
    proc = subprocess.run(
        [sys.executable, "-c", script, os.fspath(store.root), os.fspath(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"version": 3}
    got = np.load(out)
    for key, want in jax.tree_util.tree_leaves_with_path(params_for(1)):
        np.testing.assert_array_equal(got[jax.tree_util.keystr(key)], np.asarray(want))


def test_a_corrupt_object_is_refused_by_its_checksum(gcs, store):
    """The manifest is built from the bucket's objects, and a flipped byte there is caught."""
    from google.cloud import storage

    store.publish(0, params_for(0))
    manifest = store.read_metadata(0)["manifest"]
    assert any("/d/" in rel or rel.startswith("d/") for rel in manifest)
    rel = max(manifest, key=lambda r: manifest[r]["bytes"])
    bucket_name, _, key = os.fspath(store.version_path(0) / rel).removeprefix("gs://").partition("/")
    blob = storage.Client().bucket(bucket_name).blob(key)
    data = blob.download_as_bytes()
    blob.upload_from_string(data[:-1] + bytes([data[-1] ^ 0x01]))
    with pytest.raises(ChecksumError, match=f"checksum mismatch in {re.escape(rel)}"):
        PolicyStore(os.fspath(store.root)).load(0, abstract(params_for(0)))
    blob.upload_from_string(data)
    assert_tree_equal(PolicyStore(os.fspath(store.root)).load(0, abstract(params_for(0))), params_for(0))


def test_a_delta_version_round_trips_and_a_corrupt_one_is_refused(gcs, store):
    """A delta's data file goes through google-cloud-storage, not Orbax: written, read back
    for the manifest, read by a fresh reader, and refused once a byte in the bucket flips."""
    from google.cloud import storage

    from core.contracts.store_delta import DATA_FILE

    store.publish(0, params_for(0))
    store.publish(1, params_for(1), delta_of=0)
    reader = PolicyStore(os.fspath(store.root))
    assert_tree_equal(reader.load(1, abstract(params_for(0))), params_for(1))
    assert_tree_equal(reader.load_delta(1, params_for(0), 0), params_for(1))
    bucket_name, _, key = os.fspath(store.version_path(1) / DATA_FILE).removeprefix("gs://").partition("/")
    blob = storage.Client().bucket(bucket_name).blob(key)
    data = blob.download_as_bytes()
    blob.upload_from_string(data[:-1] + bytes([data[-1] ^ 0x01]))
    with pytest.raises(ChecksumError, match=f"checksum mismatch in {DATA_FILE}"):
        reader.load(1, abstract(params_for(0)))


def test_crash_between_data_and_pointer(gcs, store):
    store.publish(0, params_for(0))
    store.publish(1, params_for(1))
    store._write_version(2, params_for(2))  # the writer dies before _write_pointer
    reader = PolicyStore(os.fspath(store.root))
    assert reader.latest_version() == 1
    version, params = reader.load_latest(abstract(params_for(0)))
    assert version == 1
    assert_tree_equal(params, params_for(1))
    store.publish(2, params_for(20))  # the restarted learner republishes over the orphan
    assert_tree_equal(reader.load_latest(abstract(params_for(0)))[1], params_for(20))


def test_half_written_version_is_invisible(gcs, store):
    """On GCS Orbax writes in place (no tmp dir + rename): a killed save leaves a real
    version prefix with some objects. Without its marker it must never be loaded."""
    store.publish(1, params_for(1))
    store._write_version(2, params_for(2))
    from google.cloud import storage

    bucket = storage.Client().bucket(gcs.bucket)
    bucket.blob(f"{prefix_of(store)}/policies/00000002/metadata.json").delete()  # killed before the marker
    bucket.blob(f"{prefix_of(store)}/policies/00000003/_CHECKPOINT_METADATA").upload_from_string("{")
    reader = PolicyStore(os.fspath(store.root))
    assert reader.versions() == [1]
    for v in (2, 3):
        with pytest.raises(StoreError, match="missing or incomplete"):
            reader.load(v, abstract(params_for(0)))
    store._write_pointer(2)  # even a pointer at it cannot make it loadable
    with pytest.raises(StoreError, match="missing or incomplete"):
        reader.load_latest(abstract(params_for(0)))


# Orbax's async machinery reports its closed event loop after the failed save; harmless here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_failed_save_leaves_latest_alone(gcs, store):
    store.publish(0, params_for(0))
    with pytest.raises(ValueError, match="dtype"):  # TensorStore cannot write object arrays
        store.publish(1, {**params_for(1), "bad": np.array([object()])})
    assert store.latest_version() == 0 and store.versions() == [0]
    store.publish(1, params_for(1))
    assert_tree_equal(store.load_latest(abstract(params_for(0)))[1], params_for(1))


def test_bf16_publish_round_trip(gcs, store):
    params = params_for(0)
    params["dense"]["kernel"] = jnp.full((4, 3), 1 / 3, jnp.float32)  # not representable in bf16
    store.publish(0, params, dtype=jnp.bfloat16)
    assert store.read_metadata(0)["dtype"] == "bfloat16"
    as_stored = store.load(
        0,
        {
            **abstract(params),
            "dense": {
                "kernel": jax.ShapeDtypeStruct((4, 3), jnp.bfloat16),
                "bias": jax.ShapeDtypeStruct((3,), jnp.bfloat16),
            },
        },
    )
    assert as_stored["dense"]["kernel"].dtype == jnp.bfloat16
    out = store.load(0, abstract(params))  # back into the worker's float32 params
    assert_tree_equal(out["embed"], params["embed"])  # ints are never cast
    assert out["dense"]["kernel"].dtype == jnp.float32
    np.testing.assert_array_equal(
        np.asarray(out["dense"]["kernel"]),
        np.asarray(params["dense"]["kernel"].astype(jnp.bfloat16).astype(jnp.float32)),
    )
    assert not np.array_equal(np.asarray(out["dense"]["kernel"]), np.asarray(params["dense"]["kernel"]))
    np.testing.assert_array_equal(np.asarray(out["dense"]["bias"]), np.arange(3, dtype=np.float32))


def test_gc_keeps_latest_and_in_flight(gcs, store):
    for v in range(5):
        store.publish(v, params_for(v))
    store._write_version(6, params_for(6))  # in flight: newer than LATEST, must survive
    assert store.gc(keep=2) == [0, 1, 2]
    assert store.versions() == [3, 4, 6]
    remaining = {o.split("/")[3] for o in gcs.list_objects(prefix_of(store) + "/policies/")}
    assert remaining == {"00000003", "00000004", "00000006"}  # no stray objects of deleted versions
    assert store.gc(keep=1) == [3]
    assert store.versions() == [4, 6] and store.latest_version() == 4
    assert_tree_equal(store.load_latest(abstract(params_for(0)))[1], params_for(4))
    assert (
        json.loads(PolicyStore(os.fspath(store.root))._files.read_text(os.fspath(store.root / LATEST)))["version"] == 4
    )


def test_unreachable_gcs_is_a_store_error(gcs, monkeypatch):
    """A poller must get StoreError (and keep its version) when GCS is down, not crash."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # discard port: refused
    store = PolicyStore(gcs.uri("nowhere"), gcs_read_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="failed"):
        store.latest_version()
    with pytest.raises(StoreError, match="failed"):
        store.versions()
    assert time.monotonic() - t0 < 30  # bounded, not the library's 120 s of retries


def test_emulator_reports_generations_like_gcs(gcs):
    """The harness patches what TensorStore's OCDBT manifest updates rely on: a read
    returns the object's generation, and a read conditional on a changed generation gets
    304 (no value). Without it, ~1 publish in 45 failed with "Malformed StorageGeneration"."""
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "gcs", "bucket": gcs.bucket, "path": f"kv-{uuid.uuid4().hex[:8]}/"}).result()
    written = kv.write("manifest", b"v1").result().generation
    read = kv.read("manifest").result()
    assert read.value == b"v1" and read.stamp.generation == written
    unchanged = kv.read("manifest", if_not_equal=written).result()
    assert unchanged.state == "unspecified" and unchanged.stamp.generation == written
    updated = kv.write("manifest", b"v2", if_equal=read.stamp.generation).result().generation
    assert updated != written and kv.read("manifest").result().value == b"v2"


@pytest.mark.e2e
def test_emulator_harness_stops_its_whole_process_group():
    from localstack.launch.processes import group_alive

    with gcs_emulator.GcsEmulator(bucket="harness-check") as emu:  # a second one, own port
        pid = emu.pid
        assert emu.list_objects() == [] and group_alive(pid)
        assert emu.env()["STORAGE_EMULATOR_HOST"] == emu.env()["TENSORSTORE_GCS_HTTP_URL"] == emu.url
    assert not group_alive(pid) and emu.url is None
