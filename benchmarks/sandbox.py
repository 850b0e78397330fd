"""Sandbox overhead: runs/s and latency of a trivial program ("print(1)").

    python benchmarks/sandbox.py [--n 50] [--concurrency 4]

Rows: the bwrap sandbox (`run_python`), the rlimits-only fallback (`bwrap=None`), and a
plain `subprocess.run([python, "-c", ...])` with no bounds at all, all sequential; then the
bwrap sandbox with `--concurrency` runs in flight (threads), which is how a rollout worker
uses it. Latency is per run; runs/s is runs divided by the wall time of the whole row.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from core import config
from core.config import configclass, knob
from environments import sandbox

SOURCE = "print(1)"


def bwrap_run() -> None:
    r = sandbox.run_python(SOURCE)
    assert r.ok and r.isolated and r.stdout == "1\n", r


def fallback_run() -> None:
    r = sandbox.run_python(SOURCE, bwrap=None)
    assert r.ok and not r.isolated and r.stdout == "1\n", r


def plain_run() -> None:
    r = subprocess.run([sandbox.PYTHON, "-c", SOURCE], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "1\n", r


def measure(fn, n: int, concurrency: int = 1) -> dict:
    fn()  # warm-up: the one-off bwrap probe, page cache
    lat: list[float] = []

    def timed(_):
        t = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(timed, range(n)))
    total = time.perf_counter() - start
    lat.sort()
    return {
        "runs/s": n / total,
        "mean": statistics.fmean(lat),
        "p50": lat[len(lat) // 2],
        "p95": lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))],
    }


@configclass
class SandboxBenchConfig:
    n: int = knob(50, "runs per row")
    concurrency: int = knob(4, "runs in flight in the last row")


def main(argv=None) -> None:
    args = config.parse(SandboxBenchConfig, argv, description=__doc__)
    rows = [
        ("bwrap sandbox (run_python)", bwrap_run, 1),
        ("rlimits-only fallback (bwrap=None)", fallback_run, 1),
        ("plain subprocess.run, no bounds", plain_run, 1),
        (f"bwrap sandbox, {args.concurrency} in flight", bwrap_run, args.concurrency),
    ]
    print(
        f"n={args.n} runs per row, program {SOURCE!r}, python {sandbox.PYTHON}, "
        f"{os.cpu_count()} CPUs, euid {os.geteuid()}"
    )
    print("| mode | runs/s | mean ms | p50 ms | p95 ms |")
    print("|---|---:|---:|---:|---:|")
    for name, fn, conc in rows:
        m = measure(fn, args.n, conc)
        print(
            f"| {name} | {m['runs/s']:.1f} | {1e3 * m['mean']:.1f} | {1e3 * m['p50']:.1f} | {1e3 * m['p95']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
