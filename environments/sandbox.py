"""Run untrusted Python source with hard bounds: bubblewrap + a throwaway uid + rlimits.

Model-written code is hostile, so every run gets, in layers:
  - bwrap: every namespace unshared (no network), a fresh pid namespace whose pid 1 dies
    with us (`--die-with-parent`), read-only /usr and nothing else from the host, a
    size-capped private tmpfs /tmp as the only writable place, a clean environment,
    uid 65534 inside, read-only `/` and `/dev` (both are RAM-backed tmpfs otherwise).
  - a fresh unprivileged HOST uid per run when we are root: the kernel exempts root
    (INIT_USER) from RLIMIT_NPROC even inside a user namespace, and that limit is what
    stops a fork bomb. One uid per run, so concurrent sandboxes do not share a budget.
  - rlimits (CPU, address space, processes, file size, no core) set by `prlimit` before
    `setpriv` drops the uid; no preexec_fn, so the spawn stays a cheap vfork even from a
    big, multi-threaded rollout worker (a preexec_fn only where util-linux is missing).
    Memory is bounded per process: the worst case is max_processes x memory_bytes (a
    cgroup would cap the sum; none is assumed writable on a worker).
  - a wall-clock deadline and bounded reads of stdout/stderr; past either, the sandbox is
    SIGKILLed: its pid 1 goes, and with it every process in the namespace.
Without bwrap (or where it cannot start) a run falls back to rlimits + uid + timeout,
`isolated=False`, with a loud warning: the code can then read host files and use the net.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import random
import re
import resource
import selectors
import shutil
import signal as _signal
import subprocess
import sys
import tempfile
import threading
import time

log = logging.getLogger(__name__)

KiB, MiB = 1024, 1024 * 1024
# Module-level so tests and deployments can override them; BWRAP_PATH=None forces fallback.
BWRAP_PATH: str | None = shutil.which("bwrap")
PRLIMIT_PATH: str | None = shutil.which("prlimit")
SETPRIV_PATH: str | None = shutil.which("setpriv")
# The distro interpreter lives under /usr, so nothing under /root or /work is bound.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
STATUSES = ("ok", "error", "timeout", "killed", "output_limit", "sandbox_error")
_UID_BASE, _UID_SPAN = 1_900_000_000, 1_000_000  # far above any real account
_BWRAP_PROCS = 2  # outer bwrap + its pid-1 reaper count against RLIMIT_NPROC too
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_AUTO = object()


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 2  # RLIMIT_CPU per process (SIGXCPU, then SIGKILL 1 s later)
    wall_seconds: float = 5.0  # whole run, start to kill
    memory_bytes: int = 512 * MiB  # RLIMIT_AS per process
    max_processes: int = 16  # processes+threads the program may have, itself included
    max_file_bytes: int = 1 * MiB  # RLIMIT_FSIZE: largest file it may write
    max_output_bytes: int = 64 * KiB  # kept from stdout, and again from stderr
    tmp_bytes: int = 16 * MiB  # size of the private /tmp (tmpfs pages are RAM)

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "max_processes", "max_file_bytes", "max_output_bytes", "tmp_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SandboxLimits.{name} must be an int >= 1, got {v!r}")
        w = self.wall_seconds
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"SandboxLimits.wall_seconds must be a finite number > 0, got {w!r}")
        if self.memory_bytes < 64 * MiB:  # the interpreter alone maps ~20 MiB
            raise ValueError(f"SandboxLimits.memory_bytes must be >= 64 MiB, got {self.memory_bytes}")


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
    bw, drop = _resolve_mode(BWRAP_PATH if bwrap is _AUTO else bwrap, warnings)
    return _run(blobs, stdin.encode("utf-8", "surrogatepass"), limits, bw, drop, warnings)


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

_modes: dict[str | None, tuple[list[str] | None, bool, str]] = {}
_modes_lock = threading.Lock()
_warned: set[str] = set()


def _warn(msg: str, warnings: list[str]) -> None:
    warnings.append(msg)
    # Loud once per process, then quiet: a rollout worker would otherwise log it per episode.
    log.log(logging.DEBUG if msg in _warned else logging.WARNING, "SANDBOX: %s", msg)
    _warned.add(msg)


def _resolve_mode(path: str | None, warnings: list[str]) -> tuple[list[str] | None, bool]:
    with _modes_lock:
        if path not in _modes:
            _modes[path] = _probe(path, os.geteuid() == 0)
    bw, drop, note = _modes[path]
    if note:
        _warn(note, warnings)
    return bw, drop


def _probe(path: str | None, root: bool) -> tuple[list[str] | None, bool, str]:
    """The strongest setup that runs here: throwaway uid first, then bwrap as root;
    `--disable-userns` (no nested user namespaces, bwrap >= 0.8) first, then without."""
    can_drop = root and (PRLIMIT_PATH is None or SETPRIV_PATH is not None)
    why = "bubblewrap not found"
    for drop in ([True, False] if can_drop else [False]) if path else []:
        for bw in ([path, "--disable-userns"], [path]):
            try:
                r = _run({"main.py": b"print('ok')"}, b"", SandboxLimits(wall_seconds=10), bw, drop, [])
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
                ]
                return bw, drop, "; ".join(filter(None, notes))
            why = f"bwrap failed to start ({r.status}: {r.stderr.strip()[:200]})"
    return (
        None,
        can_drop,
        (
            f"{why}; running model code WITHOUT isolation (rlimits + timeout "
            "only): it can read host files and use the network"
        ),
    )


# --- One run -------------------------------------------------------------------------------

_uid_lock = threading.Lock()
_uid_next = random.SystemRandom().randrange(_UID_SPAN)  # random start: fewer cross-process clashes


def _alloc_uid() -> int:
    global _uid_next
    with _uid_lock:
        _uid_next += 1
        return _UID_BASE + _uid_next % _UID_SPAN


def _run(
    blobs: dict[str, bytes], stdin: bytes, limits: SandboxLimits, bw: list[str] | None, drop: bool, warnings: list[str]
) -> SandboxResult:
    uid = _alloc_uid() if drop else None
    nproc = limits.max_processes + (_BWRAP_PROCS if bw else 0)
    if uid is None:  # our own uid: its other processes count against the same limit
        nproc += _tasks_of_uid(os.getuid())
    # -I: no env vars or user site; -S: no site; -B: no .pyc; -u: output survives a kill.
    inner = [PYTHON, "-I", "-S", "-B", "-u", "main.py"]
    fds: list[int] = []
    workdir = None
    try:
        if bw:
            argv = [
                *bw,
                "--unshare-all",
                "--unshare-user",
                "--uid",
                "65534",
                "--gid",
                "65534",
                "--die-with-parent",
                "--new-session",
                "--clearenv",
                "--setenv",
                "PATH",
                "/usr/bin:/bin",
                *_ro_binds(),
                "--dev",
                "/dev",
                "--size",
                str(limits.tmp_bytes),
                "--tmpfs",
                "/tmp",
            ]
            for name, blob in blobs.items():
                fds.append(_memfd(blob))
                argv += ["--file", str(fds[-1]), f"/tmp/{name}"]
            argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--", *inner]
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
        argv, kwargs = _limited(argv, limits, nproc, uid)
        fds.append(_memfd(stdin))  # a file, not a pipe: nothing to feed, nothing to block on
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
            out, err, timed_out = _pump(proc, limits, start + limits.wall_seconds)
        finally:
            killed = proc.poll() is None
            _kill(proc, group=bw is None)  # bwrap dies => its pid 1 => the whole namespace
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            if uid is not None and (bw is None or killed):
                # Fallback: no pid namespace takes strays down. bwrap: pid 1 dies
                # asynchronously after a kill; this makes the cleanup synchronous.
                _kill_uid(uid)
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


def _limited(argv: list[str], limits: SandboxLimits, nproc: int, uid: int | None):
    """Wrap argv so rlimits (and the uid drop) happen in the child, before anything runs."""
    rl = {
        resource.RLIMIT_CPU: (limits.cpu_seconds, limits.cpu_seconds + 1),
        resource.RLIMIT_AS: (limits.memory_bytes,) * 2,
        resource.RLIMIT_NPROC: (nproc,) * 2,
        resource.RLIMIT_FSIZE: (limits.max_file_bytes,) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if PRLIMIT_PATH and (uid is None or SETPRIV_PATH):
        pre = [
            PRLIMIT_PATH,
            f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
            f"--as={limits.memory_bytes}",
            f"--nproc={nproc}",
            f"--fsize={limits.max_file_bytes}",
            "--core=0",
            "--",
        ]
        if uid is not None:
            pre += [SETPRIV_PATH, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return pre + argv, {}

    def preexec() -> None:  # setrlimit only: no imports, no locks, after the uid drop
        for which, pair in rl.items():
            resource.setrlimit(which, pair)

    kw = {"preexec_fn": preexec}
    if uid is not None:
        kw.update(user=uid, group=uid, extra_groups=[])
    return argv, kw


def _pump(proc, limits: SandboxLimits, deadline: float):
    """Read stdout/stderr up to the cap; stop at the deadline or the cap."""
    cap = limits.max_output_bytes
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    trunc = {proc.stdout: False, proc.stderr: False}
    sel = selectors.DefaultSelector()
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    timed_out = False
    try:
        while sel.get_map() and not any(trunc.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            # Once the program itself has exited, drain what is buffered and stop: strays
            # holding the pipes open (possible in the fallback) must not keep us here.
            exited = proc.poll() is not None
            events = sel.select(0 if exited else min(left, 0.05))
            if exited and not events:
                break
            for key, _ in events:
                f = key.fileobj
                try:
                    data = os.read(f.fileno(), 64 * KiB)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(f)
                    continue
                room = cap - len(bufs[f])
                bufs[f] += data[:room]
                trunc[f] = trunc[f] or len(data) > room
        if not timed_out and not any(trunc.values()):
            try:  # output closed; the program may still be running
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
    text = {f: b.decode("utf-8", "replace") for f, b in bufs.items()}
    return ((text[proc.stdout], trunc[proc.stdout]), (text[proc.stderr], trunc[proc.stderr]), timed_out)


def _kill(proc, group: bool) -> None:
    proc.kill()  # a no-op once reaped, so it cannot hit a recycled pid
    if group:  # the fallback's strays; their membership keeps the pgid from being reused
        try:
            os.killpg(proc.pid, _signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_uid(uid: int) -> None:
    """Kill every process of `uid`: kill(-1) sent AS that uid reaches exactly those."""
    subprocess.run(
        [PYTHON, "-I", "-S", "-c", "import os; os.kill(-1, 9)"],
        user=uid,
        group=uid,
        extra_groups=[],
        env={},
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=10,
        check=False,
    )


def _tasks_of_uid(uid: int) -> int:
    """Threads owned by `uid` now (RLIMIT_NPROC counts them all, per real uid)."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as fh:
                st = dict(line.split(":", 1) for line in fh if ":" in line)
            if int(st["Uid"].split()[0]) == uid:
                n += int(st["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return n


def _ro_binds() -> list[str]:
    args: list[str] = []
    for p in ("/usr", "/bin", "/lib", "/lib64"):  # merged-/usr systems: the rest are symlinks
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(PYTHON)))
    if not prefix.startswith("/usr"):  # e.g. a pyenv build: bind its prefix only
        args += ["--ro-bind", prefix, prefix]
    return args


def _memfd(blob: bytes) -> int:
    fd = os.memfd_create("sandbox-file", 0)  # bwrap --file copies it into the tmpfs
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view) :]
    try:  # hand out a read-only descriptor: the program must not grow our memory through it
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    finally:
        os.close(fd)
