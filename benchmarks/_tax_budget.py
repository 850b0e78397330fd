"""Where a rollout job's core goes: a per-trajectory time budget from a profile.

`BudgetProbe` watches the rollout job this process started (and the Pub/Sub emulator on
the same core) over a window: every thread's CPU time from /proc, and, when py-spy is
installed, the job's Python stacks sampled on-CPU only. A Python thread's CPU time is
split over categories by where its on-CPU samples fall; a thread py-spy does not see (XLA's
compute pool, gRPC's pollers, the emulator's JVM) goes to a category by its name. What the
pinned core did not spend is idle. Divided by the trajectories the job made in the window,
it is milliseconds of the core per trajectory.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

# The first matching rule names a stack's category (frames are "function (file:line)").
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("environment", ("environments/",)),
    ("engine", ("core/policy/sampling/sampler.py", "rollout/engine.py", "jax/", "jaxlib/")),
    ("policy reload", ("core/policy/versions.py", "rollout/policy_poller.py", "core/contracts/store.py")),
    ("dedup", ("pipelines/dedup.py",)),
    ("packing", ("pipelines/packing.py", "pipelines/pack_transform.py", "pipelines/bucketing.py", "records.py")),
    ("pub/sub", ("pubsub_v1/", "grpc/", "pipelines/pubsub_write.py", "core/contracts/pubsub_io.py", "google/api_core")),
    ("episode loop", ("rollout/episodes.py", "rollout/worker.py", "core/policy/text/chat_format.py", "asyncio/")),
    ("beam bookkeeping", ("apache_beam/",)),
]
ORDER = [name for name, _ in CATEGORIES] + [
    "telemetry / other",
    "unnamed native threads",  # C++ threads that kept the process's name (XLA's runtime, by their birth order)
    "pub/sub emulator",
    "other processes",  # anything else the core ran in the window (not this benchmark's)
    "idle",
]


def categorize(stack: str) -> str:
    frames = stack.split(";")[1:]  # the first is the thread
    for name, needles in CATEGORIES:
        for frame in reversed(frames):  # the innermost frame that matches decides
            if any(n in frame for n in needles):
                return name
    return "telemetry / other"


def _native_category(thread_name: str) -> str:
    n = thread_name.lower()
    if "grpc" in n or "pubsub" in n:
        return "pub/sub"
    if n.startswith(("xla", "tsl", "tf_", "eigen", "jax")) or "pjrt" in n:
        return "engine"
    return "unnamed native threads" if n == "python" else "telemetry / other"


def _thread_cpu(proc: psutil.Process) -> dict[int, tuple[str, float]]:
    out = {}
    for t in proc.threads():
        try:
            name = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            name = "?"
        out[t.id] = (name, t.user_time + t.system_time)
    return out


def _cpu(p: psutil.Process) -> float:
    c = p.cpu_times()
    return c.user + c.system


def _emulator_cpu(job: psutil.Process) -> float:
    """CPU seconds of this process's other descendants: the emulator (gcloud's wrapper and its
    JVM), which runs on the job's core; not the job, not py-spy."""
    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid != job.pid and "py-spy" not in p.name():
                total += _cpu(p)
        except psutil.Error:
            pass
    return total


class BudgetProbe(threading.Thread):
    """Start before the job; it finds the job's process (`pipelines.job` in the command
    line), waits `delay_s`, then measures for `window_s`."""

    def __init__(self, delay_s: float, window_s: float, cores: set[int]):
        super().__init__(name="budget-probe", daemon=True)
        self.delay_s, self.window_s, self.cores = delay_s, window_s, sorted(cores)
        self.pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.result: dict | None = None

    def _find(self, needle: str, timeout_s: float = 300.0) -> psutil.Process | None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for p in psutil.Process().children(recursive=True):
                try:
                    if any(needle in part for part in p.cmdline()):
                        return p
                except psutil.Error:
                    pass
            time.sleep(0.5)
        return None

    def run(self) -> None:
        job = self._find("pipelines.job")
        if job is None:
            return
        time.sleep(self.delay_s)
        before, job_before = _thread_cpu(job), _cpu(job)
        emu_before, core_before = _emulator_cpu(job), self._core_times()
        raw = Path(tempfile.mkdtemp()) / "stacks.txt"
        start = time.monotonic()
        have_pyspy = Path(self.pyspy).exists()
        if have_pyspy:  # on-CPU samples only (no --idle); py-spy itself runs off the job's core
            cmd = [self.pyspy, "record", "-p", str(job.pid), "-d", str(int(self.window_s)), "-r", "50"]
            rest = sorted(set(range(os.cpu_count() or 1)) - set(self.cores)) or self.cores
            subprocess.run(
                ["taskset", "-c", ",".join(map(str, rest)), *cmd, "--threads", "--format", "raw", "-o", str(raw)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        time.sleep(max(0.0, self.window_s - (time.monotonic() - start)))
        wall = time.monotonic() - start
        after, job_s = _thread_cpu(job), _cpu(job) - job_before
        emu_s = _emulator_cpu(job) - emu_before
        busy_s, idle_s = (a - b for a, b in zip(self._core_times(), core_before))
        budget = self._budget(before, after, raw if have_pyspy and raw.exists() else None, wall)
        # Threads that ended in the window (the Pub/Sub client's publish batches) are in
        # the process's time but in no thread's.
        budget["seconds"]["pub/sub"] = budget["seconds"].get("pub/sub", 0.0) + max(
            0.0, job_s - sum(budget["seconds"].values())
        )
        budget["seconds"]["pub/sub emulator"] = emu_s
        budget["seconds"]["other processes"] = max(0.0, busy_s - job_s - emu_s)
        budget["seconds"]["idle"] = idle_s
        self.result = budget

    def _core_times(self) -> tuple[float, float]:
        """(busy, idle) seconds of the probed cores, from /proc/stat."""
        per = psutil.cpu_times(percpu=True)
        idle = sum(per[c].idle + per[c].iowait for c in self.cores)
        return sum(sum(per[c]) for c in self.cores) - idle, idle

    def _budget(self, before, after, raw: Path | None, wall: float) -> dict:
        samples: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        if raw is not None:
            for line in raw.read_text().splitlines():
                stack, n = line.rsplit(" ", 1)
                tid = int(stack.split("(", 1)[1].split(")", 1)[0])
                samples[tid][categorize(stack)] += int(n)
        seconds: collections.Counter = collections.Counter()
        for tid, (name, cpu) in after.items():
            used = cpu - before.get(tid, (name, 0.0))[1]
            if used <= 0:
                continue
            split = samples.get(tid)
            if split:
                total = sum(split.values())
                for cat, n in split.items():
                    seconds[cat] += used * n / total
            else:
                seconds[_native_category(name)] += used
        return {"window_s": wall, "seconds": dict(seconds), "profiled": raw is not None}


def budget_rows(budget: dict, trajectories_per_s: float) -> list[list]:
    """[category, share of the core, ms per trajectory] rows, in ORDER."""
    seconds, wall = budget["seconds"], budget["window_s"]
    total = sum(seconds.values())
    per_traj = 1000.0 / (trajectories_per_s * wall) if trajectories_per_s else 0.0
    rows = [[c, seconds.get(c, 0.0) / total, seconds.get(c, 0.0) * per_traj] for c in ORDER]
    rows.append(["total", 1.0, total * per_traj])
    return rows
