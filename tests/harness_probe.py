"""Not collected by the suite (no test_ prefix): tests/test_watchdog.py runs it as its own
pytest session, with this repo's conftest, then SIGKILLs that session."""

import json
import os
import time


def test_hold_an_emulator(pubsub_emulator):
    info = {"pytest_pid": os.getpid(), "emulator_pgid": pubsub_emulator._proc.pid}
    with open(os.environ["HARNESS_PROBE_OUT"], "w") as f:
        json.dump(info, f)
    time.sleep(300)  # until killed
