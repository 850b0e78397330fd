"""What a delta version costs against a full one, on the versions a real run published.

    .venv/bin/python benchmarks/delta_versions.py --store RUN/policy-store [--json FILE]

Reads the store's complete versions (at least two), takes the oldest as the full base and
encodes every later one as a delta against it (core/contracts/store_delta.py), as
`--delta_every K` would with the base K versions back: in the dtype the store holds, and in
bf16 (what `--publish_bf16` stores). Per version: the full version's bytes on disk, the
delta's bytes and share, the changed elements, and the seconds to encode and to apply
(rebuild + sha256 check). Nothing is written to the store.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def read_version(store: PolicyStore, version: int) -> dict:
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.restore(os.fspath(store.version_path(version)))
    return {k: np.asarray(v) for k, v in _flat(tree).items()}


def _flat(tree, prefix="") -> dict:
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}/{k}") if isinstance(v, dict) else {f"{prefix}/{k}": v})
    return out


def as_bf16(tree: dict) -> dict:
    return {k: v.astype(ml_dtypes.bfloat16) if v.dtype.kind == "f" else v for k, v in tree.items()}


def measure(new: dict, base: dict) -> dict:
    t0 = time.perf_counter()
    delta = store_delta.encode(new, base)
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rebuilt = store_delta.decode(delta.header(), b"".join(delta.parts), base)
    apply_s = time.perf_counter() - t0
    assert all(np.array_equal(rebuilt[k].view(np.uint8), new[k].view(np.uint8)) for k in new)
    changed = sum(int(np.count_nonzero(new[k].view(np.uint8) != base[k].view(np.uint8))) for k in new)
    total = sum(v.nbytes for v in new.values())
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
    stored = next(iter(base.values())).dtype.name
    full = {v: disk_bytes(Path(store.version_path(v))) for v in versions}
    base16 = as_bf16(base)
    bf16_full = sum(x.nbytes for x in base16.values())  # raw bytes; Orbax's zstd takes little off random-ish bits
    rows, out = [], []
    for v in later:
        new = read_version(store, v)
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
    if args.json:
        result = {"command": "python benchmarks/delta_versions.py " + " ".join(argv or sys.argv[1:]), "rows": out}
        Path(args.json).write_text(json.dumps({**result, "machine": machine_info()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
