"""Shared output helpers for the benchmark scripts: tables and the machine they ran on."""

from __future__ import annotations

import os
import platform
import subprocess

try:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    _console = Console(width=400)
except ImportError:  # plain aligned text
    _console = None


def print_table(title: str, columns: list[str], rows: list[list], note: str = "") -> None:
    cells = [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    if _console is not None:
        t = Table(title=title, box=box.MARKDOWN, title_justify="left")
        for c in columns:
            t.add_column(c, justify="right")
        for r in cells:
            t.add_row(*r)
        _console.print(t)
    else:
        widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
        print(title)
        print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
        for r in cells:
            print("  ".join(x.rjust(w) for x, w in zip(r, widths)))
    if note:
        print(note)
    print(flush=True)


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
            return f"{x:.3g}"
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return str(x)


def machine_info() -> dict:
    info = {"python": platform.python_version(), "nproc": os.cpu_count()}
    try:
        info["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip())
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
        with open("/proc/meminfo") as f:
            info["ram_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    import jax

    info["jax"] = f"{jax.__version__} ({jax.default_backend()}, {jax.device_count()} device)"
    return info


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


class Interrupted(BaseException):
    """SIGTERM or SIGHUP to a benchmark: unwind through every `with`/`finally`, as Ctrl-C does."""


def _interrupt(signum, _frame):
    import signal

    raise Interrupted(signal.Signals(signum).name)


def stop_children_on_exit() -> None:
    """Whatever this benchmark starts dies with it, however it ends: SIGTERM and SIGHUP
    unwind (so each process group is stopped in order), and a watchdog process stops any
    group still registered if this process is SIGKILLed."""
    import signal

    from localstack.launch.processes import start_watchdog

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    start_watchdog()
