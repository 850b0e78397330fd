"""Stops a run's process groups when the process that started them dies, however it dies.

A launcher's own teardown (`with ProcessGroup(...)`, its SIGTERM handler) cannot run when
it is SIGKILLed, runs out of memory or loses its terminal: its children would then live
on under init (the emulator's JVM, a Beam pipeline at half a core). So the launcher starts
one watchdog, in a session of its own so no signal meant for the launcher's group reaches
it, and registers every process group it starts in a small file:

    python -m localstack.launch.watchdog --parent PID --registry FILE

The watchdog polls every `--poll_s`; once PID is gone it SIGTERMs each registered group,
SIGKILLs what is left after a grace period, deletes the registry and exits. It also exits
(killing nothing) if the registry file is deleted: the launcher ended normally. Groups
are unregistered when their owner stops them, so a reused group id is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from core import config
from core.config import configclass, knob


@configclass
class WatchdogConfig:
    parent: int = knob(help="the launcher's pid: its exit is what the watchdog waits for")
    registry: str = knob(help="the file of process groups the launcher registered")
    poll_s: float = knob(0.25, "seconds between checks of the launcher and the registry")
    grace_s: float = knob(3.0, "seconds between SIGTERM and SIGKILL of the groups")


def read_registry(path: Path) -> list[int]:
    """Group ids registered ("+PGID") and not unregistered ("-PGID") since, in order."""
    live: dict[int, None] = {}
    try:
        lines = path.read_text().split()
    except OSError:
        return []
    for line in lines:
        if line[:1] in "+-" and line[1:].isdigit():
            if line[0] == "+":
                live[int(line[1:])] = None
            else:
                live.pop(int(line[1:]), None)
    return list(live)


def group_alive(pgid: int) -> bool:
    """True while a non-zombie process is in the group (zombies hold no port)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # fields after the ")" closing the command name: state ppid pgrp ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"  # a zombie parent is dead: nothing will reap or stop its children


def stop_groups(pgids: list[int], grace_s: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        for g in pgids:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + wait
        while time.monotonic() < end and any(group_alive(g) for g in pgids):
            time.sleep(0.05)


def watch(parent: int, registry: Path, poll_s: float, grace_s: float) -> int:
    while True:
        if not registry.exists():
            return 0  # the launcher cleaned up after itself
        if not alive(parent):
            stop_groups(read_registry(registry), grace_s)
            registry.unlink(missing_ok=True)
            return 0
        time.sleep(poll_s)


class Watchdog:
    """The launcher's side: `Watchdog.start()` spawns the watchdog for this process;
    `register(pgid)` / `unregister(pgid)` as groups start and stop; `close()` on a normal
    exit (the watchdog then exits without killing anything)."""

    def __init__(self, registry: Path, proc: subprocess.Popen):
        self.registry, self.proc = registry, proc
        self._lock = threading.Lock()

    @classmethod
    def start(cls, registry: Path, **settings) -> Watchdog:
        """`settings`: WatchdogConfig fields other than parent and registry."""
        registry.parent.mkdir(parents=True, exist_ok=True)
        registry.write_text("")
        cfg = WatchdogConfig(parent=os.getpid(), registry=str(registry), **settings)
        cmd = [sys.executable, "-m", "localstack.launch.watchdog", *config.to_argv(cfg)]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True, cwd=_repo_root()
        )
        return cls(registry, proc)

    def register(self, pgid: int) -> None:
        self._append(f"+{pgid}\n")

    def unregister(self, pgid: int) -> None:
        self._append(f"-{pgid}\n")

    def _append(self, line: str) -> None:
        with self._lock, self.registry.open("a") as f:
            f.write(line)

    def close(self) -> None:
        self.registry.unlink(missing_ok=True)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[1])


def main(argv=None) -> int:
    cfg = config.parse(WatchdogConfig, argv, description=__doc__)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the launcher is not for us
    return watch(cfg.parent, Path(cfg.registry), cfg.poll_s, cfg.grace_s)


if __name__ == "__main__":
    sys.exit(main())
