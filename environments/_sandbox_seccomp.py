"""The syscall filter of a sandboxed run (internals of `environments.sandbox`).

Namespaces and a throwaway uid take away privileges, but every syscall still reaches the
host's kernel, and the rarely used ones are where kernel bugs live: ptrace, keyrings, BPF,
perf, user and mount namespaces, the new mount API, userfaultfd (a classic race helper),
module loading. Code that prints an answer needs none of them, so the filter answers each
with an errno before the kernel looks at its arguments.

A deny list over a default of ALLOW: the interpreter, its threads and its subprocesses use
hundreds of syscalls that change with glibc and kernel releases, and an allow list would
break ordinary programs on the next distro. libseccomp (through `pyseccomp`, a ctypes
wrapper) compiles the rules to classic BPF once per process; bwrap loads the bytes
(`--seccomp FD`) in the program's process just before exec, after its own mount and
namespace set-up. The program cannot remove it: filters only ever stack, and a program
that adds its own can only narrow what it may do.
"""

from __future__ import annotations

import errno
import functools
import os

# EPERM, as a kernel without the privilege would say: programs handle it as "not allowed".
DENIED = (
    "ptrace",  # read or steer another process: pid 1 of the namespace, a sibling
    "process_vm_readv",  # the same without ptrace
    "process_vm_writev",
    "keyctl",  # kernel keyrings: a long history of refcount bugs
    "add_key",
    "request_key",
    "bpf",  # the verifier and maps: a large attack surface
    "perf_event_open",  # side channels and a history of exploits
    "userfaultfd",  # pauses the kernel mid-copy: widens any kernel race
    "io_uring_setup",  # runs syscalls' work outside this filter, and has had many bugs
    "mount",  # mounts, old API and new
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "chroot",
    "unshare",  # new namespaces: a nested user namespace grants capabilities in it
    "setns",
    "kexec_load",  # host administration: nothing a program needs, everything to lose
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "lookup_dcookie",
    "open_by_handle_at",  # opens host files by handle, past the mount namespace (shocker)
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "adjtimex",
)
# clone with any of these flags makes a namespace, as unshare would; one rule per flag,
# since libseccomp ORs the rules of one syscall. Flags are argument 0 of clone on x86_64
# and arm64 (s390 swaps the first two: this filter is not built for it).
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


@functools.cache
def program() -> tuple[bytes | None, str]:
    """(the BPF program, "") or (None, why there is none). Cached: built once per process."""
    try:
        import pyseccomp as sc  # raises RuntimeError itself where libseccomp.so is missing

        return _build(sc), ""
    except Exception as e:  # any failure means: run without the filter, and say so
        return None, f"pyseccomp/libseccomp unavailable: {type(e).__name__}: {e}"


def _build(sc) -> bytes:
    f = sc.SyscallFilter(sc.ALLOW)
    # A syscall of another ABI (i386's int 0x80, x32) would skip the rules of this one:
    # libseccomp already refuses them; kill the whole process, not just the thread.
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in DENIED:
        _add(sc, f, sc.ERRNO(errno.EPERM), name)
    # clone3's flags sit behind a pointer, out of a filter's reach: ENOSYS makes glibc
    # (threads, posix_spawn) fall back to clone, whose flags the rules below can see.
    _add(sc, f, sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in NAMESPACE_FLAGS.values():
        _add(sc, f, sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    fd = os.memfd_create("sandbox-seccomp", 0)
    with open(fd, "w+b") as fh:
        f.export_bpf(fh)
        fh.seek(0)
        return fh.read()


def _add(sc, f, action: int, name: str, *args) -> None:
    nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    if nr < 0:  # unknown to libseccomp, or a pseudo-number: not a syscall on this arch
        return
    f.add_rule(action, nr, *args)
