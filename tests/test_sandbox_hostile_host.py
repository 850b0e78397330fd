"""Hostile programs the host has to set up or inspect: its sockets, its policy store and
checkpoints, its secrets, other episodes, and processes meant to outlive the episode.

All through the REAL sandbox; the table of simpler kinds is tests/test_sandbox_hostile.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
import uuid

import psutil
import pytest
from test_sandbox import _sandbox_process, assert_healthy

from environments import sandbox as S
from environments.sandbox import SandboxLimits, run_python, run_python_async

pytestmark = pytest.mark.skipif(S.BWRAP_PATH is None, reason="bubblewrap is not installed")
FIND = (  # find(name): every directory holding a file of that name, /usr (host binaries) aside
    "import os\n"
    "def find(name):\n    hits = []\n    for root, dirs, files in os.walk('/'):\n"
    "        if root == '/':\n            dirs.remove('usr')\n        hits += [root] * (name in files)\n"
    "    return hits\n"
)
TRY = (  # try_all(paths, fn): prints "PATH OK" or "PATH ERRNO-NAME" for each
    "import errno, os, socket\n"
    "def try_all(items, fn):\n    for x in items:\n        try:\n            fn(x)\n"
    "        except OSError as e:\n            print(x, errno.errorcode.get(e.errno, e.errno))\n"
    "        else:\n            print(x, 'OK')\n"
)


def _with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or ()):
            found.append(p)
    return found


def test_host_unix_sockets_are_unreachable(tmp_path):
    path = tmp_path / "host.sock"
    abstract = "\0host-" + uuid.uuid4().hex
    servers = []
    for addr in (str(path), abstract):
        s = socket.socket(socket.AF_UNIX)
        s.bind(addr)
        s.listen(8)
        s.setblocking(False)
        servers.append(s)
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o777)  # anyone on the host may connect: only the namespaces stop it
    targets = [
        str(path),
        abstract,
        "/var/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/run/dbus/system_bus_socket",
    ]
    try:
        r = run_python(TRY + f"try_all({targets!r}, lambda a: socket.socket(socket.AF_UNIX).connect(a))")
        expected = [f"{path} ENOENT", f"{abstract} ECONNREFUSED"] + [f"{t} ENOENT" for t in targets[2:]]
        assert (r.status, r.stdout.splitlines()) == ("ok", expected)
        for s in servers:
            with pytest.raises(BlockingIOError):  # nobody ever knocked
                s.accept()
    finally:
        for s in servers:
            s.close()
    assert_healthy()


@pytest.mark.parametrize("name", ["policy-store", "checkpoint"])
def test_policy_store_and_checkpoints_cannot_be_touched(tmp_path, name):
    store = tmp_path / name
    (store / "step_100").mkdir(parents=True)
    weights = store / "step_100" / "params.msgpack"
    weights.write_bytes(b"REAL-WEIGHTS-" + uuid.uuid4().bytes)
    for p in (tmp_path, store, store / "step_100"):
        os.chmod(p, 0o777)  # world-writable on the host: only the mount namespace stops it
    os.chmod(weights, 0o666)
    before = (weights.read_bytes(), weights.stat().st_mtime_ns, sorted(os.walk(store)))
    w, d = str(weights), str(store)
    code = TRY + (
        f"w, d = {w!r}, {d!r}\n"
        "try_all(['overwrite'], lambda _: open(w, 'wb').write(b'poisoned'))\n"
        "try_all(['create'], lambda _: open(d + '/step_999', 'w').write('x'))\n"
        "try_all(['unlink'], lambda _: os.unlink(w))\n"
        "try_all(['rename'], lambda _: os.rename(d + '/step_100', d + '/step_0'))\n"
        "try_all(['via_dotdot'], lambda _: open('/tmp/../..' + w, 'wb').write(b'poisoned'))\n"
        "os.symlink(w, 'link')\n"
        "try_all(['via_symlink'], lambda _: open('link', 'wb').write(b'poisoned'))\n"
        # Rebuilding the same path inside its own /tmp works, and lands in its own /tmp.
        "try_all(['rebuild'], lambda _: (os.makedirs(os.path.dirname(w)), open(w, 'wb').write(b'poisoned')))\n"
    )
    r = run_python(code)
    assert r.status == "ok", r.stderr
    assert r.stdout.splitlines() == [
        "overwrite ENOENT",
        "create ENOENT",
        "unlink ENOENT",
        "rename ENOENT",
        "via_dotdot ENOENT",
        "via_symlink ENOENT",
        "rebuild OK" if w.startswith("/tmp/") else "rebuild EROFS",
    ]
    assert (weights.read_bytes(), weights.stat().st_mtime_ns, sorted(os.walk(store))) == before
    assert_healthy()


@pytest.mark.parametrize("bwrap", [S._AUTO, None], ids=["bwrap", "fallback"])
def test_host_secrets_in_the_environment_do_not_leak(monkeypatch, bwrap):
    secret = "sk-" + uuid.uuid4().hex
    for var in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "WANDB_API_KEY", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.setenv(var, secret)
    r = run_python(
        TRY + "print(sorted(os.environ))\n"
        "try_all(['/proc/self/environ', '/proc/1/environ'], lambda p: print(open(p, 'rb').read()))",
        bwrap=bwrap,
    )
    assert r.status == "ok" and secret not in r.stdout + r.stderr
    assert set(eval(r.stdout.splitlines()[0])) <= {"PATH", "PWD", "LC_CTYPE"}
    if bwrap is S._AUTO:
        assert r.stdout.splitlines()[1:] == ["/proc/self/environ ENOENT", "/proc/1/environ ENOENT"]
    assert_healthy()


def test_another_episodes_work_directory_is_invisible():
    name = f"answer-{uuid.uuid4().hex}.txt"
    first = run_python(f"open({name!r}, 'w').write('42')\nimport os\nprint(sorted(os.listdir('.')))")
    assert first.stdout == f"{sorted(['main.py', name])}\n"
    second = run_python(FIND + f"print(sorted(os.listdir('/tmp')))\nprint(find({name!r}))")
    assert (second.status, second.stdout) == ("ok", "['main.py']\n[]\n")
    assert_healthy()


@pytest.mark.timeout(60)
def test_a_concurrent_episode_cannot_reach_another():
    # A listens on an abstract socket and keeps a file; B, running at the same time,
    # connects, looks for the file and SIGKILLs every pid it can name. A must not notice.
    tag = uuid.uuid4().hex
    a_src = (
        "import os, socket, time\n"
        f"open('a-{tag}', 'w').write('x')\n"
        f"s = socket.socket(socket.AF_UNIX)\ns.bind('\\0a-{tag}')\ns.listen(1)\n"
        "print('ready', flush=True)\ntime.sleep(3)\nprint('a alive', sorted(os.listdir('.')))"
    )
    b_src = (
        FIND
        + TRY
        + (
            "import time\ntime.sleep(0.5)\n"
            f"try_all(['connect'], lambda _: socket.socket(socket.AF_UNIX).connect('\\0a-{tag}'))\n"
            f"print('file', find('a-{tag}'))\n"
            "try_all(['kill-1'], lambda _: os.kill(-1, 9))\n"
            "hit = []\nfor pid in range(1, 4096):\n    if pid not in (1, os.getpid()):\n"
            "        try:\n            os.kill(pid, 9)\n            hit.append(pid)\n"
            "        except OSError:\n            pass\nprint('hit', hit)"
        )
    )

    async def both():
        slow_ok = SandboxLimits(wall_seconds=20)
        return await asyncio.gather(run_python_async(a_src, limits=slow_ok), run_python_async(b_src, limits=slow_ok))

    a, b = asyncio.run(both())
    assert (a.status, a.stdout) == ("ok", f"ready\na alive ['a-{tag}', 'main.py']\n")
    assert (b.status, b.stdout) == ("ok", "connect ECONNREFUSED\nfile []\nkill-1 ESRCH\nhit []\n")
    assert_healthy()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["exits", "times_out", "killed_by_cpu"])
def test_a_daemon_does_not_outlive_the_episode(ending):
    """Double fork + setsid + SIGHUP/SIGTERM ignored, then exec with a marker in argv: the
    host sees it running during the episode and never after, however the episode ends."""
    marker = f"daemon-{uuid.uuid4().hex}"
    # (how the program ends, its wall-clock limit, the (status, timed_out, signal) expected);
    # generous walls where the wall clock must not be what ends it (a loaded machine).
    end, wall, expected = {
        "exits": ("time.sleep(1)\nprint('bye')", 15, ("ok", False, None)),
        "times_out": ("time.sleep(1000)", 3, ("timeout", True, signal.SIGKILL)),
        "killed_by_cpu": ("while True:\n    pass", 30, ("timeout", False, signal.SIGXCPU)),
    }[ending]
    code = (
        "import os, signal, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        for s in (signal.SIGHUP, signal.SIGTERM):\n            signal.signal(s, signal.SIG_IGN)\n"
        f"        os.execv('/usr/bin/sleep', [{marker!r}, '600'])\n    os._exit(0)\n"
        f"os.wait()\n{end}"
    )
    seen = threading.Event()
    stop = threading.Event()

    def watch():
        while not stop.is_set() and not seen.is_set():
            if _with_marker(marker):
                seen.set()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = run_python(code, limits=SandboxLimits(cpu_seconds=1, wall_seconds=wall))
    finally:
        stop.set()
        watcher.join()
    assert seen.is_set(), "the daemon never ran: this test would prove nothing"
    assert (r.status, r.timed_out, r.signal) == expected
    deadline = time.monotonic() + 3  # a SIGKILLed namespace takes a moment to be reaped
    while _with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _with_marker(marker) == []
    assert_healthy()


@pytest.mark.timeout(60)
def test_fd_exhaustion_in_every_process_leaves_the_host_and_the_next_run_alone():
    fds = psutil.Process().num_fds()
    # 8 processes: within the whole-run memory bound only with less address space each.
    limits = SandboxLimits(wall_seconds=20, max_processes=8, memory_bytes=128 * 2**20)
    r = run_python(
        "import os, time\nfor _ in range(7):\n    if os.fork() == 0:\n        break\n"
        "n = 0\ntry:\n    while True:\n        os.pipe()\n        n += 2\n"
        f"except OSError as e:\n    os.write(1, f'{{e.errno}} {{n < {limits.max_open_files}}}\\n'.encode())\n"
        "time.sleep(0.5)",
        limits=limits,
    )
    assert r.status == "ok" and r.stdout.splitlines() == ["24 True"] * 8, r.stderr
    assert psutil.Process().num_fds() == fds
    assert run_python("print('next')").stdout == "next\n"
    with open(os.devnull) as fh:
        assert fh.read() == ""
    assert_healthy()


@pytest.mark.timeout(60)
def test_forked_memory_hogs_stay_within_the_whole_run_bound():
    """Forks far past max_processes, every child filling real pages until MemoryError: the
    refused forks fail, the rest hit their own limit, and the host never sees the run's
    processes hold more than worst_case_memory_bytes between them."""
    limits = SandboxLimits(wall_seconds=20, memory_bytes=128 * 2**20)  # gentle on a loaded host
    forks = limits.max_processes + 20
    code = (
        f"import os, time\nkids = refused = 0\nfor _ in range({forks}):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        refused += 1\n        continue\n    if pid == 0:\n        held = []\n"
        "        try:\n            while True:\n                held.append(b'x' * (8 << 20))  # real pages\n"
        "        except MemoryError:\n            os.write(1, b'child MemoryError\\n')\n"
        "        time.sleep(1.5)  # hold it while the host looks\n        os._exit(0)\n    kids += 1\n"
        "for _ in range(kids):\n    os.wait()\nprint(kids, refused)"
    )
    me, host_rss, peak = psutil.Process(), psutil.Process().memory_info().rss, [0]
    stop = threading.Event()

    def watch():  # the run's processes are our descendants: bwrap, its pid 1, the program
        while not stop.is_set():
            total = 0
            for p in filter(_sandbox_process, me.children(recursive=True)):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], total)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = run_python(code, limits=limits)
    finally:
        stop.set()
        watcher.join()
    kids = limits.max_processes - 1
    assert r.status == "ok", (r.status, r.stdout, r.stderr[-500:])
    assert r.stdout == "child MemoryError\n" * kids + f"{kids} {forks - kids}\n"
    # Every child really filled most of its limit at once, and all of them stayed in bound.
    assert kids * limits.memory_bytes // 2 < peak[0] <= limits.worst_case_memory_bytes, peak[0]
    assert psutil.Process().memory_info().rss - host_rss < 50 * 2**20
    assert_healthy()
