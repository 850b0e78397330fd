"""The layout of a train step (remat, micro-batches), chosen by memory: the fastest of
ComputeConfig.layouts that XLA's own analysis of the compiled step says fits, or a refusal
with every layout's numbers.

Each try is a compile, so the search skips what cannot fit without compiling it: a step of
m micro-batches needs at least E(m0) x m0 / m when m0 needed E(m0) (the activations
shrink with 1/m; what does not shrink, the gradient sums, only adds), so a count whose
lower bound is over the limit is never compiled. The fastest layout fitting, the usual
case, costs one compile.

On an accelerator XLA may refuse a program outright at compile (RESOURCE_EXHAUSTED): that
counts as "does not fit", with the sizes its message gives, and the search goes on.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from trainer.learning.step import memory
from trainer.learning.step.gradients import ComputeConfig, Layout

_USED = re.compile(r"Used ([0-9.]+)([KMGT])? of ([0-9.]+)([KMGT])?")
_UNITS = {None: 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def is_out_of_memory(error: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(error) or "Ran out of memory" in str(error)


def exhausted_memory(error: Exception, free: int | None) -> memory.StepMemory:
    """The StepMemory an XLA out-of-memory error reports: 'Used X of Y' when it says so
    (everything counted as the step's extra), else unknown (-1) beyond the device's free."""
    found = _USED.search(str(error))
    if found is None:
        return memory.StepMemory(0, -1, free)
    used = float(found.group(1)) * _UNITS[found.group(2)]
    return memory.StepMemory(0, int(used), free)


def choose(
    compile_layout: Callable[[Layout], object],
    compute: ComputeConfig,
    rows: int,
    what: str,
    hint: str,
    free: int | None = None,
    backend: str | None = None,
) -> tuple[object, Layout, memory.StepMemory, list[tuple[Layout, memory.StepMemory | None]]]:
    """(compiled step, its layout, its memory, every layout considered with its memory or
    None where skipped unseen). `compile_layout(layout)` compiles the step in that layout.
    free: the bytes the step may use (default: the device's free memory now); backend:
    whose layouts (default: JAX's). Raises
    memory.StepDoesNotFit, naming each layout's needs and `hint`, when none fits."""
    free = memory.free_bytes() if free is None else free
    budget = int(compute.memory_gb * memory.GB) if compute.memory_gb else None
    tried: list[tuple[Layout, memory.StepMemory | None]] = []
    seen: dict[bool, tuple[int, int]] = {}  # remat -> (micro-batches, extra bytes) of the last compiled
    for layout in compute.layouts(rows, backend):
        if layout.remat in seen:
            m0, extra0 = seen[layout.remat]
            floor = memory.StepMemory(0, extra0 * m0 // layout.micro_batches, free)
            if extra0 >= 0 and not floor.fits(budget):
                tried.append((layout, None))
                continue
        try:
            compiled = compile_layout(layout)
        except Exception as e:  # XLA's refusal at compile, on an accelerator
            if not is_out_of_memory(e):
                raise
            found = exhausted_memory(e, free)
        else:
            found = memory.measure(compiled, free)
            if found.fits(budget):
                tried.append((layout, found))
                return compiled, layout, found, tried
        tried.append((layout, found))
        seen[layout.remat] = (layout.micro_batches, found.extra_bytes)
    raise memory.StepDoesNotFit(refusal(what, tried, free, budget, hint))


def refusal(what: str, tried, free: int | None, budget: int | None, hint: str) -> str:
    def need(found):
        if found is None:
            return "skipped (cannot fit by the counts above)"
        if found.extra_bytes < 0:
            return "refused by XLA: out of memory"
        return f"{found.total_bytes / memory.GB:.1f} GB ({found.extra_bytes / memory.GB:.1f} GB while it runs)"

    limit = f"{free / memory.GB:.1f} GB are free" if free is not None else "free memory unknown"
    if budget is not None:
        limit += f", --step_memory_gb allows {budget / memory.GB:.1f} GB"
    layouts = "; ".join(f"{layout}: {need(found)}" for layout, found in tried)
    return f"{what} fits in no layout ({limit}): {layouts}. {hint}"
