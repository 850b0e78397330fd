"""However a launcher dies (SIGKILL included), what it started dies with it: the watchdog
(localstack/launch/watchdog.py) stops every process group it registered, the emulator's JVM too."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from localstack.launch.processes import group_alive
from localstack.launch.watchdog import read_registry

REPO = Path(__file__).resolve().parents[1]


def _members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.info["pid"]) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.info["pid"])
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


def _watchdogs_of(parent: int) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "localstack.launch.watchdog" in cmd and f"--parent={parent}" in cmd:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p.info["pid"])
            except psutil.NoSuchProcess:
                continue
    return found


def _kill_groups(*pgids: int) -> None:
    for g in pgids:
        try:
            os.killpg(g, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_until(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


PARENT = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from pathlib import Path
    from localstack.launch import processes
    from localstack.launch.processes import ProcessGroup
    from localstack.emulators.pubsub import PubSubEmulator

    out, mode = Path(sys.argv[1]), sys.argv[2]
    processes.start_watchdog()
    emu = PubSubEmulator(log_dir=out.parent / "emu").start()
    group = ProcessGroup(["sleep", "300"], out.parent / "sleep.log").start()
    stray = subprocess.Popen(["sleep", "300"], start_new_session=True)  # not ours to stop
    info = {"emulator": emu._proc.pid, "group": group.pid, "stray": stray.pid}
    out.write_text(json.dumps(info))
    if mode == "exit":
        group.stop()
        emu.stop()
        sys.exit(0)
    time.sleep(300)
    """
)


def _start_parent(tmp_path, mode: str):
    out = tmp_path / "info.json"
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(out), mode], cwd=REPO)
    assert _wait_until(lambda: out.exists() and out.read_text(), 90), "parent did not start its children"
    return proc, json.loads(out.read_text())


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_sigkilled_parent_takes_its_groups_and_the_emulators_jvm_with_it(tmp_path):
    parent, info = _start_parent(tmp_path, "hold")
    try:
        assert _members(info["emulator"]) and group_alive(info["group"]) and _watchdogs_of(parent.pid)
        jvm = [p for p in _members(info["emulator"]) if "java" in " ".join(psutil.Process(p).cmdline())]
        assert jvm, "the emulator's JVM is a grandchild in the emulator's group"
        parent.kill()  # no handler, no atexit, no finally
        parent.wait()
        assert _wait_until(lambda: not _members(info["emulator"]) and not group_alive(info["group"]), 15)
        assert _wait_until(lambda: not _watchdogs_of(parent.pid), 5)
        assert psutil.pid_exists(info["stray"])  # never registered: left alone
    finally:  # whatever the outcome, leave nothing running
        if parent.poll() is None:
            parent.kill()
        _kill_groups(info["emulator"], info["group"])
        _kill_pid(info["stray"])


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_normal_exit_ends_the_watchdog_and_kills_nothing(tmp_path):
    parent, info = _start_parent(tmp_path, "exit")
    try:
        assert parent.wait(timeout=60) == 0
        assert _wait_until(lambda: not _watchdogs_of(parent.pid), 5)
        assert psutil.pid_exists(info["stray"]) and psutil.Process(info["stray"]).status() != psutil.STATUS_ZOMBIE
    finally:
        _kill_groups(info["emulator"], info["group"])
        _kill_pid(info["stray"])


def test_the_registry_forgets_stopped_groups():
    import tempfile

    with tempfile.NamedTemporaryFile("w", delete=False) as f:
        f.write("+10\n+11\n-10\n+12\ngarbage\n-99\n")
    try:
        assert read_registry(Path(f.name)) == [11, 12]
    finally:
        os.unlink(f.name)


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_sigkilled_test_session_leaves_no_emulator(tmp_path):
    """The suite's own harness: a pytest session killed by a CI timeout."""
    out = tmp_path / "probe.json"
    env = {**os.environ, "HARNESS_PROBE_OUT": str(out)}
    env.pop("PUBSUB_EMULATOR_HOST", None)  # its own emulator, not ours
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/harness_probe.py"]
    session = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_until(lambda: out.exists() and out.read_text(), 120), "the probe session did not start"
        info = json.loads(out.read_text())
        assert _members(info["emulator_pgid"])
        session.kill()
        session.wait()
        assert _wait_until(lambda: not _members(info["emulator_pgid"]), 15), "the session's emulator survived"
        assert _wait_until(lambda: not _watchdogs_of(session.pid), 5)
    finally:
        if session.poll() is None:
            session.kill()
        if out.exists() and out.read_text():
            _kill_groups(json.loads(out.read_text())["emulator_pgid"])
