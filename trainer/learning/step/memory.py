"""The memory check before a step first runs: XLA's own analysis of the compiled step
against the memory this process can still get. A step that cannot fit is refused at start
with the numbers, instead of asking for 85 GB (XLA's RESOURCE_EXHAUSTED) or being killed by
the OS half-way through a warm start.

What the check counts: the compiled step's temporaries plus its outputs that do not reuse a
donated input (`memory_analysis()`), beyond what is already resident (params, optimizer
state, the batch). What is free: on a CPU the host's available memory, lowered to the
cgroup's limit where a container sets one; on an accelerator the device's free bytes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax

GB = 1e9
# Left for everything the analysis does not see: Python, the data plane's buffers, the
# allocator's fragmentation.
HEADROOM_BYTES = 512 * 2**20
HEADROOM_FRACTION = 0.9


class StepDoesNotFit(ValueError):
    """Raised before the first run of a step that would not fit in memory."""


@dataclasses.dataclass(frozen=True)
class StepMemory:
    resident_bytes: int  # the step's arguments: params, optimizer state, reference, batch
    extra_bytes: int  # temporaries + outputs not aliased to a donated argument
    free_bytes: int | None  # what this process can still get (None: unknown)

    @property
    def total_bytes(self) -> int:
        return self.resident_bytes + self.extra_bytes

    def fits(self, budget: int | None = None) -> bool:
        """Whether the extra bytes fit in what is free, less headroom, and in `budget`."""
        if budget is not None and self.extra_bytes > budget:
            return False
        return self.free_bytes is None or self.extra_bytes + HEADROOM_BYTES <= HEADROOM_FRACTION * self.free_bytes


def analyse(compiled) -> tuple[int, int]:
    """(resident, extra) bytes of a compiled step (jax.stages.Compiled)."""
    m = compiled.memory_analysis()
    m = m[0] if isinstance(m, list) else m
    extra = m.temp_size_in_bytes + max(0, m.output_size_in_bytes - m.alias_size_in_bytes)
    return int(m.argument_size_in_bytes), int(extra)


def free_bytes(device=None) -> int | None:
    """Bytes this process can still allocate on `device` (default: the first)."""
    device = device or jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
        return None
    return host_free_bytes()


def host_free_bytes() -> int | None:
    """MemAvailable, or less where the cgroup's limit leaves less."""
    free = _meminfo_available()
    limit = _cgroup_room()
    if free is None:
        return limit
    return free if limit is None else min(free, limit)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_room() -> int | None:
    """The cgroup's limit minus its usage (v2, then v1); None without a limit."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            return max(0, int(limit) - usage)
        return None
    return None


def measure(compiled, free: int | None = None) -> StepMemory:
    """The compiled step's memory against `free` (default: what is free now)."""
    resident, extra = analyse(compiled)
    return StepMemory(resident, extra, free_bytes() if free is None else free)


def check_state(params_bytes: int, new_bytes: int, what: str, hint: str, free: int | None = None) -> None:
    """Before the optimizer's state is made: StepDoesNotFit, with the numbers, when its
    `new_bytes` cannot fit beside what is resident (`params_bytes`, already placed). On an
    accelerator a full fine-tune's Adam moments are the first thing that does not fit
    (Qwen2.5-1.5B: 6.2 GB of f32 params and 12.3 GB of moments on a 16 GB chip)."""
    found = StepMemory(params_bytes, new_bytes, free_bytes() if free is None else free)
    if not found.fits():
        raise StepDoesNotFit(
            f"{what} needs {found.total_bytes / GB:.1f} GB ({params_bytes / GB:.1f} GB of params, "
            f"{new_bytes / GB:.1f} GB of optimizer state), {found.free_bytes / GB:.1f} GB are free: {hint}"
        )
