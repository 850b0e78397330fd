"""More hostile programs through the REAL sandbox, one table row per kind of attack.

Each row is (kind, code, expected outcome): the status, the exact stdout the code prints
about each attempt (an errno name, or OK where the attempt is harmless), and where it
matters the signal or a bound on the wall time. Every row also checks that the host is
healthy afterwards (no stray process, a working fork, the host's memory unchanged).
Attacks that need the host to set something up or look at something afterwards are in
tests/test_sandbox_hostile_host.py; docs/ENVIRONMENTS.md lists all kinds.
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import psutil
import pytest
from test_sandbox import assert_healthy

from environments import sandbox as S
from environments._sandbox_seccomp import DENIED
from environments.sandbox import SandboxLimits, run_python

pytestmark = pytest.mark.skipif(S.BWRAP_PATH is None, reason="bubblewrap is not installed")
LIMITS = SandboxLimits(wall_seconds=20)  # generous: the machine may be loaded
ONE_SECOND = SandboxLimits(wall_seconds=1)
try:  # this arch's numbers of the syscalls glibc has no wrapper for (sc() below)
    import pyseccomp

    NR = {n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in (*DENIED, "clone", "clone3")}
except (ImportError, RuntimeError):  # no libseccomp: no filter either, and its rows fail
    NR = {}
# Prepended to every row: attempt() prints "LABEL OK" or "LABEL ERRNO-NAME"; c() calls a
# libc function, sc() a syscall by name.
PRELUDE = f"""\
import ctypes, errno, mmap, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = {NR!r}
def attempt(label, fn):
    try:
        fn()
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno), flush=True)
    else:
        print(label, 'OK', flush=True)
def c(name, *args):
    if getattr(libc, name)(*args) == -1:
        raise OSError(ctypes.get_errno(), name)
def sc(name, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    r = libc.syscall(ctypes.c_long(NR[name]), *args)
    if r == -1:
        raise OSError(ctypes.get_errno(), name)
    return r
"""


@dataclasses.dataclass(frozen=True)
class Kind:
    kind: str
    code: str
    status: str
    stdout: str | None = None  # exact, when given
    stderr: str | None = None  # exact, when given
    signal: int | None = None
    max_wall: float | None = None
    limits: SandboxLimits = LIMITS


MMAP_FLAGS = "mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS"
KINDS = [
    Kind(
        "mmap_anonymous_8gib",
        "attempt('map', lambda: mmap.mmap(-1, 8 << 30))\n"
        f"attempt('noreserve', lambda: mmap.mmap(-1, 8 << 30, flags={MMAP_FLAGS} | 0x4000))  # MAP_NORESERVE",
        "ok",
        "map ENOMEM\nnoreserve ENOMEM\n",
    ),
    Kind(
        "mmap_populate_4gib",
        f"attempt('populate', lambda: mmap.mmap(-1, 4 << 30, flags={MMAP_FLAGS} | mmap.MAP_POPULATE))",
        "ok",
        "populate ENOMEM\n",
    ),
    Kind(  # touch every page of one 64 MiB map after another: real RAM, not just address space
        "mmap_touch_pages",
        "maps = []\ndef grow():\n    while True:\n        m = mmap.mmap(-1, 64 << 20)\n"
        "        for i in range(0, len(m), 4096):\n            m[i] = 1\n        maps.append(m)\n"
        f"attempt('touch', grow)\nprint('under the cap', len(maps) * 64 < {LIMITS.memory_bytes >> 20})",
        "ok",
        "touch ENOMEM\nunder the cap True\n",
    ),
    Kind(  # memfd pages are outside RLIMIT_AS: only RLIMIT_FSIZE x RLIMIT_NOFILE bounds them
        "memfd_ram_outside_address_space",
        "fds = []\ndef hoard():\n    for _ in range(1000):\n        fd = os.memfd_create('x')\n"
        "        fds.append(fd)\n        os.write(fd, b'x' * (1 << 20))\n"
        f"attempt('hoard', hoard)\nprint('MiB held < 32:', len(fds) < {LIMITS.max_open_files})\n"
        "attempt('grow', lambda: os.write(fds[0], b'x'))\n"
        "attempt('truncate', lambda: os.ftruncate(fds[0], 1 << 33))",
        "ok",
        "hoard EMFILE\nMiB held < 32: True\ngrow EFBIG\ntruncate EFBIG\n",
    ),
    Kind(
        "fd_exhaustion",
        "fds = []\ndef hoard():\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        f"attempt('open', hoard)\nprint('fds < 32:', len(fds) < {LIMITS.max_open_files})\n"
        "for fd in fds:\n    os.close(fd)\n"
        "attempt('again', lambda: os.close(os.open('/dev/null', os.O_RDONLY)))\n"
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))",
        "ok",
        f"open EMFILE\nfds < 32: True\nagain OK\n({LIMITS.max_open_files}, {LIMITS.max_open_files})\n",
    ),
    Kind(
        "symlink_escape",
        "for i, target in enumerate(['/etc/passwd', '/etc/shadow', '/proc/1/root/etc/hostname', '/work', '/root']):\n"
        "    os.symlink(target, f'link{i}')\n    attempt(target, lambda: os.listdir(f'link{i}/') "
        "if target in ('/work', '/root') else open(f'link{i}').read())",
        "ok",
        "/etc/passwd ENOENT\n/etc/shadow ENOENT\n/proc/1/root/etc/hostname ENOENT\n/work ENOENT\n/root ENOENT\n",
    ),
    Kind(
        "hardlink_escape",
        "for src in ['/usr/bin/python3', '/usr/lib/os-release', '/etc/passwd']:\n"
        "    attempt(src, lambda: os.link(src, '/tmp/' + src.replace('/', '_')))",
        "ok",
        "/usr/bin/python3 EXDEV\n/usr/lib/os-release EXDEV\n/etc/passwd ENOENT\n",
    ),
    Kind(
        "device_files_read",
        "for d in ['/dev/mem', '/dev/kmem', '/dev/port', '/dev/sda', '/dev/nvme0n1', '/dev/kmsg', '/dev/fuse']:\n"
        "    attempt(d, lambda: open(d, 'rb').read(1))\n"
        "print('only harmless nodes:', set(os.listdir('/dev')) <= {'core', 'fd', 'full', 'null', 'ptmx', "
        "'pts', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'tty', 'urandom', 'zero', 'console'})",
        "ok",
        "/dev/mem ENOENT\n/dev/kmem ENOENT\n/dev/port ENOENT\n/dev/sda ENOENT\n/dev/nvme0n1 ENOENT\n"
        "/dev/kmsg ENOENT\n/dev/fuse ENOENT\nonly harmless nodes: True\n",
    ),
    Kind(
        "device_files_write",
        "for d in ['/dev/null', '/dev/sda', '/dev/new-node', '/dev/shm/x']:\n"
        "    attempt(d, lambda: open(d, 'wb').write(b'x'))",
        "ok",
        "/dev/null OK\n/dev/sda EROFS\n/dev/new-node EROFS\n/dev/shm/x EROFS\n",
    ),
    Kind(
        "mknod_devices",
        "import stat\nfor name, kind, major, minor in [('mem', stat.S_IFCHR, 1, 1), ('sda', stat.S_IFBLK, 8, 0)]:\n"
        "    attempt(name, lambda: os.mknod(name, kind | 0o666, os.makedev(major, minor)))\n"
        "attempt('fifo', lambda: os.mkfifo('fifo'))",
        "ok",
        "mem EPERM\nsda EPERM\nfifo OK\n",
    ),
    Kind(
        "privilege_calls",
        "attempt('setuid0', lambda: os.setuid(0))\nattempt('setgid0', lambda: os.setgid(0))\n"
        "attempt('chroot', lambda: os.chroot('/tmp'))\n"
        "attempt('mount', lambda: c('mount', b'none', b'/tmp', b'tmpfs', 0, None))\n"
        "attempt('unshare_mnt', lambda: c('unshare', 0x00020000))\n"
        "attempt('sethostname', lambda: c('sethostname', b'pwned', 5))\n"
        "attempt('dmesg', lambda: c('klogctl', 3, ctypes.create_string_buffer(64), 64))",
        "ok",
        "setuid0 EINVAL\nsetgid0 EINVAL\nchroot EPERM\nmount EPERM\nunshare_mnt EPERM\nsethostname EPERM\n"
        "dmesg EPERM\n",
    ),
    Kind(
        "host_proc_and_sys",
        "for p in ['/proc/1/environ', '/proc/self/status', '/proc/sysrq-trigger', '/sys/kernel/notes']:\n"
        "    attempt(p, lambda: open(p, 'rb').read())\n"
        "attempt('mount_proc', lambda: c('mount', b'proc', b'/tmp', b'proc', 0, None))",
        "ok",
        "/proc/1/environ ENOENT\n/proc/self/status ENOENT\n/proc/sysrq-trigger ENOENT\n"
        "/sys/kernel/notes ENOENT\nmount_proc EPERM\n",
    ),
    Kind(
        "realtime_priority",
        "attempt('fifo', lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50)))\n"
        "attempt('nice-20', lambda: os.setpriority(os.PRIO_PROCESS, 0, -20))",
        "ok",
        "fifo EPERM\nnice-20 EACCES\n",
    ),
    Kind(
        "signals_to_pid1",
        "for s in (signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGSEGV):\n"
        "    attempt(s.name, lambda: os.kill(1, s))\nimport time\ntime.sleep(0.2)\nprint('alive')",
        "ok",
        "SIGSTOP OK\nSIGTERM OK\nSIGINT OK\nSIGHUP OK\nSIGSEGV OK\nalive\n",
    ),
    Kind(  # stopping itself cannot hang the caller: the wall clock still ends it
        "sigstop_own_group",
        "print('stopping')\nos.killpg(0, signal.SIGSTOP)\nprint('resumed')",
        "timeout",
        "stopping\n",
        max_wall=5,
        limits=ONE_SECOND,
    ),
    # The syscall filter (environments/_sandbox_seccomp.py): each attempt below gets another
    # answer without it (OK, ENOSPC, ENOENT, EINVAL, EFAULT), so each row fails without it.
    Kind(  # without the filter: attached, pid 1 left stopped, the run timed out
        "ptrace_pid1",
        "attempt('attach1', lambda: c('ptrace', 16, 1, None, None))\n"
        "attempt('traceme', lambda: c('ptrace', 0, 0, None, None))",
        "ok",
        "attach1 EPERM\ntraceme EPERM\n",
    ),
    Kind(
        "keyrings",
        "attempt('add_key', lambda: sc('add_key', b'user', b'k', b'v', 1, -2))  # the process keyring\n"
        "attempt('keyctl', lambda: sc('keyctl', 0, -3, 1))  # KEYCTL_GET_KEYRING_ID of the session's\n"
        "attempt('request_key', lambda: sc('request_key', b'user', b'k', None, -2))",
        "ok",
        "add_key EPERM\nkeyctl EPERM\nrequest_key EPERM\n",
    ),
    Kind(
        "bpf_and_perf",
        "attempt('bpf', lambda: sc('bpf', 0, None, 0))  # BPF_MAP_CREATE\n"
        "attempt('perf_event_open', lambda: sc('perf_event_open', None, 0, -1, -1, 0))",
        "ok",
        "bpf EPERM\nperf_event_open EPERM\n",
    ),
    Kind(  # reading and writing a process's memory without ptrace: its own, here
        "process_vm_access",
        "class Iov(ctypes.Structure):\n    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "a, b = ctypes.create_string_buffer(b'secret'), ctypes.create_string_buffer(8)\n"
        "src, dst = Iov(ctypes.addressof(a), 6), Iov(ctypes.addressof(b), 6)\n"
        "for name in ('process_vm_readv', 'process_vm_writev'):\n"
        "    attempt(name, lambda: sc(name, os.getpid(), ctypes.byref(dst), 1, ctypes.byref(src), 1, 0))",
        "ok",
        "process_vm_readv EPERM\nprocess_vm_writev EPERM\n",
    ),
    Kind(
        "userfaultfd",
        "attempt('user_mode_only', lambda: sc('userfaultfd', 1))\nattempt('any', lambda: sc('userfaultfd', 0))",
        "ok",
        "user_mode_only EPERM\nany EPERM\n",
    ),
    Kind(  # clone3's flags are behind a pointer: ENOSYS, and glibc falls back to clone
        "namespace_calls",
        "def clone(flags):\n    if sc('clone', flags | signal.SIGCHLD, 0, 0, 0, 0) == 0:\n        os._exit(0)\n"
        "attempt('unshare_user', lambda: c('unshare', 0x10000000))\n"
        "attempt('unshare_nothing', lambda: c('unshare', 0))\n"
        "attempt('clone_newuser', lambda: clone(0x10000000))\n"
        "attempt('clone_newnet', lambda: clone(0x40000000))\n"
        "attempt('clone3', lambda: sc('clone3', None, 0))\n"
        "attempt('setns', lambda: sc('setns', -1, 0))",
        "ok",
        "unshare_user EPERM\nunshare_nothing EPERM\nclone_newuser EPERM\nclone_newnet EPERM\n"
        "clone3 ENOSYS\nsetns EPERM\n",
    ),
    Kind(  # paths that do not exist: without the filter the kernel says ENOENT
        "mount_calls",
        "attempt('mount', lambda: c('mount', b'none', b'/nonexistent', b'tmpfs', 0, None))\n"
        "attempt('umount2', lambda: c('umount2', b'/nonexistent', 0))\n"
        "attempt('chroot', lambda: os.chroot('/nonexistent'))\n"
        "attempt('open_tree', lambda: sc('open_tree', -100, b'/tmp', 0))  # AT_FDCWD\n"
        "attempt('fsopen', lambda: sc('fsopen', b'tmpfs', 0))\n"
        "attempt('pivot_root', lambda: sc('pivot_root', b'/nonexistent', b'/nonexistent'))",
        "ok",
        "mount EPERM\numount2 EPERM\nchroot EPERM\nopen_tree EPERM\nfsopen EPERM\npivot_root EPERM\n",
    ),
    Kind(
        "io_uring",
        "attempt('io_uring_setup', lambda: sc('io_uring_setup', 1, None))",
        "ok",
        "io_uring_setup EPERM\n",
    ),
    Kind(  # ignoring SIGXCPU: the hard CPU limit (cpu_seconds + 1) SIGKILLs it
        "cpu_hog_ignoring_sigxcpu",
        "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True:\n    pass",
        "killed",
        "",
        signal=signal.SIGKILL,
        limits=SandboxLimits(cpu_seconds=1, wall_seconds=30),
    ),
    Kind(  # 3.11 keeps Python frames on the heap: it spins until the CPU limit
        "python_recursion_unbounded",
        "sys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
        "timeout",
        "",
        signal=signal.SIGXCPU,
        limits=SandboxLimits(cpu_seconds=1, wall_seconds=30),
    ),
    Kind(  # C recursion past the stack: a segfault, reported as such
        "c_stack_overflow",
        "sys.setrecursionlimit(10**8)\nx = []\nfor _ in range(10**6):\n    x = [x]\nprint(len(repr(x)))",
        "killed",
        "",
        signal=signal.SIGSEGV,
    ),
    Kind(
        "thread_bomb",
        "import threading, time\nn = 0\ntry:\n    while True:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n        n += 1\n"
        f"except RuntimeError as e:\n    print('refused after', n < {LIMITS.max_processes}, e)\nos._exit(0)",
        "ok",
        "refused after True can't start new thread\n",
    ),
    Kind(
        "fill_tmp",
        "def big():\n    with open('big', 'wb') as f:\n        while True:\n            f.write(b'x' * 65536)\n"
        "def many():\n    for i in range(100):\n        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (512 << 10))\nattempt('big', big)\nattempt('many', many)",
        "ok",
        "big EFBIG\nmany ENOSPC\n",
    ),
    Kind(
        "huge_argv_and_env",
        "attempt('argv', lambda: os.execv('/usr/bin/true', ['x'] * 10**6))\n"
        "attempt('env', lambda: os.execve('/usr/bin/true', ['true'], {'A': 'x' * (8 << 20)}))",
        "ok",
        "argv E2BIG\nenv E2BIG\n",
    ),
    Kind(  # invalid UTF-8 and NULs: decoded with replacement characters, never a crash
        "binary_garbage_output",
        "sys.stdout.buffer.write(bytes(range(256)) * 4 + b'\\xff\\xfe\\xc3')\n"
        "sys.stderr.buffer.write(b'\\x00\\x80bad')",
        "ok",
        (bytes(range(256)) * 4 + b"\xff\xfe\xc3").decode("utf-8", "replace"),
        stderr="\x00\ufffdbad",
    ),
    Kind(  # nothing left to read, but it runs on: the wall clock ends it
        "closes_stdout_then_sleeps",
        "os.close(1)\nos.close(2)\nimport time\ntime.sleep(1000)",
        "timeout",
        "",
        max_wall=5,
        limits=ONE_SECOND,
    ),
    Kind(  # a daemonized grandchild holds the pipes open: the run still ends with its program
        "grandchild_holds_stdout_open",
        "import time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        signal.signal(signal.SIGHUP, signal.SIG_IGN)\n        time.sleep(60)\n    os._exit(0)\n"
        "os.wait()\nprint('parent done')",
        "ok",
        "parent done\n",
        max_wall=3,
    ),
    Kind(
        "tty_injection",
        "import fcntl, termios\nfor fd in (0, 1, 2):\n"
        "    attempt(fd, lambda: fcntl.ioctl(fd, termios.TIOCSTI, b'x'))\n"
        "attempt('/dev/tty', lambda: open('/dev/tty', 'wb'))",
        "ok",
        "0 ENOTTY\n1 ENOTTY\n2 ENOTTY\n/dev/tty ENXIO\n",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", KINDS, ids=[k.kind for k in KINDS])
def test_hostile_kind(k: Kind):
    rss = psutil.Process().memory_info().rss
    r = run_python(PRELUDE + k.code, limits=k.limits)
    assert r.isolated
    assert r.status == k.status, (r.status, r.signal, r.stdout, r.stderr[-500:])
    if k.stdout is not None:
        assert r.stdout == k.stdout, r.stderr[-500:]
    if k.stderr is not None:
        assert r.stderr == k.stderr
    if k.signal is not None:
        assert r.signal == k.signal
    if k.max_wall is not None:
        assert r.wall_s < k.max_wall
    if k.status == "timeout" and k.limits.wall_seconds < 2:
        assert r.timed_out  # the wall clock ended it, not the CPU limit
    assert psutil.Process().memory_info().rss - rss < 50 * 2**20
    assert_healthy()


def test_every_kind_is_listed_in_the_docs():
    assert len({k.kind for k in KINDS}) == len(KINDS) >= 25
    doc = (Path(__file__).resolve().parent.parent / "docs" / "ENVIRONMENTS.md").read_text()
    assert [k.kind for k in KINDS if f"test_hostile_kind[{k.kind}]" not in doc] == []
