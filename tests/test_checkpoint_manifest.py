"""Learner checkpoints carry a checksum manifest, as policy versions do: a flipped byte is
refused naming the file, a step cut off before its manifest is skipped (no ack relied on
it), and a legacy directory is refused unless the learner is told to accept it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import test_checkpoint as base
from _trees import abstract, assert_tree_equal

from trainer.learning.persistence.checkpoint import MANIFEST, MANIFESTED, CheckpointError, LearnerCheckpointer

gcs, ckpt_dir = base.gcs, base.ckpt_dir  # the fixtures: a local dir, and gs:// on the emulator
meta_for, train_state = base.meta_for, base.train_state


def _files(ckpt: LearnerCheckpointer):
    return ckpt._files  # the store's file layer: os calls locally, google-cloud-storage on gs://


def test_a_step_is_durable_only_with_its_manifest(ckpt_dir):
    state = train_state(2)
    with LearnerCheckpointer(ckpt_dir) as ckpt:
        ckpt.save(3, state, meta_for(3))
        while ckpt.durable_step() != 3:  # the learner's acks of step 3's records wait for this
            pass
        doc = json.loads(_files(ckpt).read_text(f"{ckpt_dir}/3/{MANIFEST}"))
        listing = _files(ckpt).walk(f"{ckpt_dir}/3")
    assert doc["step"] == 3 and set(doc["manifest"]) == set(listing) - {MANIFEST}
    assert all(len(e["sha256"]) == 64 and e["bytes"] == listing[rel] for rel, e in doc["manifest"].items())


def test_a_step_is_durable_once_the_next_save_begins(ckpt_dir):
    """Orbax finishes one save before it starts the next, so a step's manifest is written
    then, not only once a poll finds no save in flight (a learner that saves at every
    publish may never find one: test_resume's reader saw no durable step in 1,000)."""
    with LearnerCheckpointer(ckpt_dir) as ckpt:
        assert ckpt.durable_step() is None
        ckpt.save(3, train_state(2), meta_for(3))
        ckpt.save(5, train_state(2), meta_for(5))  # nobody asks durable_step() in between
        reader = LearnerCheckpointer(ckpt_dir, read_only=True)
        assert reader.latest_step() == 3  # 5 has no manifest before durable_step() or close()
        assert ckpt.durable_step() in (3, 5)  # 3 at least, whatever 5's save is doing
        assert reader.read_meta(3)["feeder_position"] == meta_for(3)["feeder_position"]
    assert reader.latest_step() == 5 and ckpt.durable_step() == 5


def _largest_data_file(step_dir: str) -> Path:
    files = [p for p in Path(step_dir).rglob("*") if p.is_file() and p.name != MANIFEST]
    return max(files, key=lambda p: p.stat().st_size)


def test_a_flipped_byte_is_refused_naming_the_file(tmp_path):
    root, state = str(tmp_path / "ckpt"), train_state(4)
    with LearnerCheckpointer(root) as ckpt:
        ckpt.save(5, state, meta_for(5), wait=True)
    victim = _largest_data_file(f"{root}/5")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size: only the hash can tell
    victim.write_bytes(bytes(data))
    rel = victim.relative_to(f"{root}/5").as_posix()
    with LearnerCheckpointer(root) as ckpt, pytest.raises(CheckpointError, match=f"checksum mismatch in {rel}"):
        ckpt.restore_latest(abstract(state))


@pytest.mark.e2e
def test_a_corrupt_object_on_gcs_is_refused(gcs):
    from google.cloud import storage

    root, state = gcs.uri("ckpt-corrupt"), train_state(4)
    with LearnerCheckpointer(root) as ckpt:
        ckpt.save(2, state, meta_for(2), wait=True)
        listing = _files(ckpt).walk(f"{root}/2")
    rel = max((r for r in listing if r != MANIFEST), key=listing.get)
    bucket, _, prefix = root.removeprefix("gs://").partition("/")
    blob = storage.Client().bucket(bucket).blob(f"{prefix}/2/{rel}")
    data = bytearray(blob.download_as_bytes())
    data[len(data) // 2] ^= 0x01
    blob.upload_from_string(bytes(data))
    with LearnerCheckpointer(root) as ckpt, pytest.raises(CheckpointError, match=f"checksum mismatch in {rel}"):
        ckpt.restore_latest(abstract(state))


def test_a_step_cut_off_before_its_manifest_is_skipped(tmp_path):
    root, old, new = str(tmp_path / "ckpt"), train_state(1), train_state(2)
    with LearnerCheckpointer(root) as ckpt:
        ckpt.save(1, old, meta_for(1), wait=True)
        ckpt.save(2, new, meta_for(2), wait=True)
    os.remove(f"{root}/2/{MANIFEST}")  # the crash: Orbax finalised step 2, no manifest yet
    with LearnerCheckpointer(root) as ckpt:
        step, restored, meta = ckpt.restore_latest(abstract(old))
        assert (step, meta["feeder_position"]) == (1, 40)
        assert_tree_equal(restored, old)
        assert ckpt.all_steps() == [1]  # removed, so the resumed learner's save of step 2 is clean
        ckpt.save(2, new, meta_for(2), wait=True)
        assert ckpt.restore_latest(abstract(new))[0] == 2


def test_a_legacy_directory_is_refused_unless_accepted(tmp_path):
    root, state = str(tmp_path / "ckpt"), train_state(3)
    with LearnerCheckpointer(root) as ckpt:
        ckpt.save(4, state, meta_for(4), wait=True)
    os.remove(f"{root}/4/{MANIFEST}")  # as written before checkpoint manifests
    os.remove(f"{root}/{MANIFESTED}")
    with LearnerCheckpointer(root) as ckpt, pytest.raises(CheckpointError, match="--checkpoint_unverified"):
        ckpt.restore_latest(abstract(state))
    with LearnerCheckpointer(root, allow_unverified=True) as ckpt:
        step, restored, _ = ckpt.restore_latest(abstract(state))
    assert step == 4
    assert_tree_equal(restored, state)


def test_a_read_only_reader_writes_no_manifest_and_removes_nothing(tmp_path):
    root, state = str(tmp_path / "ckpt"), train_state(1)
    with LearnerCheckpointer(root) as ckpt:
        ckpt.save(1, state, meta_for(1), wait=True)
        ckpt.save(2, state, meta_for(2), wait=True)
    os.remove(f"{root}/2/{MANIFEST}")
    with LearnerCheckpointer(root, read_only=True) as reader:
        assert reader.restore_latest(abstract(state))[0] == 1
        assert reader.all_steps() == [1, 2]  # the writer's business, not a reader's
    assert not os.path.exists(f"{root}/2/{MANIFEST}")


def test_a_file_that_goes_during_a_walk_is_not_listed(tmp_path, monkeypatch):
    """Process 0 writes a step's manifest through a temporary file renamed into place while
    another process walks the step (the two-process learner crashed on this in CI)."""
    from core.contracts import manifest as mf

    (tmp_path / "a").write_bytes(b"12")
    (tmp_path / ".manifest.json.x.tmp").write_bytes(b"{}")
    real = os.path.getsize

    def renamed_meanwhile(p):
        if p.endswith(".tmp"):
            raise FileNotFoundError(p)
        return real(p)

    monkeypatch.setattr(os.path, "getsize", renamed_meanwhile)
    assert mf.walk_local(os.fspath(tmp_path)) == {"a": 2}
