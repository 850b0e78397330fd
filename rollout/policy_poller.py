"""A rollout worker's view of the policy store: poll LATEST, reload newer versions.

Polls at most every `poll_interval_s`, either when asked (`maybe_reload`) or from a
background thread (`start_polling`), so loading never stalls decoding; the engine reads
`current` between steps and picks the new version up atomically. A failed load keeps
the current version and is counted. Only complete versions are ever loaded (the store
writes LATEST last, and `load` refuses a version without its commit marker), and only
intact ones (`load` checks every file against the version's checksum manifest).
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from flax import nnx

from core.contracts.store import ChecksumError, PolicyStore, StoreError
from core.policy.sampling.sampler import cast_params
from core.policy.versions import VersionLoader
from core.telemetry import trace

log = logging.getLogger(__name__)


class PolicyHandle:
    def __init__(
        self,
        store: PolicyStore,
        template_params: nnx.State,
        poll_interval_s: float = 1.0,
        tracer=trace.NULL,
        loader: VersionLoader | None = None,
        clock=time.monotonic,
        dtype=None,
    ):
        """loader: how a version becomes params (a LoRA adapter is merged into the base);
        default: whole-model versions of the template's shapes. dtype: what the engine serves
        them in, cast once per version as it is loaded (None: as loaded)."""
        self.store, self.tracer = store, tracer
        self.dtype = dtype
        self.poll_interval_s = poll_interval_s
        self._loader = loader or VersionLoader(store, None, template_params)
        self._clock = clock
        self._last_poll = float("-inf")
        self.current: tuple[nnx.State, int] | None = None  # swapped as one reference
        self.reloads = 0
        # Cumulative, by what was read (full or delta): reloads, bytes fetched, seconds, and
        # the loading thread's CPU seconds (a load starved of a core shows seconds >> cpu_s).
        self.reload_totals: collections.Counter = collections.Counter()
        self.failed_loads = 0
        self.checksum_failures = 0  # of failed_loads: files that differ from their manifest (corruption)

    @property
    def params(self) -> nnx.State | None:
        return self.current[0] if self.current else None

    @property
    def version(self) -> int | None:
        return self.current[1] if self.current else None

    def start_polling(self) -> None:
        def poll():  # a daemon: it lives as long as the worker process
            while True:
                time.sleep(self.poll_interval_s)
                self.maybe_reload(force=True)

        threading.Thread(target=poll, name="policy-poller", daemon=True).start()

    def wait_for_first(self, timeout_s: float, sleep_s: float = 0.2) -> None:
        deadline = time.monotonic() + timeout_s
        while self.version is None:
            self.maybe_reload(force=True)
            if self.version is not None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no policy version appeared in {self.store.root} within {timeout_s}s")
            time.sleep(sleep_s)

    def maybe_reload(self, force: bool = False) -> bool:
        """True when a newer version was loaded by this call."""
        now = self._clock()
        if not force and now - self._last_poll < self.poll_interval_s:
            return False
        self._last_poll = now
        try:
            latest = self.store.latest_version()
            if latest is None or (self.version is not None and latest <= self.version):
                return False
            with self.tracer.span("policy reload", "policy", version=latest):
                state, _ = self._loader.load(latest)
                if self.dtype is not None:
                    state = cast_params(state, self.dtype)
        except StoreError as e:
            self.failed_loads += 1
            if isinstance(e, ChecksumError):
                self.checksum_failures += 1
            self.tracer.instant("policy reload failed", "policy", error=str(e)[:200])
            log.warning("policy reload failed, keeping version %s: %s", self.version, e)
            return False
        self.current = (state, latest)
        self.reloads += 1
        load = self._loader.last_load or {}
        kind = load.get("kind", "full")
        self.reload_totals[f"{kind}_n"] += 1
        self.reload_totals[f"{kind}_bytes"] += int(load.get("bytes") or 0)
        self.reload_totals[f"{kind}_s"] += float(load.get("seconds") or 0.0)
        self.reload_totals[f"{kind}_cpu_s"] += float(load.get("cpu_s") or 0.0)
        return True
