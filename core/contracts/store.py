"""Policy store: the learner publishes policy versions, rollout workers poll them.

Layout under `root` (a local directory or gs://bucket/prefix):
    policies/<version:08d>/                Orbax checkpoint of the params pytree (a full
                                           version), or delta.bin (a delta version), then
    policies/<version:08d>/metadata.json   written after the data is whole
    LATEST                                 {"version", "path", "written_at"}, written last

A delta version (store_delta.py) holds what changed against a full version, its base
("delta_of" in its metadata); a reader rebuilds it from the base, or applies it to the
base it already holds (load_delta). Never a delta of a delta: the chain length is 1.

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
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from google.api_core.exceptions import BadRequest, Forbidden, GoogleAPIError, NotFound, Unauthorized
from google.auth.exceptions import GoogleAuthError

from core.contracts import manifest as mf
from core.contracts import orbax_fixes, store_delta
from core.contracts.store_errors import ChecksumError, StoreAccessError, StoreError
from core.contracts.store_files import LocalFiles, files_for
from core.contracts.store_trees import _cast_floats, _check_matches, _to_target_dtypes, as_stored, as_target

orbax_fixes.apply()  # every save and load of a version went through a leak
LATEST = "LATEST"
METADATA = "metadata.json"
# Finished dirs are "00000012"; Orbax's in-flight ones are "00000012.orbax-checkpoint-tmp-<ts>".
_DIR_RE = re.compile(r"^(\d{8,})(\.orbax-checkpoint-tmp.*)?$")


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
    def publish(
        self,
        version: int,
        params: Any,
        metadata: dict | None = None,
        *,
        dtype=None,
        delta_of: int | None = None,
        base_params: Any = None,
        delta=None,
    ) -> epath.Path:
        """Writes `params` as `version` and then points LATEST at it (blocking).
        dtype (e.g. jnp.bfloat16): store floating leaves in it; load casts back to the target.
        delta_of: write a delta against this FULL version instead (same dtype), encoded
        against `base_params` (its params as stored, see as_stored) or, without them, against
        the base read from the store; `delta`: that delta already encoded (store_delta.encode
        of as_stored(params, dtype) against the base), so a caller who weighed it pays once."""
        if type(version) is not int or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        current = self.latest_version()
        if current is not None and version <= current:
            raise ValueError(f"version {version} must be greater than LATEST version {current}")
        if delta_of is None:
            path = self._write_version(version, params, metadata, dtype=dtype)
        else:
            path = self._write_delta(version, params, metadata, dtype, delta_of, base_params, delta)
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
        self._commit(version, metadata, dtype, leaves=store_delta.leaf_specs(params))
        return path

    def _commit(self, version: int, metadata: dict | None, dtype, **extra) -> None:
        """Hashes what landed in the version directory and writes its metadata.json: the
        per-version commit marker. Hashed after the data is final and before the marker, so
        the manifest commits with the version; read back, so it vouches for what the storage
        holds. `bytes`: the version's size on storage (a report compares
        delta and full versions by it); `extra`: full versions' leaf specs (a reader keeping
        one as a base restores it at the stored dtypes), a delta's base and index."""
        root = os.fspath(self.version_path(version))
        manifest = mf.build(self._files.walk(root), lambda rel: self._files.sha256(f"{root}/{rel}"), METADATA)
        meta = {
            "version": version,
            "written_at": time.time(),
            "metadata": metadata or {},
            "dtype": None if dtype is None else np.dtype(dtype).name,
            "manifest_version": mf.MANIFEST_VERSION,
            "manifest": manifest,
            "bytes": sum(entry["bytes"] for entry in manifest.values()),
            **extra,
        }
        self._files.write_text(self._marker(version), json.dumps(meta))

    def _write_delta(self, version, params, metadata, dtype, base: int, base_params, delta) -> epath.Path:
        """Step 1 of publishing a delta version: delta.bin, then its commit marker."""
        if type(base) is not int or not 0 <= base < version:
            raise ValueError(f"delta_of must be an earlier version than {version}, got {base!r}")
        base_meta = self.read_metadata(base)  # StoreError when it is missing
        if "delta_of" in base_meta:
            raise ValueError(f"version {base} is itself a delta: a delta's base must be a full version (no chains)")
        dtype_name = None if dtype is None else np.dtype(dtype).name
        if base_meta.get("dtype") != dtype_name:
            raise ValueError(f"version {base} is stored in {base_meta.get('dtype')}, this one would be {dtype_name}")
        if delta is None:
            stored = as_stored(params, dtype)
            if base_params is None:  # read the base as stored: its own dtypes, no cast
                base_params = self.load(base, store_delta.stored_target(store_delta.leaf_specs(stored), stored))
            delta = store_delta.encode(stored, as_stored(base_params, dtype))
        path = self.version_path(version)
        if isinstance(self._files, LocalFiles):
            self.policies_dir.mkdir(parents=True, exist_ok=True)
        self._files.delete(self._marker(version))  # as in _write_version: never vouch for old data
        self._files.delete_tree(os.fspath(path))  # a crashed earlier write's files must not join the manifest
        self._files.write_parts(os.fspath(path / store_delta.DATA_FILE), delta.parts)
        self._commit(version, metadata, dtype, delta_of=base, delta=delta.header())
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
        `target` (concrete arrays or jax.ShapeDtypeStruct; shardings are honoured). A delta
        version is rebuilt from its base, read from the store (ChecksumError when the base is
        gone or the result fails its checksums)."""
        path = self.version_path(version)
        if not self.is_complete(version):
            raise StoreError(f"policy version {version} at {path} is missing or incomplete")
        meta = self.read_metadata(version)
        if "delta_of" in meta:
            return self._load_delta(version, meta, target)
        self.verify(version, meta)
        # A fresh checkpointer per load: nothing cached between polls.
        try:
            with ocp.StandardCheckpointer() as ckptr:
                params = ckptr.restore(path, target)
        except Exception as e:  # orbax raises many types; callers need one
            raise StoreError(f"cannot restore policy version {version} from {path}: {e}") from e
        params = _to_target_dtypes(params, target)
        _check_matches(params, target, f"policy version {version}")
        return params

    def verify(self, version: int, meta: dict | None = None, data: dict[str, bytes] | None = None) -> None:
        """Checks every file of `version` against the manifest in its metadata: ChecksumError
        naming the first file that differs; StoreError for a version without a manifest
        unless the store was opened with allow_unverified. Reads the whole version once
        (Orbax then reads it again: versions are immutable once committed); files already
        read (`data`, by relative path) are hashed from memory instead."""
        meta = self.read_metadata(version) if meta is None else meta
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
        data = data or {}

        def digest(rel: str) -> tuple[str, int]:
            if rel in data:
                return mf.sha256_chunks([data[rel]])
            return self._call(what, self._files.sha256, f"{root}/{rel}")

        found = mf.problem(meta["manifest"], listing, digest, METADATA)
        if found:
            raise ChecksumError(f"policy version {version} at {root}: {found}")

    # ---- delta versions -----------------------------------------------------
    def _delta_data(self, version: int, meta: dict) -> bytes:
        """A delta version's data file, read once and checked against its manifest."""
        if "manifest" not in meta:  # deltas never predate manifests: allow_unverified does not apply
            raise ChecksumError(f"delta version {version} has no checksum manifest")
        path = os.fspath(self.version_path(version) / store_delta.DATA_FILE)
        data = self._call(f"reading delta version {version}", self._files.read_bytes, path)
        self.verify(version, meta, {store_delta.DATA_FILE: data} if data is not None else None)
        if data is None:  # verify passed: the manifest does not even list it
            raise ChecksumError(f"delta version {version} has no {store_delta.DATA_FILE}")
        return data

    def _load_delta(self, version: int, meta: dict, target: Any) -> Any:
        data = self._delta_data(version, meta)  # the small read first: a corrupt delta costs no base read
        store_delta.check_header(meta.get("delta"), len(data))
        base_params = self.load_base(version, target, meta)
        params = store_delta.decode(meta.get("delta"), data, base_params)
        del base_params
        return as_target(params, target, f"policy version {version}")

    def load_base(self, version: int, target: Any, meta: dict | None = None) -> Any:
        """The full version that delta `version` is rebuilt from, as stored (host numpy in
        its stored dtypes), with `target`'s structure: what a reader keeps to apply the next
        deltas to. ChecksumError when that base is missing or is itself a delta."""
        meta = self.read_metadata(version) if meta is None else meta
        base = meta.get("delta_of")
        entries = store_delta.check_header(meta.get("delta"), None)
        if type(base) is not int or base < 0 or not self.is_complete(base):
            raise ChecksumError(f"delta version {version}: its base version {base!r:.20} is missing")
        if "delta_of" in self.read_metadata(base):
            raise ChecksumError(f"delta version {version}: its base {base} is a delta too (never followed)")
        return self.load(base, store_delta.stored_target(entries, target))

    def load_delta(self, version: int, base_params: Any, base_version: int, target: Any = None) -> Any:
        """Params of delta `version`, applied to `base_params`: the params of full version
        `base_version` as stored (numpy or jax, in the stored dtype), which the caller holds,
        so the base is not read again; only the delta's files are. Returns numpy arrays in
        the stored dtype with base_params' structure, or, given `target`, cast and checked
        as load does. StoreError when `version` is not a delta of `base_version`;
        ChecksumError when it is corrupt (DeltaMismatch: it does not rebuild to its
        checksums from these base_params)."""
        if not self.is_complete(version):
            raise StoreError(f"policy version {version} is missing or incomplete")
        meta = self.read_metadata(version)
        if meta.get("delta_of") != base_version:
            raise StoreError(f"policy version {version} is not a delta of version {base_version}")
        params = store_delta.decode(meta.get("delta"), self._delta_data(version, meta), base_params)
        return params if target is None else as_target(params, target, f"policy version {version}")

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

    def _bases_of(self, versions: set[int]) -> set[int]:
        """The full versions that these delta versions are rebuilt from."""
        bases = set()
        for v in versions:
            try:
                base = self.read_metadata(v).get("delta_of")
            except StoreError:
                continue  # unreadable now: it cannot be served either
            if type(base) is int:
                bases.add(base)
        return bases

    def gc(self, keep: int) -> list[int]:
        """Deletes all but the `keep` newest versions at or below LATEST (LATEST itself is
        always kept), plus abandoned tmp/incomplete dirs older than LATEST, but never the
        base of a delta it keeps (nor of a complete one newer than LATEST). Dirs newer than
        LATEST are left alone: a publish may be writing them. Returns deleted versions."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        latest = self.latest_version()
        if latest is None:
            return []
        every = self.versions()
        complete = [v for v in every if v <= latest]
        kept = set(complete[-keep:]) | {latest} | {v for v in every if v > latest}
        doomed = set(complete[:-keep]) - {latest} - self._bases_of(kept)
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
