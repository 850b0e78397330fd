"""The store's own file operations, local or on GCS: commit markers, LATEST, listings,
deletes and the checksum manifest's walks and hashes (core/contracts/store.py). Not
epath: gcsfs caches listings, so a long-lived poller saw neither new versions nor their
markers (measured against the emulator)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from etils import epath

from core.contracts import manifest as mf


def disable_gcsfs_listing_cache() -> None:
    """Orbax reaches gs:// through epath -> gcsfs, whose listing cache never expires: a
    poller would miss steps/versions written by another process. Applies to gcsfs
    instances created afterwards; an explicit user setting wins."""
    try:
        import fsspec.config
    except ImportError:
        return
    fsspec.config.conf.setdefault("gs", {}).setdefault("use_listings_cache", False)


disable_gcsfs_listing_cache()


class LocalFiles:
    """Small-file operations on a local filesystem."""

    def read_text(self, path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_text(self, path: str, text: str) -> None:
        """Replace `path` so a reader sees the old or the new content, never a mix."""
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())  # data on disk before the rename makes it visible
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def read_bytes(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_parts(self, path: str, parts: list[bytes]) -> None:
        """The parts as one file, on disk before returning. Not atomic, and need not be: a
        policy version's commit marker is written after it, and no reader looks at a
        version without one."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def children(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def delete(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)

    def delete_tree(self, path: str) -> None:
        epath.Path(path).rmtree(missing_ok=True)

    def walk(self, path: str) -> dict[str, int]:
        return mf.walk_local(path)

    def sha256(self, path: str) -> tuple[str, int]:
        return mf.sha256_local(path)


class GcsFiles:
    """The same operations on GCS via google-cloud-storage. Each upload replaces a whole
    object, which GCS makes visible atomically; listings and reads are never cached.
    Reads give up after read_timeout_s (the library's default retries for 120 s), so a
    poller reports an outage quickly and keeps its version; writes keep the default."""

    def __init__(self, read_timeout_s: float = 20.0):
        from google.api_core.exceptions import NotFound
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._not_found = NotFound
        self._client = None  # created on first use: unpicklable, and reads env at creation
        self._read = {"retry": DEFAULT_RETRY.with_timeout(read_timeout_s), "timeout": min(read_timeout_s, 60.0)}

    def _split(self, path: str) -> tuple[Any, str]:
        if self._client is None:
            from google.cloud import storage

            self._client = storage.Client()
        bucket, _, key = path.removeprefix("gs://").partition("/")
        return self._client.bucket(bucket), key

    def read_text(self, path: str) -> str | None:
        bucket, key = self._split(path)
        try:
            return bucket.blob(key).download_as_bytes(**self._read).decode()
        except self._not_found:
            return None

    def write_text(self, path: str, text: str) -> None:
        bucket, key = self._split(path)
        bucket.blob(key).upload_from_string(text.encode(), content_type="application/json")

    def read_bytes(self, path: str) -> bytes | None:
        bucket, key = self._split(path)
        try:
            return bucket.blob(key).download_as_bytes(**self._read)
        except self._not_found:
            return None

    def write_parts(self, path: str, parts: list[bytes]) -> None:
        bucket, key = self._split(path)
        bucket.blob(key).upload_from_string(b"".join(parts), content_type="application/octet-stream")

    def exists(self, path: str) -> bool:
        bucket, key = self._split(path)
        return bucket.blob(key).exists(**self._read)

    def children(self, path: str) -> list[str]:
        """Names directly below path/ (objects and "directories")."""
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/"
        it = self._client.list_blobs(bucket, prefix=prefix, delimiter="/", **self._read)
        names = [b.name[len(prefix) :] for b in it]  # consuming pages fills it.prefixes
        return [n for n in names if n] + [p[len(prefix) :].rstrip("/") for p in it.prefixes]

    def delete(self, path: str) -> None:
        bucket, key = self._split(path)
        try:
            bucket.blob(key).delete()
        except self._not_found:
            pass  # already gone (or deleted concurrently): the goal is reached

    def delete_tree(self, path: str) -> None:
        bucket, key = self._split(path)
        for blob in self._client.list_blobs(bucket, prefix=key.rstrip("/") + "/"):
            self.delete(f"gs://{bucket.name}/{blob.name}")

    def walk(self, path: str) -> dict[str, int]:
        """{relative path: size} of every object below path/ (placeholder "dir/" objects skipped)."""
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/"
        blobs = self._client.list_blobs(bucket, prefix=prefix, **self._read)
        return {b.name[len(prefix) :]: b.size for b in blobs if not b.name.endswith("/")}

    def check_bucket(self, path: str) -> None:
        """Lists one object under path: raises NotFound for a missing bucket, Forbidden
        without storage.objects.list (both permanent). A missing *object* reads as 404 too,
        so without this a reader of a misspelled bucket would wait for a first version forever."""
        bucket, key = self._split(path)
        list(self._client.list_blobs(bucket, prefix=key, max_results=1, **self._read))

    def sha256(self, path: str) -> tuple[str, int]:
        """Streams the object through the hash: never held whole in memory."""
        bucket, key = self._split(path)
        sink = mf.Sha256Sink()
        bucket.blob(key).download_to_file(sink, **self._read)
        return sink.hexdigest(), sink.bytes


def files_for(root: str, gcs_read_timeout_s: float = 20.0) -> LocalFiles | GcsFiles:
    if root.startswith("gs://"):
        return GcsFiles(gcs_read_timeout_s)
    if "://" in root:
        raise ValueError(f"unsupported store root {root!r}: use a local path or gs://")
    return LocalFiles()
