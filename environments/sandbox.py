"""Run untrusted Python source with hard bounds: bubblewrap + seccomp + a throwaway uid + rlimits.

Model-written code is hostile, so every run gets, in layers:
  - bwrap: every namespace unshared (no network), a fresh pid namespace whose pid 1 dies
    with us (`--die-with-parent`), read-only /usr and nothing else from the host, a
    size-capped private tmpfs /tmp as the only writable place, a clean environment,
    uid 65534 inside, read-only `/` and `/dev` (both are RAM-backed tmpfs otherwise).
  - a seccomp filter (`_sandbox_seccomp`, loaded by bwrap): EPERM for the syscalls where
    kernel escapes live and that no answer needs (ptrace, keyctl, bpf, perf_event_open,
    userfaultfd, mount and namespace calls, clone with a namespace flag, module loading, ...),
    ENOSYS for clone3. Where pyseccomp or libseccomp.so is missing, or bwrap cannot load
    the filter, runs go on without it and warn loudly ("no syscall filter").
  - a fresh unprivileged HOST uid per run when we are root: the kernel exempts root
    (INIT_USER) from RLIMIT_NPROC even inside a user namespace, and that limit is what
    stops a fork bomb. One uid per run, so concurrent sandboxes do not share a budget.
  - rlimits (CPU, address space, processes, file size, open files, no core, no realtime
    priority) set by `prlimit` before `setpriv` drops the uid; no preexec_fn, so the spawn
    stays a cheap vfork even from a big, multi-threaded rollout worker (a preexec_fn only
    where util-linux is missing).
  - a wall-clock deadline and bounded reads of stdout/stderr; past either, the sandbox is
    SIGKILLed: its pid 1 goes, and with it every process in the namespace.
Without bwrap (or where it cannot start) a run falls back to rlimits + uid + timeout,
`isolated=False`, with a loud warning: the code can then read host files and use the net,
and no syscall filter is loaded (it rides on bwrap's `--seccomp`).

Memory of a whole run: a cgroup v2 memory controller would cap the sum, but none is assumed
writable on a worker (containers, cgroup v1 hosts), so the bound in force is the per-process
one times a small process count: at most max_processes x (memory_bytes + max_open_files x
max_file_bytes) + tmp_bytes (a memfd or pipe holds pages outside the address space, up to
max_file_bytes each; /tmp is tmpfs). `SandboxLimits` refuses limits whose worst case is over
`max_run_memory_bytes`. The count is per run when a throwaway uid is used (we are root);
otherwise the caller's own tasks share RLIMIT_NPROC and the count is relative to them.
bwrap's own two processes count against RLIMIT_NPROC too but are fixed and small.

This module is the public face (limits, results, run_python, choosing the mode, one run);
the parts of a run live next to it: `_sandbox_launch` (bwrap and rlimit command lines),
`_sandbox_seccomp` (the syscall filter), `_sandbox_procs` (throwaway uids, killing what a
run left) and `_sandbox_output` (bounded reads of stdout/stderr).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import shutil
import signal as _signal
import subprocess
import sys
import tempfile
import threading
import time

from environments import _sandbox_seccomp
from environments._sandbox_launch import bwrap_argv, limited, memfd
from environments._sandbox_output import pump
from environments._sandbox_procs import UID_BASE, alloc_uid, kill, kill_uid, tasks_of_uid
from environments.fields import bounded, check_fields

log = logging.getLogger(__name__)

KiB, MiB, GiB = 1024, 1024 * 1024, 1024**3
# Module-level so tests and deployments can override them; BWRAP_PATH=None forces fallback.
BWRAP_PATH: str | None = shutil.which("bwrap")
SECCOMP_FILTER = True  # False: bwrap runs without the syscall filter (and warns)
PRLIMIT_PATH: str | None = shutil.which("prlimit")
SETPRIV_PATH: str | None = shutil.which("setpriv")
# The distro interpreter lives under /usr, so nothing under /root or /work is bound.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
STATUSES = ("ok", "error", "timeout", "killed", "output_limit", "sandbox_error")
_UID_BASE = UID_BASE  # the throwaway uids start here (tests spot sandbox processes by it)
_BWRAP_PROCS = 2  # outer bwrap + its pid-1 reaper count against RLIMIT_NPROC too
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_AUTO = object()


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = bounded(2, ge=1)  # RLIMIT_CPU per process (SIGXCPU, then SIGKILL 1 s later)
    wall_seconds: float = bounded(5.0, gt=0, finite=True)  # whole run, start to kill
    # RLIMIT_AS per process.
    memory_bytes: int = bounded(384 * MiB, ge=64 * MiB, why="64 MiB: the interpreter alone maps ~20 MiB")
    # Processes+threads the program may have, itself included. Small: with the per-process
    # limits it is what bounds a whole run's memory (the module docstring).
    max_processes: int = bounded(4, ge=1)
    max_file_bytes: int = bounded(1 * MiB, ge=1)  # RLIMIT_FSIZE: largest file it may write
    # RLIMIT_NOFILE. Also a memory bound: each memfd or pipe holds RAM outside RLIMIT_AS.
    max_open_files: int = bounded(32, ge=16, why="bwrap and the interpreter need a few to start")
    max_output_bytes: int = bounded(64 * KiB, ge=1)  # kept from stdout, and again from stderr
    tmp_bytes: int = bounded(16 * MiB, ge=1)  # size of the private /tmp (tmpfs pages are RAM)
    # Refuses limits whose worst_case_memory_bytes is larger (defaults: 1680 MiB).
    max_run_memory_bytes: int = bounded(2 * GiB, ge=1)

    @property
    def worst_case_memory_bytes(self) -> int:
        """The most RAM one run can hold: every process at its address-space limit with every
        descriptor a full memfd, plus a full /tmp."""
        per_process = self.memory_bytes + self.max_open_files * self.max_file_bytes
        return self.max_processes * per_process + self.tmp_bytes

    def __post_init__(self) -> None:
        check_fields(self)
        if self.worst_case_memory_bytes > self.max_run_memory_bytes:
            raise ValueError(
                "SandboxLimits: a run could hold "
                f"{self.worst_case_memory_bytes} bytes = max_processes {self.max_processes} x "
                f"(memory_bytes {self.memory_bytes} + max_open_files {self.max_open_files} x "
                f"max_file_bytes {self.max_file_bytes}) + tmp_bytes {self.tmp_bytes}, over "
                f"max_run_memory_bytes {self.max_run_memory_bytes}"
            )


@dataclasses.dataclass
class SandboxResult:
    status: str  # one of STATUSES
    exit_code: int | None  # None when killed by a signal or never reaped
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    wall_s: float = 0.0
    isolated: bool = False  # True when bwrap was used
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(
    source: str,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),
    files: dict[str, str] | None = None,
    *,
    bwrap=_AUTO,
) -> SandboxResult:
    """Run `source` as a script in /tmp (its cwd) with `files` next to it. Blocking.

    `bwrap` overrides BWRAP_PATH (None: the un-isolated fallback). Oversized input is the
    caller's bug (ValueError); anything the program does becomes a result, never a raise.
    """
    if not isinstance(limits, SandboxLimits):
        raise ValueError(f"limits must be SandboxLimits, got {type(limits).__name__}")
    if not isinstance(source, str) or not isinstance(stdin, str):
        raise ValueError("source and stdin must be str")
    payload = {"main.py": source, **_check_files(files)}
    blobs = {name: text.encode("utf-8", "surrogatepass") for name, text in payload.items()}
    for name, blob in blobs.items():
        if len(blob) > limits.max_file_bytes:  # copying it in would itself hit RLIMIT_FSIZE
            raise ValueError(f"sandbox file {name!r} is {len(blob)} bytes > max_file_bytes")
    if sum(map(len, blobs.values())) > limits.tmp_bytes // 2:
        raise ValueError("sandbox files exceed half of tmp_bytes")
    warnings: list[str] = []
    bw, drop, filt = _resolve_mode(BWRAP_PATH if bwrap is _AUTO else bwrap, warnings)
    return _run(blobs, stdin.encode("utf-8", "surrogatepass"), limits, bw, drop, filt, warnings)


async def run_python_async(
    source: str,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),
    files: dict[str, str] | None = None,
    *,
    bwrap=_AUTO,
) -> SandboxResult:
    """`run_python` on a worker thread, so the event loop keeps serving other episodes."""
    return await asyncio.to_thread(run_python, source, stdin, limits, files, bwrap=bwrap)


def _check_files(files: dict[str, str] | None) -> dict[str, str]:
    files = dict(files or {})
    for name, text in files.items():
        if not isinstance(name, str) or not _FILE_NAME_RE.match(name) or name == "main.py":
            raise ValueError(f"bad sandbox file name {name!r}")
        if not isinstance(text, str):
            raise ValueError(f"sandbox file {name!r} must be str")
    return files


# --- Choosing how to run: probed once per process ----------------------------------------

_Mode = tuple[list[str] | None, bool, bytes | None, str]  # bwrap argv, drop uid, filter, note
_modes: dict[tuple[str | None, str], _Mode] = {}
_modes_lock = threading.Lock()
_warned: set[str] = set()


def _warn(msg: str, warnings: list[str]) -> None:
    warnings.append(msg)
    # Loud once per process, then quiet: a rollout worker would otherwise log it per episode.
    log.log(logging.DEBUG if msg in _warned else logging.WARNING, "SANDBOX: %s", msg)
    _warned.add(msg)


def _resolve_mode(path: str | None, warnings: list[str]) -> tuple[list[str] | None, bool, bytes | None]:
    filt, why = _sandbox_seccomp.program() if SECCOMP_FILTER else (None, "SECCOMP_FILTER is off")
    key = (path, why)  # why is "" when there is a filter
    with _modes_lock:
        if key not in _modes:
            _modes[key] = _probe(path, os.geteuid() == 0, filt, why)
    bw, drop, filt, note = _modes[key]
    if note:
        _warn(note, warnings)
    return bw, drop, filt


def _probe(path: str | None, root: bool, filt: bytes | None, why_no_filter: str) -> _Mode:
    """The strongest setup that runs here: throwaway uid first, then bwrap as root;
    `--disable-userns` (no nested user namespaces, bwrap >= 0.8) first, then without; the
    syscall filter first, then without (a kernel without seccomp must not cost us bwrap)."""
    can_drop = root and (PRLIMIT_PATH is None or SETPRIV_PATH is not None)
    why, limits = "bubblewrap not found", SandboxLimits(wall_seconds=10)
    for drop in ([True, False] if can_drop else [False]) if path else []:
        for bw in ([path, "--disable-userns"], [path]):
            for f in [filt, None] if filt else [None]:
                try:
                    r = _run({"main.py": b"print('ok')"}, b"", limits, bw, drop, f, [])
                except OSError as e:  # e.g. the path is not an executable
                    why = f"bwrap failed to start ({e})"
                    continue
                if r.ok and r.stdout == "ok\n":
                    notes = [
                        ""
                        if drop or not root
                        else "bwrap runs as root: RLIMIT_NPROC is not "
                        "enforced, a fork bomb is held only by the wall-clock kill",
                        "" if len(bw) > 1 else "bwrap lacks --disable-userns",
                        ""
                        if f
                        else f"no syscall filter ({why_no_filter}): ptrace, keyctl, bpf, mount, "
                        "unshare and the like reach the kernel",
                    ]
                    return bw, drop, f, "; ".join(filter(None, notes))
                why = f"bwrap failed to start ({r.status}: {r.stderr.strip()[:200]})"
                if f:
                    why_no_filter = f"bwrap could not load it: {r.stderr.strip()[:200]}"
    return (
        None,
        can_drop,
        None,
        (
            f"{why}; running model code WITHOUT isolation (rlimits + timeout "
            "only): it can read host files and use the network"
        ),
    )


# --- One run -------------------------------------------------------------------------------


def _run(
    blobs: dict[str, bytes],
    stdin: bytes,
    limits: SandboxLimits,
    bw: list[str] | None,
    drop: bool,
    filt: bytes | None,
    warnings: list[str],
) -> SandboxResult:
    uid = alloc_uid() if drop else None
    nproc = limits.max_processes + (_BWRAP_PROCS if bw else 0)
    if uid is None:  # our own uid: its other processes count against the same limit
        nproc += tasks_of_uid(os.getuid())
    # -I: no env vars or user site; -S: no site; -B: no .pyc; -u: output survives a kill.
    inner = [PYTHON, "-I", "-S", "-B", "-u", "main.py"]
    fds: list[int] = []
    workdir = None
    try:
        if bw:
            argv = bwrap_argv(bw, limits.tmp_bytes, blobs, inner, fds, PYTHON, filt)
            cwd, env = "/", {}
        else:
            workdir = tempfile.mkdtemp(prefix="sandbox-")
            for name, blob in blobs.items():
                with open(os.path.join(workdir, name), "wb") as fh:
                    fh.write(blob)
            if uid is not None:
                for p in [workdir, *(os.path.join(workdir, n) for n in blobs)]:
                    os.chown(p, uid, uid)
            argv, cwd, env = inner, workdir, {"PATH": "/usr/bin:/bin"}
        # Read the paths now, not at import: tests and deployments override them on this module.
        argv, kwargs = limited(argv, limits, nproc, uid, PRLIMIT_PATH, SETPRIV_PATH)
        fds.append(memfd(stdin))  # a file, not a pipe: nothing to feed, nothing to block on
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=fds[-1],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            pass_fds=fds[:-1],
            start_new_session=True,
            **kwargs,
        )
        for fd in fds:
            os.close(fd)
        fds = []
        try:
            out, err, timed_out = pump(proc, limits.max_output_bytes, start + limits.wall_seconds)
        finally:
            killed = proc.poll() is None
            kill(proc, group=bw is None)  # bwrap dies => its pid 1 => the whole namespace
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            if uid is not None and (bw is None or killed):
                # Fallback: no pid namespace takes strays down. bwrap: pid 1 dies
                # asynchronously after a kill; this makes the cleanup synchronous.
                kill_uid(uid, PYTHON)
        wall = time.monotonic() - start
    finally:
        for fd in fds:
            os.close(fd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return _result(proc.returncode, out, err, timed_out, wall, bool(bw), warnings)


def _result(rc, out, err, timed_out, wall, isolated, warnings) -> SandboxResult:
    (stdout, out_trunc), (stderr, err_trunc) = out, err
    sig = -rc if rc < 0 else None
    if isolated and 128 < rc <= 128 + 64:  # bwrap reports a signal death as 128+N
        sig = rc - 128
    if out_trunc or err_trunc:
        status = "output_limit"
    elif timed_out or sig == _signal.SIGXCPU:
        status = "timeout"
    elif sig is not None:
        status = "killed"
    elif isolated and rc == 1 and stderr.startswith("bwrap: "):
        status = "sandbox_error"  # the program could forge this, but only to fail itself
    else:
        status = "ok" if rc == 0 else "error"
    return SandboxResult(
        status=status,
        exit_code=None if sig else rc,
        signal=sig,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=out_trunc,
        stderr_truncated=err_trunc,
        timed_out=timed_out,
        wall_s=wall,
        isolated=isolated,
        warnings=warnings,
    )
