"""Shared fixtures. The Pub/Sub emulator is started once per session, on first use."""

from __future__ import annotations

import os
import uuid

import pytest

from localstack.emulators.pubsub import EmulatorUnavailable, PubSubEmulator
from localstack.launch import processes


def pytest_configure(config):
    # A test run killed by a timeout (SIGKILL) must not leave its emulators and pipelines
    # behind: a watchdog process stops every group the session starts if the session dies.
    processes.start_watchdog()


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
def unique_name():
    """Callable making names unique per call; Pub/Sub wants >= 3 chars, starting with a letter."""

    def make(prefix: str = "test") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    return make
