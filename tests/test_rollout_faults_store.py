"""The policy store's newest version unreadable for a while, under a running rollout job
(tests/_rollout_job.py): workers serve their last good version, count the failures, and
take the next good version when it appears. A damaged data file (truncated, or bytes
flipped that Orbax would decode to other numbers) is caught by the version's checksum
manifest and counted as a checksum failure too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from core.contracts.store import PolicyStore
from core.policy.model.transformer import abstract_tree
from tests._rollout_job import (
    GROUP,
    STARTUP_S,
    Job,
    group_of,
    params_of,
    store_with_v0,
)

# -- the policy store's newest version unreadable for a while ------------------------------------


def _data_files(version_dir: Path) -> list[Path]:
    """The version's array data files (Orbax OCDBT chunks), largest first."""
    files = (p for p in version_dir.rglob("*") if p.is_file() and p.parent.name == "d")
    return sorted(files, key=lambda p: -p.stat().st_size)


def _move_away(store: PolicyStore, version: int):
    """The version's directory gone (deleted, or a bucket prefix not yet synced); restore() brings it back."""
    path = Path(os.fspath(store.version_path(version)))
    aside = Path(os.fspath(store.root)).parent / f"aside-{path.name}"
    path.rename(aside)
    return lambda: aside.rename(path)


def _chmod_000(store: PolicyStore, version: int):
    """Every file of the version unreadable (needs a non-root user); restore() gives the modes back."""
    files = [p for p in Path(os.fspath(store.version_path(version))).rglob("*") if p.is_file()]
    modes = {p: p.stat().st_mode for p in files}
    for p in files:
        p.chmod(0)

    def restore():
        for p, mode in modes.items():
            p.chmod(mode)

    return restore


def _truncate(store: PolicyStore, version: int):
    """The largest data file cut to half its size: a partial write or copy."""
    f = _data_files(Path(os.fspath(store.version_path(version))))[0]
    os.truncate(f, f.stat().st_size // 2)


def _corrupt_bytes(store: PolicyStore, version: int):
    """64 bytes inverted inside the largest data file, same size: a disk or copy corruption.

    The chunks are zstd-compressed, so whether Orbax notices depends on where the damage
    lands: offsets are tried until a bare Orbax restore (no checksum check) gives the
    version without an error and with other numbers, the corruption that would be served
    silently without the manifest. The workers must refuse it."""
    path = store.version_path(version)
    f = _data_files(Path(os.fspath(path)))[0]
    original = f.read_bytes()
    want = params_of(version)
    for where in (0.5, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 0.1, 0.9):
        at = int(len(original) * where)
        f.write_bytes(original[:at] + bytes(b ^ 0xFF for b in original[at : at + 64]) + original[at + 64 :])
        try:
            with ocp.StandardCheckpointer() as ckptr:
                got = ckptr.restore(path, abstract_tree(want))
        except Exception:  # noticed by Orbax: try elsewhere
            continue
        if not all(
            np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))
        ):
            return
    raise AssertionError("no offset gave a silently corrupt version: the test needs other offsets")


def _chmod_denies_reads() -> bool:
    """False for root (or anyone with CAP_DAC_OVERRIDE): mode 000 does not stop it reading."""
    with tempfile.TemporaryDirectory() as d:
        probe = Path(d, "probe")
        probe.write_text("x")
        probe.chmod(0)
        try:
            probe.read_text()
        except PermissionError:
            return True
        finally:
            probe.chmod(0o600)
    return False


DURING_IDS = ("unreadable-0", "unreadable-1")
RECOVERED_IDS = ("recovered-0", "recovered-1")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "damage, recovery",
    [
        pytest.param(_move_away, "restored", id="version_dir_deleted-then-restored"),
        pytest.param(
            _chmod_000,
            "restored",
            id="files_unreadable-then-restored",
            marks=pytest.mark.skipif(
                not _chmod_denies_reads(),
                reason="chmod 000 does not stop this user reading (root, CAP_DAC_OVERRIDE); "
                "version_dir_deleted and partial_data_file make the newest version unreadable instead",
            ),
        ),
        pytest.param(_truncate, "next_version", id="partial_data_file-then-next_version"),
        pytest.param(
            _corrupt_bytes,
            "next_version",
            id="corrupt_data_bytes-then-next_version",
        ),
    ],
)
def test_workers_serve_their_last_good_version_while_the_newest_is_unreadable(
    pubsub_emulator, tmp_path, damage, recovery
):
    store = store_with_v0(tmp_path)
    with Job(pubsub_emulator, tmp_path, store) as job:
        job.send("v0", "ok")
        job.wait_for("a first request served", lambda: job.done("v0"), STARTUP_S)
        # Version 1: complete, then damaged, and only then made LATEST (so no poll loads it whole).
        store._write_version(1, params_of(1))
        version_dir = Path(os.fspath(store.version_path(1)))
        damaged = _data_files(version_dir)[0].relative_to(version_dir).as_posix()  # what both damages hit
        restore = damage(store, 1)
        store._write_pointer(1)

        def reload_failed_or_loaded():
            row = job.telemetry()
            return row.get("rollout/policy_reload_failures", 0) >= 2 or row.get("rollout/policy_version", 0) != 0

        job.wait_for("failed policy reloads", reload_failed_or_loaded, 30)
        during = job.telemetry()
        assert during["rollout/policy_version"] == 0 and during["rollout/policy_reload_failures"] >= 2, during
        by_checksum = damage in (_truncate, _corrupt_bytes)  # the others leave no file to check
        assert (during["rollout/policy_checksum_failures"] >= 2) == by_checksum, during
        if by_checksum:
            assert f"checksum mismatch in {damaged}" in job.group.log_path.read_text(errors="replace")
        for i in range(2):
            job.send(f"unreadable-{i}", "ok", i)
        job.wait_for("requests served while the newest version is unreadable", lambda: job.done(*DURING_IDS), 60)
        if recovery == "restored":
            restore()
            want = 1
        else:
            store.publish(2, params_of(2))
            want = 2
        job.wait_for(f"version {want} loaded", lambda: job.telemetry().get("rollout/policy_version") == want, 30)
        failures = job.telemetry()["rollout/policy_reload_failures"]
        for i in range(2):
            job.send(f"recovered-{i}", "ok", 10 + i)
        job.wait_for("requests served after the recovery", lambda: job.done(*RECOVERED_IDS), 60)
        alive, log = job.group.poll() is None, job.group.log_tail()
    got, last = job.trajectories(), job.telemetry()
    assert alive, log

    def versions(request_ids):
        ts = [t for r in request_ids for t in group_of(got, r)]
        assert len(ts) == GROUP * len(request_ids), request_ids
        return {v for t in ts for v in t["versions"]}, {t["record_versions"] for t in ts}

    assert versions(["v0"]) == ({0}, {(0, 0)})
    assert versions(DURING_IDS) == ({0}, {(0, 0)})  # kept serving the last good version
    assert versions(RECOVERED_IDS) == ({want}, {(want, want)})  # and took the next good one
    assert last["rollout/policy_version"] == want
    assert last["rollout/policy_reloads"] == 2  # version 0, then `want`
    assert last["rollout/policy_reload_failures"] == failures  # none once a good version was loaded
