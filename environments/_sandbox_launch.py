"""The command line of one sandboxed run (internals of `environments.sandbox`).

Builds the bubblewrap argv (namespaces, read-only binds, the private /tmp and the files
copied into it from memfds, the syscall filter from another memfd) and wraps any argv so
rlimits and the uid drop happen in the child before the program starts (`prlimit` +
`setpriv`, or a preexec_fn without them).
Paths to the tools and the interpreter are passed in, so overrides of the module-level
settings in `environments.sandbox` (tests, deployments) reach every run.
"""

from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from environments.sandbox import SandboxLimits


def bwrap_argv(
    bw: list[str],
    tmp_bytes: int,
    blobs: dict[str, bytes],
    inner: list[str],
    fds: list[int],
    python: str,
    seccomp: bytes | None = None,
) -> list[str]:
    """bwrap argv running `inner` in /tmp with `blobs` in it, under the BPF program `seccomp`
    when given. Each memfd (files, filter) is appended to `fds` as soon as it exists, so the
    caller closes it even if a later one fails."""
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
        *ro_binds(python),
        "--dev",
        "/dev",
        "--size",
        str(tmp_bytes),
        "--tmpfs",
        "/tmp",
    ]
    for name, blob in blobs.items():
        fds.append(memfd(blob))
        argv += ["--file", str(fds[-1]), f"/tmp/{name}"]
    if seccomp is not None:  # bwrap loads it in the program's process, right before exec
        fds.append(memfd(seccomp))
        argv += ["--seccomp", str(fds[-1])]
    return argv + ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--", *inner]


def limited(
    argv: list[str],
    limits: SandboxLimits,
    nproc: int,
    uid: int | None,
    prlimit: str | None,
    setpriv: str | None,
):
    """Wrap argv so rlimits (and the uid drop) happen in the child, before anything runs."""
    rl = {
        resource.RLIMIT_CPU: (limits.cpu_seconds, limits.cpu_seconds + 1),
        resource.RLIMIT_AS: (limits.memory_bytes,) * 2,
        resource.RLIMIT_NPROC: (nproc,) * 2,
        resource.RLIMIT_FSIZE: (limits.max_file_bytes,) * 2,
        resource.RLIMIT_NOFILE: (limits.max_open_files,) * 2,
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_RTPRIO: (0, 0),
    }
    if prlimit and (uid is None or setpriv):
        pre = [
            prlimit,
            f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
            f"--as={limits.memory_bytes}",
            f"--nproc={nproc}",
            f"--fsize={limits.max_file_bytes}",
            f"--nofile={limits.max_open_files}",
            "--core=0",
            "--rtprio=0",
            "--",
        ]
        if uid is not None:
            pre += [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return pre + argv, {}

    def preexec() -> None:  # setrlimit only: no imports, no locks, after the uid drop
        for which, pair in rl.items():
            resource.setrlimit(which, pair)

    kw = {"preexec_fn": preexec}
    if uid is not None:
        kw.update(user=uid, group=uid, extra_groups=[])
    return argv, kw


def ro_binds(python: str) -> list[str]:
    args: list[str] = []
    for p in ("/usr", "/bin", "/lib", "/lib64"):  # merged-/usr systems: the rest are symlinks
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if not prefix.startswith("/usr"):  # e.g. a pyenv build: bind its prefix only
        args += ["--ro-bind", prefix, prefix]
    return args


def memfd(blob: bytes) -> int:
    fd = os.memfd_create("sandbox-file", 0)  # bwrap --file copies it into the tmpfs
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view) :]
    try:  # hand out a read-only descriptor: the program must not grow our memory through it
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    finally:
        os.close(fd)
