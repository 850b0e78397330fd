"""A reader's reload of a store's versions, full against delta, alone and under contention.

    .venv/bin/python benchmarks/delta_reload.py --store RUN/policy-store --model DIR

Loads every complete version of a store that a `--delta_every` run wrote, in order, with
the `VersionLoader` a rollout worker builds (a delta is applied to the full version the
loader holds), four times: alone; beside two processes that keep both cores busy; beside
one Python thread that holds the GIL, as a worker's event loop and engine threads do, with
the loader's short GIL handoffs (core/policy/versions.py) and with Python's default 5 ms.
Prints the seconds of each load and the loading thread's CPU seconds in it. Nothing is written to the store.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import machine_info, print_table

from core import config
from core.config import configclass, knob
from core.contracts.store import PolicyStore
from core.policy import versions
from core.policy.model.transformer import abstract_model, split_params
from core.policy.sources import policy_spec
from core.policy.versions import VersionLoader


@configclass
class DeltaReloadConfig:
    store: str = knob(help="a policy store a --delta_every run wrote")
    model: str | None = knob(None, "the checkpoint the run trained (unset: the built-in policy)")


def _spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def _burn() -> None:
    while True:
        pass


def _load_all(store: PolicyStore, spec, template) -> list[tuple[int, str, float, float]]:
    """(version, kind, wall s, the loading thread's CPU s) of each version loaded in turn."""
    loader = VersionLoader(store, spec.cfg, template)
    out = []
    for v in store.versions():
        t0 = time.perf_counter()
        loader.load(v)
        out.append((v, loader.last_load["kind"], time.perf_counter() - t0, loader.last_load["cpu_s"]))
    return out


def main(argv=None) -> int:
    cfg = config.parse(DeltaReloadConfig, argv, description=__doc__, prog="benchmarks/delta_reload.py")
    store, spec = PolicyStore(cfg.store), policy_spec(cfg.model)
    template = split_params(abstract_model(spec.cfg))[1]
    runs = {"nothing": _load_all(store, spec, template)}
    burners = [mp.get_context("spawn").Process(target=_burn, daemon=True) for _ in range(2)]
    for p in burners:
        p.start()
    try:
        runs["two processes burning both cores"] = _load_all(store, spec, template)
    finally:
        for p in burners:
            p.terminate()
            p.join()
    for label, handoff_s in (("", versions._LOAD_SWITCH_INTERVAL_S), (", Python's 5 ms handoffs", 5e-3)):
        versions._LOAD_SWITCH_INTERVAL_S = handoff_s  # the loader's shorter GIL handoffs, or none
        stop = threading.Event()
        spinner = threading.Thread(target=_spin, args=(stop,), daemon=True)
        spinner.start()
        try:
            runs["one Python thread holding the GIL" + label] = _load_all(store, spec, template)
        finally:
            stop.set()
            spinner.join()
    print(machine_info())
    rows = [
        [beside, f"v{v} {kind}", f"{s:.2f}", f"{cpu:.2f}"]
        for beside, loads in runs.items()
        for v, kind, s, cpu in loads
    ]
    print_table("reload seconds, in store order", ["beside", "version", "load s", "loading thread CPU s"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
