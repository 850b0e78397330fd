"""A published policy version, as the params a sampler runs: the rollout workers' and the
evaluator's one way to read the store.

A version holds either the whole model's params, or, when the learner trains LoRA
adapters, the adapter alone (its metadata says `lora`). An adapter is applied to the base
checkpoint the process loaded once (`--model`), so a version costs the adapter's bytes, not
the model's. A version whose model config differs from this process's is refused, naming
both: serving it would sample from the wrong architecture.

A delta version (core/contracts/store_delta.py) is applied to the full version it was
written against, which the loader keeps on the host as stored (one copy, the last full
version's) once the store uses deltas: a delta then costs only its own bytes. Without that
base in hand the loader reads it once and keeps it. Deltas are never against deltas, so a
kept full version is all a reader ever needs.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from core.contracts import store_delta
from core.contracts.store import PolicyStore, StoreError, as_target
from core.policy.model import lora
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import Transformer, abstract_tree


class VersionLoader:
    def __init__(
        self,
        store: PolicyStore,
        cfg: ModelConfig | None,
        template: nnx.State,
        base: Callable[[], nnx.State] | None = None,
    ):
        """cfg: this process's model config (None: not checked); template: the plain
        model's params State (shapes suffice); base: the base
        checkpoint's params, called once, on the first adapter version."""
        self.store, self.cfg, self._template = store, cfg, template
        self._target = _placed(abstract_tree(nnx.to_pure_dict(template)))
        self._base_fn, self._base = base, None
        self._held: tuple[int, Any] | None = None  # (version, params as stored) of the last full version
        self._deltas_seen = False
        # The last load, for reports: {"version", "kind": "full"|"delta", "bytes", "seconds",
        # "base_read"}. bytes: the files it fetched by their size on storage (a full version's
        # manifest check reads its files once more, not counted); base_read: a delta whose base
        # this loader did not hold, so the base's bytes are in it too.
        self.last_load: dict | None = None

    def load(self, version: int) -> tuple[nnx.State, dict]:
        """(plain params State, the version's metadata file); StoreError when it cannot be served."""
        with _prompt_gil_handoffs():
            return self._load(version)

    def _load(self, version: int) -> tuple[nnx.State, dict]:
        t0, cpu0 = time.monotonic(), time.thread_time()
        meta = self.store.read_metadata(version)
        published = meta.get("metadata", {})
        if self.cfg is not None and "model_config" in published:
            try:
                want = ModelConfig.from_dict(published["model_config"])
            except (TypeError, ValueError) as e:
                raise StoreError(f"version {version}: its model_config is unreadable: {e}") from None
            if want != self.cfg:
                raise StoreError(
                    f"version {version} was trained with another model config than this process's "
                    f"(--model / --model_config): {_difference(want.to_dict(), self.cfg.to_dict())}"
                )
        if "lora" in published:
            state = self._merged(version, meta, lora.LoraConfig.from_dict(published["lora"]))
        else:
            state = jax.tree.map(lambda x: x, self._template)  # a fresh container, same structure
            # On the device once: numpy leaves would be copied into every jitted call (at 135 M
            # parameters, 0.54 GB and about 0.24 s per decode step on this CPU).
            nnx.replace_by_pure_dict(state, jax.device_put(self._read(version, meta, self._target)))
        self.last_load["seconds"] = round(time.monotonic() - t0, 4)
        # This thread's CPU in that time: far below the seconds, the load waited for a core or
        # the GIL; near them, it worked (a full load's reads run on tensorstore's own threads).
        self.last_load["cpu_s"] = round(time.thread_time() - cpu0, 4)
        return state, meta

    def _merged(self, version: int, meta: dict, lora_cfg: lora.LoraConfig) -> nnx.State:
        if self._base_fn is None:
            raise StoreError(f"version {version} is a LoRA adapter: serving it needs the base checkpoint (--model)")
        if self._base is None:
            self._base = self._base_fn()
        adapter = self._read(version, meta, _adapter_target(self.cfg, lora_cfg))
        return lora.merge_params(self._base, adapter, lora_cfg)

    def _read(self, version: int, meta: dict, target: dict) -> Any:
        """The version's params for `target`, a delta applied to the full version held."""
        base = meta.get("delta_of")
        if base is None:
            params = self._read_full(version, meta, target)
            self.last_load = {"version": version, "kind": "full", "bytes": _bytes(meta), "base_read": False}
            return params
        self._deltas_seen = True
        base_read = self._held is None or self._held[0] != base
        if not base_read:
            try:
                params = self.store.load_delta(version, self._held[1], base, target)
            except store_delta.DeltaMismatch:
                base_read = True  # the copy held may be what is wrong: read the base again
        if base_read:
            self._held = None  # the old copy goes first: one copy at a time
            self._held = (base, self.store.load_base(version, target, meta))
            params = self.store.load_delta(version, self._held[1], base, target)
        nbytes = _bytes(meta) + (_bytes(self.store.read_metadata(base)) if base_read else 0)
        self.last_load = {"version": version, "kind": "delta", "bytes": nbytes, "base_read": base_read}
        return params

    def _read_full(self, version: int, meta: dict, target: dict) -> Any:
        """A full version; kept as stored when the store uses deltas (its metadata says the
        publisher writes them, or a delta came by), as the base of the deltas to come."""
        every = meta.get("metadata", {}).get("delta_every")
        uses_deltas = self._deltas_seen or (type(every) is int and every > 1)
        if not (uses_deltas and isinstance(meta.get("leaves"), list)):
            return self.store.load(version, target)
        self._held = None
        stored = self.store.load(version, store_delta.stored_target(meta["leaves"], target))
        self._held = (version, stored)
        return as_target(stored, target, f"policy version {version}")


# A load makes about a thousand GIL-releasing numpy, zstd and hashing calls. Beside a
# thread that keeps the GIL (a worker's event loop and engine), each waits up to the
# switch interval (5 ms by default) to get it back: a 0.6 s delta took 9-11 s
# (benchmarks/delta_reload.py). Shorter handoffs while a load runs, process-wide.
_LOAD_SWITCH_INTERVAL_S = 1e-4
_switch_lock = threading.Lock()
_loads_running = 0


@contextlib.contextmanager
def _prompt_gil_handoffs():
    global _loads_running
    with _switch_lock:
        if _loads_running == 0:
            _prompt_gil_handoffs.saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_LOAD_SWITCH_INTERVAL_S, _prompt_gil_handoffs.saved))
        _loads_running += 1
    try:
        yield
    finally:
        with _switch_lock:
            _loads_running -= 1
            if _loads_running == 0:
                sys.setswitchinterval(_prompt_gil_handoffs.saved)


@functools.cache
def _adapter_target(cfg: ModelConfig, lora_cfg: lora.LoraConfig) -> dict:
    """The adapter's shapes for this model (no arrays allocated)."""
    with nnx.use_eager_sharding(False):
        adapted = nnx.eval_shape(lambda: lora.add_lora(Transformer(cfg, nnx.Rngs(0)), lora_cfg))
    return _placed(abstract_tree(nnx.to_pure_dict(nnx.state(adapted, nnx.LoRAParam))))


def _placed(target: dict) -> dict:
    """Each shape given this process's device. Without a sharding Orbax opens every array's
    stored metadata to choose one, and tensorstore (0.1.86) leaks what its `Spec.to_json`
    returns there: about ten lists and dicts per array per load, about 1 MB a minute in the
    soak's rollout job and evaluator (docs/RELIABILITY.md)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    placed = lambda x: x.update(sharding=device) if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None else x
    return jax.tree.map(placed, target)


def _bytes(meta: dict) -> int:
    """A version's size on storage (versions from before the store recorded it: its manifest's sum)."""
    if isinstance(meta.get("bytes"), int):
        return meta["bytes"]
    manifest = meta.get("manifest")
    return sum(e.get("bytes", 0) for e in manifest.values() if isinstance(e, dict)) if isinstance(manifest, dict) else 0


def _difference(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}: version {a.get(k)!r} vs here {b.get(k)!r}" for k in keys[:5])


def base_params(checkpoint: str | None) -> Callable[[], nnx.State] | None:
    """The base checkpoint's params, read when first called (only adapter versions need
    them); None without a checkpoint (the built-in policy has no base to adapt)."""
    if checkpoint is None:
        return None

    def read() -> nnx.State:
        from core.policy.formats.hf_weights import load_checkpoint

        _, model = load_checkpoint(checkpoint)
        return nnx.state(model, nnx.Param)

    return read
