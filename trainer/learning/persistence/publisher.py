"""Policy versions out to the store, and the learner checkpoint that knows each one."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from core.contracts.store import PolicyStore
from core.policy.lora import adapter_metadata
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
    ):
        self.store, self.learner, self.checkpointer = store, learner, checkpointer
        self.version = version  # the newest published version (-1: none yet)
        # One writer per run: process 0 of a multi-host learner (None: ask JAX).
        self.is_primary = primary_process() if is_primary is None else is_primary
        self.dtype, self.keep_versions = dtype, keep_versions
        self.published: list[int] = []

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
            self.store.publish(self.version, params, metadata, dtype=self.dtype)
            self.store.gc(self.keep_versions)
        self.published.append(self.version)

    def _extra_metadata(self) -> dict:
        """The step; with LoRA, the adapter's settings (the version holds an adapter, not a
        whole model: readers merge it into the base they loaded)."""
        extra = {"step": self.learner.steps}
        lora = self.learner.cfg.lora
        if lora.rank:
            extra["lora"] = adapter_metadata(lora)
        return extra

    def checkpoint(self, feeder_position: int, consumed_ids: dict[str, int]) -> None:
        """A restarted learner resumes at exactly this version, feeder position and dedup set."""
        if self.checkpointer is None:
            return
        meta = {"learner_version": self.version, "feeder_position": feeder_position, "consumed_ids": consumed_ids}
        self.checkpointer.save(self.learner.steps, learner_state_of(self.learner), meta)
