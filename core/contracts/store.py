"""Policy store: the learner publishes policy versions, rollout workers poll them.

Layout under `root` (a local directory or gs://bucket/prefix):
    policies/<version:08d>/                Orbax checkpoint of the params pytree, then
    policies/<version:08d>/metadata.json   written after Orbax has finalised the data
    LATEST                                 {"version", "path", "written_at"}, written last

Two commit points make a reader safe: a version directory counts only once its
metadata.json exists (Orbax's tmp dirs, and on GCS its in-place half-written dirs, never
do), and readers start from LATEST, which is replaced atomically after the version is whole.

Who touches what: the arrays go through Orbax (TensorStore; on gs:// its own GCS client,
pointed at an emulator by TENSORSTORE_GCS_HTTP_URL). Orbax's own small files go through
etils.epath, which for gs:// needs `gcsfs`. Our commit markers, LATEST, listings and
deletes go through `store_files.py`: os calls locally, google-cloud-storage on gs:// (honours
STORAGE_EMULATOR_HOST). Not epath: gcsfs caches listings, so a long-lived poller saw
neither new versions nor their markers (measured against the emulator).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from google.api_core.exceptions import BadRequest, Forbidden, GoogleAPIError, NotFound, Unauthorized
from google.auth.exceptions import GoogleAuthError

from core.contracts import manifest as mf
from core.contracts import orbax_fixes
from core.contracts.store_files import LocalFiles, files_for

orbax_fixes.apply()  # every save and load of a version went through a leak
LATEST = "LATEST"
METADATA = "metadata.json"
# Finished dirs are "00000012"; Orbax's in-flight ones are "00000012.orbax-checkpoint-tmp-<ts>".
_DIR_RE = re.compile(r"^(\d{8,})(\.orbax-checkpoint-tmp.*)?$")


class StoreError(RuntimeError):
    """The store is corrupt or unreachable, or a requested version is missing or incomplete."""


class StoreAccessError(RuntimeError):
    """The store's bucket is missing, or this identity may not read it: permanent, so not a
    StoreError (which pollers ride out); the process stops, naming the root."""


class ChecksumError(StoreError):
    """A version's files differ from its manifest (a flipped byte, a truncated, missing or
    extra file). A StoreError, so pollers keep their current version and count the failure."""


def _is_float(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _cast_floats(tree: Any, dtype) -> Any:
    """Floating leaves to dtype (bf16 halves what workers download); others unchanged."""
    return jax.tree.map(lambda x: x.astype(dtype) if _is_float(x) and x.dtype != dtype else x, tree)


def _to_target_dtypes(params: Any, target: Any) -> Any:
    """Orbax honours the target dtype for jax targets, but restores numpy targets at the
    stored dtype: cast float leaves (e.g. a bf16-published version) to what the target wants."""

    def cast(got, want):
        return got.astype(want.dtype) if _is_float(got) and _is_float(want) and got.dtype != want.dtype else got

    try:
        return jax.tree.map(cast, params, target)
    except ValueError:
        return params  # structure differs: _check_matches reports it


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
    """Versioned params on disk or GCS; one writer (the learner), many pollers."""

    def __init__(self, root: str | os.PathLike, *, gcs_read_timeout_s: float = 20.0, allow_unverified: bool = False):
        """allow_unverified: load versions published before checksum manifests (a legacy
        store) without verifying them; versions with a manifest are verified regardless."""
        root = os.fspath(root)
        self.allow_unverified = allow_unverified
        # A local root is made absolute: Orbax refuses a relative checkpoint path.
        self.root = epath.Path(root if "://" in root else os.path.abspath(root))
        self.policies_dir = self.root / "policies"
        self._files = files_for(os.fspath(self.root), gcs_read_timeout_s)

    def version_path(self, version: int) -> epath.Path:
        return self.policies_dir / f"{version:08d}"

    def _marker(self, version: int) -> str:
        return os.fspath(self.version_path(version) / METADATA)

    def check_access(self) -> str | None:
        """At start-up: a gs:// root whose bucket is missing or unreadable raises
        StoreAccessError naming it (a local root may not exist yet: the learner makes it).
        GCS unreachable now is transient: returned as a note, and first use decides."""
        if isinstance(self._files, LocalFiles):
            return None
        try:
            self._files.check_bucket(os.fspath(self.root))
        except (NotFound, Forbidden, Unauthorized, BadRequest) as e:
            raise StoreAccessError(
                f"policy store {self.root}: {type(e).__name__}: {getattr(e, 'message', e)} (permanent: not retried)"
            ) from None
        except (OSError, GoogleAPIError, GoogleAuthError) as e:
            return f"policy store {self.root}: cannot check now ({type(e).__name__})"
        return None

    def _call(self, what: str, fn, *args):
        """Storage errors (network, permissions) become StoreError: pollers keep their
        current version on a StoreError instead of dying."""
        try:
            return fn(*args)
        except (OSError, GoogleAPIError, GoogleAuthError) as e:
            raise StoreError(f"{what} failed: {type(e).__name__}: {e}") from e

    # ---- writer -------------------------------------------------------------
    def publish(self, version: int, params: Any, metadata: dict | None = None, *, dtype=None) -> epath.Path:
        """Writes `params` as `version` and then points LATEST at it (blocking).
        dtype (e.g. jnp.bfloat16): store floating leaves in it; load casts back to the target."""
        if type(version) is not int or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        current = self.latest_version()
        if current is not None and version <= current:
            raise ValueError(f"version {version} must be greater than LATEST version {current}")
        path = self._write_version(version, params, metadata, dtype=dtype)
        self._write_pointer(version)
        return path

    def _write_version(self, version: int, params: Any, metadata: dict | None = None, *, dtype=None) -> epath.Path:
        """Step 1 of publish: the complete version directory, not yet visible via LATEST."""
        path = self.version_path(version)
        if isinstance(self._files, LocalFiles):
            self.policies_dir.mkdir(parents=True, exist_ok=True)  # GCS has no directories
        # A marker left by an earlier, never-published write of this version must not vouch
        # for the data about to be rewritten: remove it before touching the data.
        self._files.delete(self._marker(version))
        if dtype is not None:
            params = _cast_floats(params, dtype)
        # force=True: a leftover dir for this version (crash before LATEST) is unreferenced, so
        # overwriting it is safe. The context exit waits for the async save and finalisation.
        # One writer: in a multi-host learner only process 0 publishes, so Orbax must not
        # wait for the other processes (its default barriers span them all, and would hang).
        alone = {jax.process_index()} if jax.process_count() > 1 else None
        only_us = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(), active_processes=alone)
        with ocp.StandardCheckpointer(multiprocessing_options=only_us) as ckptr:
            try:
                ckptr.save(path, params, force=True)
            except BaseException:
                # A failed save's background threads may still write into its tmp dir: let
                # them end, or a retry of this version races them (seen under pytest -n 2).
                with contextlib.suppress(Exception):
                    ckptr.wait_until_finished()
                raise
            ckptr.wait_until_finished()
        # Hashed after Orbax has finalised the directory and before the marker: the manifest
        # commits with the version. Read back, so it vouches for what the storage holds.
        root = os.fspath(path)
        manifest = mf.build(self._files.walk(root), lambda rel: self._files.sha256(f"{root}/{rel}"), METADATA)
        meta = {
            "version": version,
            "written_at": time.time(),
            "metadata": metadata or {},
            "dtype": None if dtype is None else np.dtype(dtype).name,
            "manifest_version": mf.MANIFEST_VERSION,
            "manifest": manifest,
        }
        self._files.write_text(self._marker(version), json.dumps(meta))  # the per-version commit marker
        return path

    def _write_pointer(self, version: int) -> None:
        """Step 2 of publish: make `version` the one readers see."""
        pointer = {"version": version, "path": os.fspath(self.version_path(version)), "written_at": time.time()}
        self._files.write_text(os.fspath(self.root / LATEST), json.dumps(pointer))

    # ---- readers ------------------------------------------------------------
    def latest_version(self) -> int | None:
        """The version LATEST points at, or None before the first publish."""
        path = os.fspath(self.root / LATEST)
        text = self._call(f"reading {path}", self._files.read_text, path)
        if text is None:
            return None
        try:
            version = json.loads(text)["version"]
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"corrupt {path}: {e}; content starts {text[:100]!r}") from None
        if type(version) is not int or version < 0:
            raise StoreError(f"corrupt {path}: version {version!r:.50} is not a non-negative int")
        return version

    def is_complete(self, version: int) -> bool:
        return self._call("checking a version marker", self._files.exists, self._marker(version))

    def versions(self) -> list[int]:
        """Complete versions, ascending (some may be newer than LATEST)."""
        return sorted(v for v, tmp, _ in self._scan() if tmp is None and self.is_complete(v))

    def read_metadata(self, version: int) -> dict:
        text = self._call(f"reading metadata of version {version}", self._files.read_text, self._marker(version))
        if text is None:
            raise StoreError(f"policy version {version} is missing or incomplete")
        try:
            return json.loads(text)
        except ValueError as e:
            raise StoreError(f"corrupt metadata for policy version {version}: {e}") from None

    def load(self, version: int, target: Any) -> Any:
        """Params of `version`, restored with exactly the structure/shapes/dtypes of
        `target` (concrete arrays or jax.ShapeDtypeStruct; shardings are honoured)."""
        path = self.version_path(version)
        if not self.is_complete(version):
            raise StoreError(f"policy version {version} at {path} is missing or incomplete")
        self.verify(version)
        # A fresh checkpointer per load: nothing cached between polls.
        try:
            with ocp.StandardCheckpointer() as ckptr:
                params = ckptr.restore(path, target)
        except Exception as e:  # orbax raises many types; callers need one
            raise StoreError(f"cannot restore policy version {version} from {path}: {e}") from e
        params = _to_target_dtypes(params, target)
        _check_matches(params, target, f"policy version {version}")
        return params

    def verify(self, version: int) -> None:
        """Checks every file of `version` against the manifest in its metadata: ChecksumError
        naming the first file that differs; StoreError for a version without a manifest
        unless the store was opened with allow_unverified. Reads the whole version once
        (Orbax then reads it again: versions are immutable once committed)."""
        meta = self.read_metadata(version)
        if "manifest" not in meta:
            if self.allow_unverified:
                return
            raise StoreError(
                f"policy version {version} has no checksum manifest (published before checksums were "
                "added): re-publish it, or open the store with PolicyStore(root, allow_unverified=True)"
            )
        if meta.get("manifest_version") != mf.MANIFEST_VERSION:
            raise StoreError(f"policy version {version}: unknown manifest_version {meta.get('manifest_version')!r:.20}")
        root = os.fspath(self.version_path(version))
        listing = self._call(f"listing policy version {version}", self._files.walk, root)
        what = f"hashing policy version {version}"
        found = mf.problem(
            meta["manifest"], listing, lambda rel: self._call(what, self._files.sha256, f"{root}/{rel}"), METADATA
        )
        if found:
            raise ChecksumError(f"policy version {version} at {root}: {found}")

    def load_latest(self, target: Any) -> tuple[int, Any] | None:
        version = self.latest_version()
        if version is None:
            return None
        return version, self.load(version, target)

    # ---- housekeeping -------------------------------------------------------
    def _scan(self) -> list[tuple[int, str | None, epath.Path]]:
        """(version, tmp suffix or None, path) for every version-like dir."""
        names = self._call("listing versions", self._files.children, os.fspath(self.policies_dir))
        return [(int(m.group(1)), m.group(2), self.policies_dir / name) for name in names if (m := _DIR_RE.match(name))]

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
                # Marker first: a crash mid-delete leaves an incomplete dir, never a broken "complete" one.
                if tmp is None:
                    self._files.delete(self._marker(v))
                self._files.delete_tree(os.fspath(path))
                deleted.append(v)
        return sorted(set(deleted))
