"""Learner checkpoints: params, optimizer state and the bookkeeping needed to resume.

    ckpt = LearnerCheckpointer(directory, max_to_keep=3)       # local dir or gs://bucket/prefix
    ckpt.save(step, {"params": p, "opt_state": o},
              {"learner_version": v, "feeder_position": n, "consumed_ids": {id: version}})
    restored = ckpt.restore_latest({"params": abstract_p, "opt_state": abstract_o})
    if restored: step, state, meta = restored

Arrays go through Orbax (TensorStore); `meta` is stored as JSON next to them (no pickle),
in the same Orbax step, so arrays and bookkeeping are committed together or not at all.
A step counts once Orbax has finalised it (locally: renamed from its tmp dir; on GCS: its
commit_success.txt written), so a save killed midway is invisible to restore_latest.

Durability vs. publishing: save() is asynchronous by default (it returns once the arrays
are copied off the device; the write continues in the background) and policy publishing
does not wait for it. That is safe because nothing a worker sees depends on a checkpoint:
policy versions are numbered from the store's LATEST (resume with
max(LATEST, checkpoint version) + 1), so a crash after a publish but before the
checkpoint is durable only costs the steps since the last durable checkpoint; the records
trained meanwhile come back from Pub/Sub, because the consumer acks a record only once a
durable checkpoint covers it (trainer/learning/data/deliveries.py). Call wait_until_finished() (or
save(..., wait=True)) where the caller needs durability, e.g. before exiting.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Self

import orbax.checkpoint as ocp
from etils import epath

from core import heap
from core.contracts import manifest as mf
from core.contracts import orbax_fixes
from core.contracts.store_files import disable_gcsfs_listing_cache, files_for
from trainer.cloud.distributed import is_primary

orbax_fixes.apply()  # every checkpoint save and restore went through a leak
log = logging.getLogger(__name__)

disable_gcsfs_listing_cache()  # restore_latest lists steps through epath -> gcsfs on gs://


MANIFEST = "manifest.json"  # in the step's directory: sha256 and size of every file Orbax wrote
MANIFESTED = "MANIFESTED"  # at the root: steps here get manifests (a step without one was cut off)


class CheckpointError(RuntimeError):
    """A finalised checkpoint could not be restored (wrong target or corrupt data)."""


def _json_default(x):
    if isinstance(x, (set, frozenset)):
        return sorted(x)  # dedup sets: sorted, so the file is deterministic
    if hasattr(x, "item") and getattr(x, "shape", None) == ():
        return x.item()  # numpy / jax scalars
    raise TypeError(f"checkpoint meta must be JSON-serialisable; got {type(x).__name__}")


class LearnerCheckpointer:
    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = 3,
        async_save: bool = True,
        read_only: bool = False,
        allow_unverified: bool = False,
    ):
        """read_only: for a process that only restores (an evaluator, a test) while the
        learner writes; it must not clean up, or it would delete the learner's in-flight save.
        allow_unverified: restore checkpoints written before manifests (a legacy directory).

        Orbax has no checksum of its own (OCDBT chunks are zstd with none), so, as policy
        versions do (core/contracts/manifest.py), each step gets a manifest once Orbax has
        finalised it. A step counts as durable (`durable_step()`) only once its manifest
        is written, so a crash between the two leaves a step no record's ack relied on:
        restore skips it, and its successor's save replaces it."""
        self.allow_unverified, self.read_only = allow_unverified, read_only
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.directory = epath.Path(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=async_save,
            # Tmp dirs of saves killed midway are removed at start-up: the learner is the only
            # writer, so when it starts none of them can still be in flight.
            cleanup_tmp_directories=not read_only,
        )
        self._mngr = ocp.CheckpointManager(self.directory, options=options)
        self._files = files_for(os.fspath(self.directory))
        self._unhashed: list[int] = []  # saved by us, manifest not yet written
        self._durable: int | None = None  # the newest step we saved whose manifest is written
        self._closed = False

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any], *, wait: bool = False) -> None:
        """Checkpoint `state` (a dict of pytrees) and `meta` (JSON values; sets become sorted
        lists) as `step`. Returns once the arrays are off the device, so the caller may
        donate or overwrite them; with wait=True, once the checkpoint is durable."""
        if type(step) is not int or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        # Serialise now: a bad value fails here, not in the background thread, and later
        # mutation of the caller's dedup set cannot leak into the checkpoint.
        meta = json.loads(json.dumps(meta, default=_json_default))
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        # force=True: save exactly when asked; the learner decides the cadence.
        marker = os.fspath(self.directory / MANIFESTED)
        if not self._unhashed and not self._files.exists(marker):
            self._files.write_text(marker, "steps here carry manifest.json\n")
        self._mngr.save(step, args=args, force=True)
        # Orbax finalises the previous save before it starts this one: that step is final
        # now, so it gets its manifest here. Left to `durable_step()` it would wait for a poll
        # with no save in flight, which a learner saving at every publish may never have.
        self._write_manifests()
        self._unhashed.append(step)
        if wait:
            self.wait_until_finished()

    # -- manifests -------------------------------------------------------------------------
    def _step_dir(self, step: int) -> str:
        return os.fspath(self.directory / str(step))

    def _write_manifests(self) -> None:
        """Hashes the steps Orbax has finalised since the last call (read back: on gs:// it
        is what the bucket holds). Only process 0 writes (the directory is shared); another
        process keeps a step pending until process 0's manifest for it exists, so its
        `durable_step()` cannot report a step durable that a restore would skip."""
        steps, self._unhashed = self._unhashed, []
        durable_before = self._durable
        for step in steps:
            root = self._step_dir(step)
            if not is_primary():
                # Process 0 may be writing the manifest now: look for it, not at the files.
                if self._files.exists(f"{root}/{MANIFEST}"):
                    self._durable = max(step, self._durable or 0)
                elif self._files.walk(root):
                    self._unhashed.append(step)
                continue
            if not self._files.walk(root):
                continue  # max_to_keep already removed it
            files = mf.build(self._files.walk(root), lambda rel, r=root: self._files.sha256(f"{r}/{rel}"), MANIFEST)
            doc = {"manifest_version": mf.MANIFEST_VERSION, "step": step, "manifest": files}
            self._files.write_text(f"{root}/{MANIFEST}", json.dumps(doc))
            self._durable = max(step, self._durable or 0)
        if self._durable != durable_before:
            # A finished save freed its host copies and buffers; glibc keeps such memory in its
            # arenas otherwise. In the 60-minute soak this lowered the learner's resident size
            # by 10-15 MB; its slow rise went on (docs/RELIABILITY.md, "Soak").
            heap.release()

    def _manifest(self, step: int) -> dict | None:
        text = self._files.read_text(f"{self._step_dir(step)}/{MANIFEST}")
        if text is None:
            return None
        try:
            return json.loads(text)["manifest"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"checkpoint step {step}: corrupt {MANIFEST}: {e}") from None

    def verify(self, step: int) -> None:
        """CheckpointError naming the first file that differs from the step's manifest."""
        manifest = self._manifest(step)
        if manifest is None:
            if self.allow_unverified:
                return
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} has no {MANIFEST} (written before checkpoint "
                "manifests?): refused; --checkpoint_unverified restores it unchecked"
            )
        root = self._step_dir(step)
        why = mf.problem(manifest, self._files.walk(root), lambda rel: self._files.sha256(f"{root}/{rel}"), MANIFEST)
        if why is not None:
            raise CheckpointError(f"checkpoint step {step} in {self.directory}: {why}")

    def latest_step(self) -> int | None:
        """The newest step that counts: the newest with a manifest. In a directory from
        before manifests (no MANIFESTED marker) the newest step, which verify then judges."""
        steps = self.all_steps()  # reloaded: another process may have written
        if not self._files.exists(os.fspath(self.directory / MANIFESTED)):
            return steps[-1] if steps else None
        committed = [s for s in steps if self._manifest(s) is not None]
        return committed[-1] if committed else None

    def _drop_cut_off(self, newest: int | None) -> None:
        """Steps newer than `newest` were cut off between Orbax's finalisation and their
        manifest (no ack relied on them): skipped, and removed unless read-only."""
        for step in (s for s in self.all_steps() if newest is None or s > newest):
            log.warning("checkpoint step %d has no %s (cut off before it was written): skipped", step, MANIFEST)
            if not self.read_only:
                self._mngr.delete(step)

    def all_steps(self) -> list[int]:
        for attempt in range(3):  # a reader lists while the writer's max_to_keep removes a step
            try:
                self._mngr.reload()
                return sorted(self._mngr.all_steps())
            except FileNotFoundError:
                if attempt == 2:
                    raise
                time.sleep(0.1)

    def restore_latest(self, abstract_state: dict[str, Any]) -> tuple[int, dict, dict] | None:
        """(step, state, meta) of the newest finalised step, with `state` shaped like
        `abstract_state` (arrays or jax.ShapeDtypeStruct, shardings honoured); None if
        there is none. A finalised step that fails to restore raises CheckpointError: we
        do not silently rewind to an older step, which would then be trained past and
        leave a newer, broken step behind."""
        self.wait_until_finished()  # our own pending save counts
        step = self.latest_step()
        self._drop_cut_off(step)
        if step is None:
            return None
        self.verify(step)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())
        try:
            restored = self._mngr.restore(step, args=args)
        except Exception as e:  # orbax raises many types; callers need one
            raise CheckpointError(f"cannot restore checkpoint step {step} from {self.directory}: {e}") from e
        log.info("restored learner checkpoint step %d from %s", step, self.directory)
        return step, restored["state"], restored["meta"]

    def read_meta(self, step: int | None = None) -> dict | None:
        """Only the JSON bookkeeping of `step` (default: the newest), without the arrays."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        return self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def durable_step(self) -> int | None:
        """The newest step this process saved that is durable (its manifest written), while
        later saves may be in flight: what the records it covers may be acked against. A
        learner saving at every publish always has one in flight, so 'no save in flight'
        would hold its acks until it stops."""
        if not self._closed and not self._mngr.is_saving_in_progress():
            self._write_manifests()
        return self._durable

    def wait_until_finished(self, manifest_timeout_s: float = 120.0) -> None:
        self._mngr.wait_until_finished()
        self._write_manifests()
        deadline = time.monotonic() + manifest_timeout_s
        while self._unhashed and time.monotonic() < deadline:  # another process: process 0's manifest
            time.sleep(0.1)
            self._write_manifests()

    def close(self) -> None:
        """Waits for a pending save and its manifest, then releases Orbax's threads."""
        if not self._closed:
            self.wait_until_finished()
        self._mngr.close()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
