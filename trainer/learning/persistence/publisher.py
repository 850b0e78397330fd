"""Policy versions out to the store, and the learner checkpoint that knows each one.

With `delta_every` K > 0 a version is written full every K versions and as a delta against
the last full one in between (core/contracts/store_delta.py), unless the delta would be
larger than `delta_max_share` of that full version. The publisher keeps that full
version's params as stored (host numpy, one copy: 270 MB for SmolLM2-135M in bf16) to
encode against, so a delta never reads the store. After a restart it holds none: the first
version it publishes is full.

LoRA versions hold only the adapter, and deltas of them work the same; they save less:
the adapter is already small, and every one of its elements moves in every step. Where
every f32 element moves by about 1e-3 of its value, a delta is about 60 % of the leaf
(measured on random arrays, not on a trained adapter), above the default
delta_max_share, so such versions stay full; in bf16 most elements keep their stored value
and deltas pay.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from core.contracts import store_delta
from core.contracts.store import PolicyStore, as_stored
from core.policy.model.lora import adapter_metadata
from core.policy.sources import policy_metadata
from trainer.cloud.distributed import is_primary as primary_process
from trainer.learning.persistence.checkpoint import LearnerCheckpointer
from trainer.learning.step.learner import Learner


def learner_state_of(learner: Learner) -> dict:
    """What a checkpoint holds (ref_params included: the store's v0 may be gc'ed)."""
    state = {"params": learner.params, "opt_state": learner.opt_state}
    if learner.ref_params is not None:
        state["ref_params"] = learner.ref_params
    return state


def host_params(learner: Learner) -> dict:
    """The params as host numpy arrays, gathered from every process of a multi-host slice
    (a collective: every process must call it)."""
    params = learner.params_dict()
    if jax.process_count() > 1:
        return multihost_utils.process_allgather(params, tiled=True)
    return jax.tree.map(np.asarray, params)


def _frozen_copy(x: np.ndarray) -> np.ndarray:
    """An array of its own, read-only: deltas are encoded against it for K versions, and a
    numpy view of a learner's array could see the buffer the next (donating) step reuses."""
    if not x.flags.owndata:
        x = np.array(x, copy=True)
    x.setflags(write=False)
    return x


class PolicyPublisher:
    """Numbers policy versions and writes them. Every process gathers the params and takes
    part in Orbax's checkpoint save (Orbax's primary writes the step's commit marker);
    only the primary process writes the policy store."""

    def __init__(
        self,
        store: PolicyStore,
        learner: Learner,
        checkpointer: LearnerCheckpointer | None,
        *,
        version: int,
        is_primary: bool | None = None,
        dtype=None,
        keep_versions: int = 5,
        delta_every: int = 0,
        delta_max_share: float = 0.5,
    ):
        self.store, self.learner, self.checkpointer = store, learner, checkpointer
        self.version = version  # the newest published version (-1: none yet)
        # One writer per run: process 0 of a multi-host learner (None: ask JAX).
        self.is_primary = primary_process() if is_primary is None else is_primary
        self.dtype, self.keep_versions = dtype, keep_versions
        self.delta_every, self.delta_max_share = delta_every, delta_max_share
        self.published: list[int] = []
        # What each version cost on storage: {"version", "kind": "full"|"delta", "bytes", "seconds"}.
        self.writes: list[dict] = []
        self._base: tuple[int, dict, int] | None = None  # (version, params as stored, bytes): the last full one

    def publish_start(self, resumed: bool) -> None:
        """Policy v0 of a fresh run; or, after a crash between a publish and its checkpoint,
        these params again under a version above everything the workers may have seen."""
        latest = self.store.latest_version()
        if jax.process_count() > 1:  # process 0's reading: the others must take the same branch
            got = multihost_utils.broadcast_one_to_all(np.int64(-1 if latest is None else latest))
            latest = None if int(got) < 0 else int(got)
        if resumed and (latest is None or latest <= self.version):
            self.published.append(self.version)  # the checkpoint's version is current
            return
        self.version = max(self.version, -1 if latest is None else latest)
        self.publish()

    def publish(self) -> None:
        self.version += 1
        params = host_params(self.learner)
        if self.is_primary:
            metadata = policy_metadata(self.learner.model_cfg, self.learner.tokenizer_source, **self._extra_metadata())
            self._write(params, metadata)
            self.store.gc(self.keep_versions)
        self.published.append(self.version)

    def _write(self, params: dict, metadata: dict) -> None:
        """One version, full or as a delta against the held full one (whichever the policy
        says), recorded in `writes`."""
        t0 = time.monotonic()
        delta = None
        base = self._base
        if base is not None and not self.store.is_complete(base[0]):
            base = None  # deleted behind our back (gc keeps it): a full version instead
        if base is not None and not store_delta.should_be_full(self.version, base[0], self.delta_every):
            delta = store_delta.encode(as_stored(params, self.dtype), base[1])
            if store_delta.should_be_full(
                self.version, base[0], self.delta_every, delta.nbytes, base[2], self.delta_max_share
            ):
                delta = None  # too large to pay: a full version, and the base of the next deltas
        if delta is not None:
            self.store.publish(self.version, params, metadata, dtype=self.dtype, delta_of=base[0], delta=delta)
        else:
            self.store.publish(self.version, params, metadata, dtype=self.dtype)
        written = self.store.read_metadata(self.version).get("bytes")
        if delta is None and self.delta_every > 1:
            self._base = None  # the old copy goes before the new one is made: one copy at a time
            self._base = (self.version, jax.tree.map(_frozen_copy, as_stored(params, self.dtype)), written)
        kind = "full" if delta is None else "delta"
        self.writes.append(
            {"version": self.version, "kind": kind, "bytes": written, "seconds": round(time.monotonic() - t0, 3)}
        )

    def _extra_metadata(self) -> dict:
        """The step; with LoRA, the adapter's settings (the version holds an adapter, not a
        whole model: readers merge it into the base they loaded)."""
        extra = {"step": self.learner.steps}
        if self.delta_every > 1:  # readers then keep a full version's params to apply deltas to
            extra["delta_every"] = self.delta_every
        lora = self.learner.cfg.lora
        if lora.rank:
            extra["lora"] = adapter_metadata(lora)
        return extra

    def before_step(self) -> float:
        """Where the params live in host memory (a CPU learner), waits for the checkpoint's
        save before the next step may run; returns the seconds waited. Orbax writes from numpy
        views of the params' own buffers, so a step over them cannot donate them: XLA holds
        a second copy of the state beside the save's write buffers. With SmolLM2-135M at the
        chained game's layout that took the learner's peak from 4.99 to 7.27 GB (docs/RESULTS.md,
        issue 55). The save still overlaps the wait for the next batch; on an accelerator the
        save reads a host copy and never waits."""
        if self.checkpointer is None or not self.learner.on_host:
            return 0.0
        t0 = time.monotonic()
        self.checkpointer.wait_until_finished()
        return time.monotonic() - t0

    def checkpoint(self, feeder_position: int, consumed_ids: dict[str, int]) -> None:
        """A restarted learner resumes at exactly this version, feeder position and dedup set."""
        if self.checkpointer is None:
            return
        meta = {"learner_version": self.version, "feeder_position": feeder_position, "consumed_ids": consumed_ids}
        self.checkpointer.save(self.learner.steps, learner_state_of(self.learner), meta)
