"""Shared fixtures, and the test tiers.

The Pub/Sub emulator is started once per session, on first use.

Tiers: `e2e` marks every test that starts one of our entry points or an emulator in
another process (`make test-fast` leaves them out; `make test` runs them); `slow` marks
minutes-long runs of the main job (left out unless asked for). A test gets `e2e` by using
an emulator fixture (E2E_FIXTURES), by being slow, or by a mark in its file. It cannot be forgotten: a test
without the mark that starts such a process fails, naming the command.
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

from localstack.emulators.pubsub import EmulatorUnavailable, PubSubEmulator
from localstack.launch import processes

REPO = Path(__file__).resolve().parent.parent
# Fixtures that start an emulator (it is started once, in the first test that asks).
E2E_FIXTURES = frozenset({"pubsub_emulator", "gcs"})
EMULATORS = frozenset({"gcloud", "java"})
_PACKAGES = sorted(p.parent.name for p in REPO.glob("*/__init__.py")) + ["benchmarks", "tests", "pytest"]
_OURS = re.compile(rf"(?:^|[^\w.])(?:{'|'.join(_PACKAGES)})(?:\.\w|\s+import\b|\s*$|['\"])", re.MULTILINE)
_E2E_STARTED = pytest.StashKey[list]()  # what a test not marked e2e started
_REPORTED = pytest.StashKey[bool]()

# Property tests check properties, not speed: hypothesis's 200 ms deadline per example failed
# them on a loaded machine (a 16 ms example took 311 ms beside a soak). Speed is benchmarks'.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_configure(config):
    # A test run killed by a timeout (SIGKILL) must not leave its emulators and pipelines
    # behind: a watchdog process stops every group the session starts if the session dies.
    processes.start_watchdog()
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # once, before any worker compiles
        _drop_half_written_cache_entries(os.environ.get("JAX_COMPILATION_CACHE_DIR"))


def _drop_half_written_cache_entries(cache_dir: str | None) -> None:
    """JAX's size-capped compilation cache (the Makefile's) writes an entry, then its "-atime"
    file, and before each write reads every entry's atime. A process killed between the two
    (the e2e tier kills learners) leaves an entry without one, and from then on every write
    fails (FileNotFoundError): the cache stops growing for good. Found 2026-12-06, two such
    entries in this machine's cache. The entry may be cut off too: drop it."""
    if not cache_dir or not Path(cache_dir).is_dir():
        return
    for entry in Path(cache_dir).glob("*-cache"):
        if not entry.with_name(entry.name.removesuffix("-cache") + "-atime").exists():
            entry.unlink(missing_ok=True)


# The e2e tier runs on two workers (`-n 2 --dist loadgroup`): its tests average about one
# core each (2026-12-06: 645 s of CPU in 606 s of wall, one at a time). These bound a time
# (an exit within seconds, a group gone within seconds): one worker takes all of them, one
# after another, so no two of them ever run at once.
ONE_AT_A_TIME = frozenset({"test_permanent_errors.py", "test_watchdog.py", "test_rollout_sigterm.py"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        # A slow test runs the main job: it is e2e too.
        if E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("e2e") and item.path.name in ONE_AT_A_TIME:
            item.add_marker(pytest.mark.xdist_group("one-at-a-time"))


def pytest_collection_finish(session):
    # What collection imported (jax, torch, transformers, Beam, hypothesis: millions of
    # objects) lives as long as the worker. Frozen, each full gc pass skips it: full passes
    # had taken 9-11 s of each unit-tier worker's time, about 0.3 s each.
    gc.collect()
    gc.freeze()


def e2e_command(args, cwd=None) -> str | None:
    """The command, if it is one of our entry points or an emulator in another process
    (`cwd`: where a relative script path is found, as the child will see it)."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    argv = [os.fsdecode(a) for a in argv]
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name in EMULATORS or name == "agentic-rl":
        return " ".join(argv)
    if not re.fullmatch(r"python[\d.]*", name):
        return None  # e.g. bwrap: the code sandbox, a unit of its own
    for flag, value in itertools.pairwise(argv[1:]):
        if flag == "-m" and value.split(".")[0] in _PACKAGES:
            return " ".join(argv)
        if flag == "-c" and _OURS.search(value):
            return f"{argv[0]} -c {value.strip().splitlines()[0][:80]!r}..."
    scripts = [a for a in argv[1:] if a.endswith(".py")]
    here = Path(cwd) if cwd is not None else Path.cwd()
    if any((here / s).resolve().is_relative_to(REPO) for s in scripts):
        return " ".join(argv)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Outside e2e tests, watch every subprocess started (in setup, call and teardown)."""
    if item.get_closest_marker("e2e"):
        return (yield)
    started = item.stash.setdefault(_E2E_STARTED, [])
    original = subprocess.Popen.__init__

    def watched(self, args, *rest, **kwargs):
        original(self, args, *rest, **kwargs)
        command = e2e_command(args, kwargs.get("cwd"))  # after: one that could not start started nothing
        if command:
            started.append(command)

    subprocess.Popen.__init__ = watched
    try:
        return (yield)
    finally:
        subprocess.Popen.__init__ = original


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    started = item.stash.get(_E2E_STARTED, None)
    # Reported once: with the call, or at teardown when setup failed or started it.
    if started and (report.when == "call" or (report.when == "teardown" and not item.stash.get(_REPORTED, False))):
        item.stash[_REPORTED] = True
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} is not marked e2e but started {started[0]!r}: our entry points and the emulators "
            "in another process are e2e (mark it, or add its fixture to E2E_FIXTURES in tests/conftest.py)"
        )
    return report


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory):
    """One emulator for the whole session, with PUBSUB_EMULATOR_HOST/PUBSUB_PROJECT_ID set.

    Tests share it, so they must use their own topic/subscription names (unique_name).
    """
    emu = PubSubEmulator(log_dir=tmp_path_factory.mktemp("pubsub-emulator"))
    try:
        emu.start()
    except EmulatorUnavailable as err:
        # CI must never pass by skipping the real-parts tests: fail unless a person opted out.
        if os.environ.get("ALLOW_NO_EMULATOR") == "1":
            pytest.skip(f"Pub/Sub emulator unavailable: {err}")
        raise
    try:
        emu.apply_env()
        yield emu
    finally:
        emu.stop()  # also restores the environment


@pytest.fixture
def walk_only_new_objects():
    """Tests that count or report live objects walk every gc-tracked one, several times: 11 s
    in a test worker that had run hundreds of tests. gc.freeze() moves what exists now out of
    the collector's generations, so collections and walks see only what the test makes. It
    stays frozen: unfreezing would also thaw what collection froze (pytest_collection_finish)."""
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture
def unique_name():
    """Callable making names unique per call; Pub/Sub wants >= 3 chars, starting with a letter."""

    def make(prefix: str = "test") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """family -> (Tiny, the imported directory), each written and imported once per test
    module (tests/_gguf_tiny.py makes the files; tests/test_gguf_import*.py use it)."""
    from agentic_rl import cli
    from tests import _gguf_tiny as tiny

    cache = {}

    def get(family: str):
        if family not in cache:
            root = tmp_path_factory.mktemp(family)
            made = tiny.write(root / "model.gguf", family)
            assert cli.main(["import-gguf", str(made.path), f"--out={root / 'out'}"]) == 0
            cache[family] = (made, root / "out")
        return cache[family]

    return get
