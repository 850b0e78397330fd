"""Policy store: the learner publishes policy versions, rollout workers poll them.

Layout under `root` (a local directory; gs:// later, through etils.epath):
    policies/<version:08d>/        Orbax checkpoint of the params pytree, then
    policies/<version:08d>/metadata.json   written after Orbax has finalised the data
    LATEST                         {"version", "path", "written_at"}, written last

Two commit points make a reader safe: a version directory counts only once its
metadata.json exists (Orbax's own tmp dirs and half-written dirs never do), and
readers start from LATEST, which is replaced atomically after the version is whole.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from typing import Any

from etils import epath
import jax
import orbax.checkpoint as ocp

LATEST = "LATEST"
METADATA = "metadata.json"
# Finished dirs are "00000012"; Orbax's in-flight ones are "00000012.orbax-checkpoint-tmp-<ts>".
_DIR_RE = re.compile(r"^(\d{8,})(\.orbax-checkpoint-tmp.*)?$")


class StoreError(RuntimeError):
    """The store is corrupt, or a requested version is missing or incomplete."""


def _is_local(path: epath.Path) -> bool:
    return "://" not in os.fspath(path)


def _write_atomic(path: epath.Path, text: str) -> None:
    """Replace `path` so a reader sees the old or the new content, never a mix."""
    if not _is_local(path):
        path.write_text(text)  # object stores (GCS) replace whole objects atomically
        return
    fd, tmp = tempfile.mkstemp(dir=os.fspath(path.parent), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # data on disk before the rename makes it visible
        os.replace(tmp, os.fspath(path))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _check_matches(params: Any, target: Any, what: str) -> None:
    """Orbax checks shapes for jax arrays but restores numpy leaves at their stored
    shape, so verify the result against the target ourselves."""
    if jax.tree.structure(params) != jax.tree.structure(target):
        raise StoreError(f"cannot restore {what}: structure differs from the target")
    for (key, got), want in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(target)):
        if hasattr(want, "shape") and (got.shape, got.dtype) != (tuple(want.shape), want.dtype):
            raise StoreError(
                f"cannot restore {what}: {jax.tree_util.keystr(key)} is {got.dtype}{list(got.shape)},"
                f" target wants {want.dtype}{list(want.shape)}"
            )


class PolicyStore:
    """Versioned params on disk; one writer (the learner), many pollers."""

    def __init__(self, root: str | os.PathLike):
        self.root = epath.Path(root)
        self.policies_dir = self.root / "policies"

    def version_path(self, version: int) -> epath.Path:
        return self.policies_dir / f"{version:08d}"

    # ---- writer -------------------------------------------------------------
    def publish(self, version: int, params: Any, metadata: dict | None = None) -> epath.Path:
        """Writes `params` as `version` and then points LATEST at it (blocking)."""
        if type(version) is not int or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        current = self.latest_version()
        if current is not None and version <= current:
            raise ValueError(f"version {version} must be greater than LATEST version {current}")
        path = self._write_version(version, params, metadata)
        self._write_pointer(version)
        return path

    def _write_version(self, version: int, params: Any, metadata: dict | None = None) -> epath.Path:
        """Step 1 of publish: the complete version directory, not yet visible via LATEST."""
        path = self.version_path(version)
        self.policies_dir.mkdir(parents=True, exist_ok=True)
        # force=True: a leftover dir for this version (crash before LATEST) is unreferenced, so
        # overwriting it is safe. The context exit waits for the async save and finalisation.
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(path, params, force=True)
            ckptr.wait_until_finished()
        meta = {"version": version, "written_at": time.time(), "metadata": metadata or {}}
        _write_atomic(path / METADATA, json.dumps(meta))  # the per-version commit marker
        return path

    def _write_pointer(self, version: int) -> None:
        """Step 2 of publish: make `version` the one readers see."""
        pointer = {"version": version, "path": os.fspath(self.version_path(version)), "written_at": time.time()}
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.root / LATEST, json.dumps(pointer))

    # ---- readers ------------------------------------------------------------
    def latest_version(self) -> int | None:
        """The version LATEST points at, or None before the first publish."""
        path = self.root / LATEST
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            version = json.loads(text)["version"]
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"corrupt {path}: {e}; content starts {text[:100]!r}") from None
        if type(version) is not int or version < 0:
            raise StoreError(f"corrupt {path}: version {version!r:.50} is not a non-negative int")
        return version

    def is_complete(self, version: int) -> bool:
        return (self.version_path(version) / METADATA).exists()

    def versions(self) -> list[int]:
        """Complete versions on disk, ascending (some may be newer than LATEST)."""
        return sorted(v for v, tmp, p in self._scan() if tmp is None and (p / METADATA).exists())

    def read_metadata(self, version: int) -> dict:
        try:
            return json.loads((self.version_path(version) / METADATA).read_text())
        except FileNotFoundError:
            raise StoreError(f"policy version {version} is missing or incomplete") from None
        except ValueError as e:
            raise StoreError(f"corrupt metadata for policy version {version}: {e}") from None

    def load(self, version: int, target: Any) -> Any:
        """Params of `version`, restored with exactly the structure/shapes/dtypes of
        `target` (concrete arrays or jax.ShapeDtypeStruct; shardings are honoured)."""
        path = self.version_path(version)
        if not self.is_complete(version):
            raise StoreError(f"policy version {version} at {path} is missing or incomplete")
        # A fresh checkpointer per load: nothing cached between polls.
        try:
            with ocp.StandardCheckpointer() as ckptr:
                params = ckptr.restore(path, target)
        except Exception as e:  # orbax raises many types; callers need one
            raise StoreError(f"cannot restore policy version {version} from {path}: {e}") from e
        _check_matches(params, target, f"policy version {version}")
        return params

    def load_latest(self, target: Any) -> tuple[int, Any] | None:
        version = self.latest_version()
        if version is None:
            return None
        return version, self.load(version, target)

    # ---- housekeeping -------------------------------------------------------
    def _scan(self) -> list[tuple[int, str | None, epath.Path]]:
        """(version, tmp suffix or None, path) for every version-like dir."""
        if not self.policies_dir.exists():
            return []
        out = []
        for child in self.policies_dir.iterdir():
            if m := _DIR_RE.match(child.name):
                out.append((int(m.group(1)), m.group(2), child))
        return out

    def gc(self, keep: int) -> list[int]:
        """Deletes all but the `keep` newest versions at or below LATEST (LATEST itself is
        always kept), plus abandoned tmp/incomplete dirs older than LATEST. Dirs newer than
        LATEST are left alone: a publish may be writing them. Returns deleted versions."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        latest = self.latest_version()
        if latest is None:
            return []
        complete = [v for v in self.versions() if v <= latest]
        doomed = set(complete[:-keep]) - {latest}
        deleted = []
        for v, tmp, path in self._scan():
            abandoned = (tmp is not None and v <= latest) or (tmp is None and v < latest and v not in complete)
            if abandoned or (tmp is None and v in doomed):
                path.rmtree(missing_ok=True)
                deleted.append(v)
        return sorted(set(deleted))
