"""What a delta version costs against a full one, on the versions a real run published.

    .venv/bin/python benchmarks/delta_versions.py --store RUN/policy-store [--json FILE]

Reads the store's complete versions (at least two), takes the oldest as the full base and
encodes every later one as a delta against it (core/contracts/store_delta.py), as
`--delta_every K` would with the base K versions back: in the dtype the store holds, and in
bf16 (what `--publish_bf16` stores). Per version: the full version's bytes on disk, the
delta's bytes and share, the changed elements, and the seconds to encode and to apply
(rebuild + sha256 check). Nothing is written to the store.

--reload DIR: what a rollout worker's reload costs. Two scratch stores under DIR get the
same versions, one all full, one the oldest full and the rest deltas against it; per
version and dtype, the seconds and bytes of `PolicyStore.load` of the full version
(checksums, then Orbax) against `load_delta` on the base the reader holds.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from _report import machine_info, print_table

from core import config
from core.config import configclass, knob
from core.contracts import store_delta
from core.contracts.store import PolicyStore


@configclass
class DeltaBenchConfig:
    store: str = knob(help="a policy store a run wrote (a local directory)")
    json: str | None = knob(None, "also write the rows here")
    reload: str | None = knob(None, "measure reloads in scratch stores under this directory (removed after)")


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def read_version(store: PolicyStore, version: int) -> dict:
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.restore(os.fspath(store.version_path(version)))
    return jax.tree.map(np.asarray, tree)


def as_bf16(tree: dict) -> dict:
    return jax.tree.map(lambda v: v.astype(ml_dtypes.bfloat16) if v.dtype.kind == "f" else v, tree)


def reloads(versions: dict[int, dict], scratch: Path, dtype: str) -> list[dict]:
    """Per later version: full load against delta applied to the held base (seconds, bytes)."""
    shutil.rmtree(scratch, ignore_errors=True)
    full, deltas = PolicyStore(scratch / "full"), PolicyStore(scratch / "delta")
    (base_v, base), *later = sorted(versions.items())
    for store in (full, deltas):
        store.publish(base_v, base)
    for v, params in later:
        full.publish(v, params)
        deltas.publish(v, params, delta_of=base_v, base_params=base)
    out = []
    for v, params in later:
        t0 = time.perf_counter()
        full.load(v, params)
        full_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        deltas.load_delta(v, base, base_v)
        delta_s = time.perf_counter() - t0
        full_bytes, delta_bytes = (disk_bytes(Path(s.version_path(v))) for s in (full, deltas))
        out.append({
            "version": v, "dtype": dtype, "full_s": full_s, "delta_s": delta_s,
            "full_bytes": full_bytes, "delta_bytes": delta_bytes,
        })  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def measure(new: dict, base: dict) -> dict:
    t0 = time.perf_counter()
    delta = store_delta.encode(new, base)
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rebuilt = store_delta.decode(delta.header(), b"".join(delta.parts), base)
    apply_s = time.perf_counter() - t0
    pairs = list(zip(jax.tree.leaves(new), jax.tree.leaves(base)))
    assert all(
        np.array_equal(r.view(np.uint8), n.view(np.uint8))
        for r, n in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(new))
    )
    changed = sum(int(np.count_nonzero(n.view(np.uint8) != b.view(np.uint8))) for n, b in pairs)
    total = sum(n.nbytes for n, _ in pairs)
    share = changed / total
    return {"delta_bytes": delta.nbytes, "changed_byte_share": share, "encode_s": encode_s, "apply_s": apply_s}


def main(argv=None) -> int:
    args = config.parse(DeltaBenchConfig, argv)
    store = PolicyStore(args.store)
    versions = store.versions()
    if len(versions) < 2:
        raise SystemExit(f"{args.store} holds {len(versions)} complete version(s): need two or more")
    base_v, *later = versions
    base = read_version(store, base_v)
    stored = jax.tree.leaves(base)[0].dtype.name
    full = {v: disk_bytes(Path(store.version_path(v))) for v in versions}
    base16 = as_bf16(base)
    bf16_full = sum(
        x.nbytes for x in jax.tree.leaves(base16)
    )  # raw bytes; Orbax's zstd takes little off random-ish bits
    rows, out = [], []
    kept = {base_v: base}
    for v in later:
        new = kept[v] = read_version(store, v)
        m, m16 = measure(new, base), measure(as_bf16(new), base16)
        out.append({"version": v, "base": base_v, "full_bytes": full[v], stored: m, "bfloat16": m16})
        rows.append([
            f"v{v} against v{base_v}", full[v] / 1e6, m["delta_bytes"] / 1e6, m["delta_bytes"] / full[v],
            m["changed_byte_share"], m["encode_s"], m["apply_s"],
            m16["delta_bytes"] / 1e6, m16["delta_bytes"] / bf16_full, m16["changed_byte_share"],
        ])  # fmt: skip
    print_table(
        f"delta versions of {args.store} ({len(versions)} versions; stored {stored}; bf16: the same cast down)",
        ["version", "full MB (disk)", f"delta MB ({stored})", "share", "bytes changed", "encode s", "apply s",
         "delta MB (bf16)", "share of raw bf16", "bf16 bytes changed"],
        rows,
    )  # fmt: skip
    reload_rows = []
    if args.reload:
        for name, tree in ((stored, kept), ("bfloat16", {v: as_bf16(p) for v, p in kept.items()})):
            reload_rows += reloads(tree, Path(args.reload) / name, name)
        print_table(
            "a reader's reload: PolicyStore.load of the full version against load_delta on the held base",
            ["version", "dtype", "full s", "full MB read", "delta s", "delta MB read", "time ratio"],
            [[f"v{r['version']}", r["dtype"], r["full_s"], r["full_bytes"] / 1e6, r["delta_s"], r["delta_bytes"] / 1e6,
              r["delta_s"] / r["full_s"]] for r in reload_rows],
        )  # fmt: skip
    if args.json:
        result = {"command": "python benchmarks/delta_versions.py " + " ".join(argv or sys.argv[1:]), "rows": out}
        result["reloads"] = reload_rows
        Path(args.json).write_text(json.dumps({**result, "machine": machine_info()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
