"""Readers of the policy store never write to it (docs/DEPLOY.md grants them
roles/storage.objectViewer only): the rollout worker's poller, the evaluator, `generate`
and `export` load a real published version from a store made read-only, and succeed.

`chmod -R a-w` alone proves nothing when the tests run as root (root writes anyway), so
two audits stand beside it: a Python audit hook records every open with a write or create
flag and every mkdir, rename, remove, chmod, ... on a path in the store, whichever library
makes the call (ours, Orbax, etils); and a snapshot of the tree (every entry's size, mode
and mtime, directories included, whose mtime changes on any create, delete or rename in
them) catches what native code (TensorStore) might write. A writer is audited too, so the
audit is known to see writes."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest
from flax import nnx

from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sources import policy_metadata

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Audit events (path arguments first) that change the filesystem.
_MUTATING = {
    "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.chmod", "os.chown", "os.symlink", "os.link",
    "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.copyfile",
    "shutil.copytree", "shutil.move", "os.chflags", "os.mkfifo", "os.mknod",
}  # fmt: skip


class _Audit:
    """One process-wide hook (audit hooks cannot be removed), recording only while a
    root is watched."""

    _installed = False

    def __init__(self):
        self.root: str | None = None
        self.events: list[tuple] = []
        self._lock = threading.Lock()

    def _inside(self, path) -> bool:
        if isinstance(path, int) or path is None:
            return False
        try:
            return os.path.abspath(os.fsdecode(path)).startswith(self.root)
        except TypeError:
            return False

    def __call__(self, event: str, args: tuple) -> None:
        if self.root is None:
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and self._inside(path):
                with self._lock:
                    self.events.append((event, os.fsdecode(path), mode, flags))
        elif event in _MUTATING and any(self._inside(a) for a in args[:2]):
            with self._lock:
                self.events.append((event, *map(repr, args[:2])))

    def watch(self, root: Path) -> _Audit:
        if not _Audit._installed:
            sys.addaudithook(self)
            _Audit._installed = True
        self.root, self.events = os.fspath(root.resolve()), []
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.root = None


AUDIT = _Audit()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root, the root included: type, mode, size, mtime."""
    out = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        out[os.fspath(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def set_writable(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~bits)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with version 0 of the built-in policy, published through the store's API,
    then made read-only (chmod -R a-w). Writable again afterwards, so it can be removed."""
    root = tmp_path_factory.mktemp("readers") / "policy-store"
    cfg = ModelConfig()
    params = nnx.to_pure_dict(split_params(init_model(cfg, seed=0))[1])
    PolicyStore(root).publish(0, params, policy_metadata(cfg, step=7))
    set_writable(root, False)
    yield root
    set_writable(root, True)


def read_only(root: Path, reader):
    """Runs reader() audited: returns its result; fails on any write to the store."""
    before = snapshot(root)
    with AUDIT.watch(root) as audit:
        result = reader()
    assert audit.events == [], f"a reader wrote to the policy store: {audit.events[:5]}"
    assert snapshot(root) == before, "the policy store changed under a reader"
    return result


def test_the_rollout_workers_poller_loads_without_writing(store):
    from core.policy.sampling.sampler import Sampler
    from core.policy.sources import policy_spec
    from core.policy.versions import VersionLoader, base_params
    from rollout.policy_poller import PolicyHandle

    def poll():  # as rollout/worker.py builds it
        spec = policy_spec(None, "tiny")
        sampler = Sampler(spec.cfg, 2, 64)
        s = PolicyStore(store)
        loader = VersionLoader(s, spec.cfg, sampler.abstract_params, base_params(spec.checkpoint))
        handle = PolicyHandle(s, sampler.abstract_params, 0.0, loader=loader)
        handle.wait_for_first(timeout_s=30)
        handle.maybe_reload(force=True)  # a second poll: LATEST again, nothing newer
        return handle

    handle = read_only(store, poll)
    assert (handle.version, handle.reloads, handle.failed_loads) == (0, 1, 0)
    assert handle.params is not None


def test_the_evaluator_loads_without_writing(store, tmp_path, monkeypatch):
    from rollout import evaluator

    scored = []

    def fake_evaluate(params, sampler, env, tasks, limits, env_config, fmt, examples=0, superseded=None, samples=1):
        scored.append(params)  # the episodes are not what is audited here: the load is
        row = {"n": len(tasks) * samples, "tasks": len(tasks), "success": 0.0, "mean_turns": 1.0, "status": {}}
        return {**row, "outcomes": {}, "eval_s": 0.0}

    monkeypatch.setattr(evaluator, "evaluate", fake_evaluate)
    (tmp_path / "final").write_text("0")
    args = evaluator.parse_args(
        [f"--policy_root={store}", f"--out={tmp_path / 'eval.jsonl'}", f"--stop_file={tmp_path / 'final'}",
         "--n=2", "--slots=2", "--modes=greedy", "--poll_s=0.1", "--timeout_s=60"]
    )  # fmt: skip
    rows = read_only(store, lambda: evaluator.run(args))
    assert [(r["version"], r["step"], r["mode"]) for r in rows] == [(0, 7, "greedy")] and len(scored) == 1


def test_generate_and_export_load_without_writing(store, tmp_path):
    from agentic_rl import export, generate

    got = read_only(
        store,
        lambda: generate.run(generate.GenerateConfig(model=f"store:{store}", prompt="2+3?", max_new_tokens=2,
                                                     greedy=True)),
    )  # fmt: skip
    assert got["model"] == f"store:{store}@0" and len(got["ids"]) >= 1
    out = read_only(store, lambda: export.run(export.ExportConfig(store=str(store), out=str(tmp_path / "hf"))))
    assert out["version"] == 0 and (tmp_path / "hf" / "config.json").exists()


def test_the_audit_sees_a_writer(tmp_path):
    """Not vacuous: publishing (the learner's side) is caught by both audits."""
    root = tmp_path / "policy-store"
    root.mkdir()
    before = snapshot(root)
    cfg = ModelConfig()
    params = nnx.to_pure_dict(split_params(init_model(cfg, seed=1))[1])
    with AUDIT.watch(root) as audit:
        PolicyStore(root).publish(0, params, policy_metadata(cfg))
    kinds = {e[0] for e in audit.events}
    assert "open" in kinds and {"os.mkdir", "os.rename"} <= kinds, audit.events[:10]
    assert snapshot(root) != before
