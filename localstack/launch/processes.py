"""Child processes in their own process group, stopped as a whole.

A wrapper (gcloud, a Beam runner) may spawn children; killing only the leader would
leave them running. Each ProcessGroup owns a session, and stop() signals the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

# The watchdog is the lower layer (it runs alone, as its own process): it never imports this.
from localstack.launch.watchdog import Watchdog, group_alive


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the group (VmRSS summed; 0 once all are gone)."""
    total = 0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue  # the process exited while we looked
    return total


def machine_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


_watchdog = None  # this process's localstack.launch.watchdog.Watchdog, once started


def start_watchdog():
    """From now on every process group this process starts (ProcessGroup, the emulators)
    is stopped by a watchdog process if this process dies without stopping it: SIGKILL,
    OOM, a crash. Idempotent; the watchdog exits quietly when this process exits normally."""
    global _watchdog
    if _watchdog is None:
        import atexit
        import tempfile

        fd, registry = tempfile.mkstemp(prefix="agentic-rl-watchdog-", suffix=".groups")
        os.close(fd)
        _watchdog = Watchdog.start(Path(registry))
        atexit.register(_watchdog.close)
    return _watchdog


def track(pgid: int) -> None:
    if _watchdog is not None:
        _watchdog.register(pgid)


def untrack(pgid: int) -> None:
    if _watchdog is not None:
        _watchdog.unregister(pgid)


def kill_group(proc: subprocess.Popen, term_grace_s: float = 5.0) -> None:
    """SIGTERM the whole group, then SIGKILL whatever is left after the grace period."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    for sig, grace in ((signal.SIGTERM, term_grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + grace
        while time.monotonic() < end and group_alive(pgid):
            proc.poll()  # reap the leader so it does not linger as a zombie
            time.sleep(0.05)
        if not group_alive(pgid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class ProcessGroup:
    """`with ProcessGroup(cmd, log_path, env) as pg:` runs cmd with output to log_path."""

    def __init__(
        self,
        cmd: list[str],
        log_path: str | os.PathLike,
        env: dict | None = None,
        cwd: str | None = None,
        cpus: set[int] | None = None,
    ):
        self.cmd, self.log_path, self.env, self.cwd = cmd, Path(log_path), env, cwd
        self.cpus = cpus  # pin the child (and all it starts) to these cores
        self.proc: subprocess.Popen | None = None
        # The group's resident memory at the last poll while it ran, and the most seen: what
        # a process killed by the OS (out of memory) had reached.
        self.last_rss = self.peak_rss = 0

    def start(self) -> ProcessGroup:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # taskset, not a preexec_fn: a forking preexec in a process that runs JAX threads
            # can deadlock; the mask is set before exec, so every thread inherits it.
            cmd = ["taskset", "-c", ",".join(map(str, sorted(self.cpus))), *self.cmd] if self.cpus else self.cmd
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        track(self.proc.pid)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            rss = group_rss_bytes(self.proc.pid)
            if rss:
                self.last_rss, self.peak_rss = rss, max(self.peak_rss, rss)
        return code

    def exit_description(self) -> str:
        """How the process ended, in words: a SIGKILL nobody here sent is most likely the
        OS's out-of-memory killer, so it is named with the memory the group last held."""
        code = self.poll()
        if code is None:
            return "still running"
        if code >= 0:
            return f"exited with {code}"
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
        text = f"was killed by {name} ({code})"
        if code == -signal.SIGKILL:
            last, peak, total = (x / 1e9 for x in (self.last_rss, self.peak_rss, machine_memory_bytes()))
            text += (
                f": most likely the OS's out-of-memory killer: its last resident memory was {last:.1f} GB "
                f"(peak {peak:.1f} GB) of this machine's {total:.1f} GB"
            )
        return text

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def stop(self, term_grace_s: float = 5.0) -> None:
        if self.proc is not None:
            kill_group(self.proc, term_grace_s)
            untrack(self.proc.pid)

    def __enter__(self) -> ProcessGroup:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
