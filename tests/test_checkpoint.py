"""Learner checkpoints with real Orbax, on a local dir and on gs:// (the GCS emulator)."""

import os
import uuid

import jax
import jax.numpy as jnp
import optax
import pytest
from _trees import abstract, assert_tree_equal

from core.contracts.store import PolicyStore
from core.policy.model.config import model_config
from localstack.emulators import gcs as gcs_emulator
from trainer.learning.persistence.checkpoint import CheckpointError, LearnerCheckpointer
from trainer.learning.persistence.publisher import PolicyPublisher
from trainer.learning.step.learner import Learner, LearnerConfig

CONSUMED = {"rec-0001", "récord-é", "記録-2", "emoji-🎲", 'quote-"x"'}


@pytest.fixture(scope="session")
def gcs():
    emu = gcs_emulator.shared()  # one per process: clients cache the endpoint they saw first
    emu.apply_env()
    yield emu
    emu.restore_env()


@pytest.fixture(params=["local", pytest.param("gcs", marks=pytest.mark.e2e)])  # gcs: an emulator
def ckpt_dir(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "ckpt")
    return request.getfixturevalue("gcs").uri(f"ckpt-{uuid.uuid4().hex[:8]}")


def train_state(seed: int, steps: int = 2):
    """Params and a real optax adam state after a few updates (non-zero moments, count)."""
    params = {
        "dense": {"kernel": jnp.full((4, 3), float(seed)), "bias": jnp.zeros((3,))},
        "embed": jnp.arange(10, dtype=jnp.float32).reshape(5, 2) * seed,
    }
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
    opt_state = tx.init(params)
    for i in range(steps):
        grads = jax.tree.map(lambda x, g=float(i + 1 + seed): jnp.full_like(x, g), params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return {"params": params, "opt_state": opt_state}


def meta_for(step: int) -> dict:
    return {"learner_version": step // 5, "feeder_position": 40 * step, "consumed_ids": CONSUMED}


def test_round_trip(ckpt_dir):
    state = train_state(3)
    with LearnerCheckpointer(ckpt_dir) as ckpt:
        assert ckpt.latest_step() is None and ckpt.restore_latest(abstract(state)) is None
        ckpt.save(7, state, meta_for(7))
        step, restored, meta = ckpt.restore_latest(abstract(state))
    assert step == 7
    assert_tree_equal(restored, state)  # incl. the adam count/mu/nu namedtuples
    assert meta == {"learner_version": 1, "feeder_position": 280, "consumed_ids": sorted(CONSUMED)}
    # A new process (fresh checkpointer) resumes from the same place.
    with LearnerCheckpointer(ckpt_dir) as again:
        step, restored, meta = again.restore_latest(abstract(state))
    assert step == 7 and set(meta["consumed_ids"]) == CONSUMED
    assert_tree_equal(restored, state)


def test_newest_step_wins_and_readers_see_new_steps(ckpt_dir):
    reader = LearnerCheckpointer(ckpt_dir, read_only=True)  # created before any save
    with LearnerCheckpointer(ckpt_dir, max_to_keep=None) as writer:
        for step in (1, 2, 3):
            writer.save(step, train_state(step), meta_for(step))
        writer.wait_until_finished()
        assert reader.latest_step() == 3  # Orbax caches step lists; we reload on every call
        step, restored, meta = reader.restore_latest(abstract(train_state(0)))
    assert step == 3 and meta["feeder_position"] == 120
    assert_tree_equal(restored, train_state(3))
    reader.close()


def _leave_half_written_step(ckpt_dir: str, step: int) -> None:
    """What a learner killed during save leaves behind: locally Orbax's tmp dir (renamed
    only when complete); on GCS a step prefix with data but no commit_success.txt."""
    if ckpt_dir.startswith("gs://"):
        from google.cloud import storage

        bucket_name, prefix = ckpt_dir.removeprefix("gs://").split("/", 1)
        bucket = storage.Client().bucket(bucket_name)
        for name in ("_CHECKPOINT_METADATA", "state/manifest.ocdbt", "meta/metadata"):
            bucket.blob(f"{prefix}/{step}/{name}").upload_from_string("{half")
    else:
        tmp = os.path.join(ckpt_dir, f"{step}.orbax-checkpoint-tmp-1234567")
        os.makedirs(os.path.join(tmp, "state"))
        with open(os.path.join(tmp, "state", "manifest.ocdbt"), "w") as f:
            f.write("{half")


def test_half_written_checkpoint_is_ignored(ckpt_dir):
    with LearnerCheckpointer(ckpt_dir) as ckpt:
        ckpt.save(3, train_state(3), meta_for(3), wait=True)
    _leave_half_written_step(ckpt_dir, 4)
    with LearnerCheckpointer(ckpt_dir) as restarted:
        assert restarted.latest_step() == 3
        step, restored, meta = restarted.restore_latest(abstract(train_state(0)))
        assert step == 3 and meta == {**meta_for(3), "consumed_ids": sorted(CONSUMED)}
        assert_tree_equal(restored, train_state(3))
        restarted.save(4, train_state(4), meta_for(4), wait=True)  # the retried step replaces the debris
        step, restored, _ = restarted.restore_latest(abstract(train_state(0)))
    assert step == 4
    assert_tree_equal(restored, train_state(4))
    if not ckpt_dir.startswith("gs://"):
        assert sorted(os.listdir(ckpt_dir)) == ["3", "4", "MANIFESTED"]  # the tmp dir was cleaned up


def test_max_to_keep(ckpt_dir):
    with LearnerCheckpointer(ckpt_dir, max_to_keep=2) as ckpt:
        for step in range(5):
            ckpt.save(step * 10, train_state(step), meta_for(step))
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [30, 40]
        step, restored, _ = ckpt.restore_latest(abstract(train_state(0)))
    assert step == 40
    assert_tree_equal(restored, train_state(4))


def test_async_save_survives_donation(tmp_path):
    """save() returns before the write ends; the learner then donates the buffers to its
    next step. The checkpoint must hold the values at save time."""
    state = train_state(1)
    add = lambda t: jax.tree.map(lambda x: x + 100, t)
    bump, plus = jax.jit(add, donate_argnums=0), jax.jit(add)
    with LearnerCheckpointer(str(tmp_path / "ckpt")) as ckpt:
        ckpt.save(1, jax.tree.map(jnp.copy, state), meta_for(1))
        live = bump(bump(jax.tree.map(jnp.copy, state)))  # overwrite device memory meanwhile
        ckpt.save(2, live, meta_for(2))
        live = bump(live)
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [1, 2]
        step, restored, _ = ckpt.restore_latest(abstract(state))
    assert step == 2
    assert_tree_equal(restored, plus(plus(state)))


def test_a_cpu_learner_steps_only_once_its_checkpoint_is_written(tmp_path):
    """On a CPU the save reads the params' own buffers, and a step over them could not
    donate them (a second copy of the state: SmolLM2's peak 4.99 -> 7.27 GB). So before a
    step the publisher waits for the save; a learner on an accelerator never waits."""
    learner = Learner(model_config("tiny"), LearnerConfig(batch_records=1))
    assert learner.on_host
    with LearnerCheckpointer(str(tmp_path / "ckpt")) as ckpt:
        publisher = PolicyPublisher(PolicyStore(str(tmp_path / "store")), learner, ckpt, version=-1)
        publisher.publish()
        publisher.checkpoint(feeder_position=0, consumed_ids={})
        publisher.before_step()
        assert ckpt.durable_step() == learner.steps  # written and hashed, not in flight
        learner.on_host, learner.steps = False, 1  # as on a TPU: the save works from its own host copy
        publisher.checkpoint(feeder_position=0, consumed_ids={})
        assert publisher.before_step() == 0.0


def test_refuses_bad_input(tmp_path):
    state = train_state(1)
    with LearnerCheckpointer(str(tmp_path / "ckpt")) as ckpt:
        with pytest.raises(TypeError, match="JSON"):
            ckpt.save(1, state, {"ids": object()})
        with pytest.raises(ValueError, match="non-negative"):
            ckpt.save(-1, state, {})
        assert ckpt.latest_step() is None  # nothing was written
        ckpt.save(1, state, meta_for(1), wait=True)
        wrong = abstract(state)  # the model gained a layer since the checkpoint was written
        wrong["params"]["extra"] = jax.ShapeDtypeStruct((6, 2), jnp.float32)
        with pytest.raises(CheckpointError, match=r"step 1.*extra"):
            ckpt.restore_latest(wrong)
    with pytest.raises(ValueError, match="max_to_keep"):
        LearnerCheckpointer(str(tmp_path / "other"), max_to_keep=0)


def test_each_save_that_becomes_durable_gives_freed_heap_back_once(tmp_path, monkeypatch):
    """A finished save frees its host copies and buffers; glibc keeps them unless asked."""
    from trainer.learning.persistence import checkpoint

    trims = []
    monkeypatch.setattr(checkpoint.heap, "release", lambda: trims.append(1) or True)
    with LearnerCheckpointer(str(tmp_path / "ckpt")) as ckpt:
        ckpt.save(1, train_state(1), meta_for(1))
        ckpt.wait_until_finished()
        assert ckpt.durable_step() == 1 and len(trims) == 1
        assert ckpt.durable_step() == 1 and len(trims) == 1  # nothing new became durable
        ckpt.save(2, train_state(2), meta_for(2))
        ckpt.save(3, train_state(3), meta_for(3))  # step 2 finalised, its manifest written
        assert ckpt.durable_step() >= 2 and len(trims) >= 2
