"""Checksum manifest of a policy version: sha256 and size of every file in its directory.

Orbax's OCDBT chunks are zstd-compressed with no checksum of their own, so a flipped
byte can decode to other numbers and be served silently. The learner hashes what landed
in the version directory (read back, so on gs:// it is what the bucket holds) and puts
the manifest in metadata.json, the version's commit marker: a version is never visible
without it. Readers check the listing, then every file's size and sha256, before Orbax
sees the directory. Storage access stays in the store's file abstraction (`files`: a
`walk(dir) -> {relpath: bytes}` and a `sha256(path) -> (hexdigest, bytes)`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable

MANIFEST_VERSION = 1
CHUNK = 1 << 20  # streamed: data files can be larger than a worker wants to hold twice


class Sha256Sink:
    """A writable that hashes what is written to it (a GCS download streams into it)."""

    def __init__(self):
        self._h, self.bytes = hashlib.sha256(), 0

    def write(self, b: bytes) -> int:
        self._h.update(b)
        self.bytes += len(b)
        return len(b)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def sha256_chunks(chunks: Iterable[bytes]) -> tuple[str, int]:
    sink = Sha256Sink()
    for chunk in chunks:
        sink.write(chunk)
    return sink.hexdigest(), sink.bytes


def sha256_local(path: str) -> tuple[str, int]:
    with open(path, "rb") as f:
        return sha256_chunks(iter(lambda: f.read(CHUNK), b""))


def walk_local(root: str) -> dict[str, int]:
    """{relative path ('/'-separated): size} of every file under root. A file that goes
    while we walk (another process's temporary file, renamed into place) is not listed."""
    out = {}
    for d, _, names in os.walk(root):
        for name in names:
            p = os.path.join(d, name)
            try:
                size = os.path.getsize(p)
            except FileNotFoundError:
                continue
            out[os.path.relpath(p, root).replace(os.sep, "/")] = size
    return out


def build(listing: dict[str, int], digest: Callable[[str], tuple[str, int]], exclude: str) -> dict:
    """The manifest of a version directory: `listing` from files.walk, `digest(relpath)`
    hashes one file; `exclude` (metadata.json) is the file the manifest is stored in."""
    manifest = {}
    for rel in sorted(listing):
        if rel == exclude:
            continue
        sha, n = digest(rel)
        manifest[rel] = {"sha256": sha, "bytes": n}
    return manifest


def problem(
    manifest: dict, listing: dict[str, int], digest: Callable[[str], tuple[str, int]], exclude: str
) -> str | None:
    """The first way the directory differs from its manifest, or None when it matches.
    Only files the listing found are read, so a manifest naming a path outside the
    directory can only make the check fail, never make it read there."""
    if not isinstance(manifest, dict):
        return "its manifest is not a mapping"
    present = {rel for rel in listing if rel != exclude}
    for rel in sorted(set(manifest) - present):
        return f"missing file {rel} (listed in its manifest)"
    for rel in sorted(present - set(manifest)):
        return f"unexpected file {rel} (not in its manifest)"
    for rel in sorted(present):  # sizes first: a truncated file is refused without hashing it all
        want = manifest[rel]
        if not (isinstance(want, dict) and isinstance(want.get("bytes"), int) and isinstance(want.get("sha256"), str)):
            return f"its manifest entry for {rel} is malformed"
        if listing[rel] != want["bytes"]:
            return f"checksum mismatch in {rel}: {listing[rel]} bytes, the manifest says {want['bytes']}"
    for rel in sorted(present):
        sha, n = digest(rel)
        want = manifest[rel]
        if (sha, n) != (want["sha256"], want["bytes"]):
            got, says = f"sha256 {sha[:16]}... ({n} bytes)", f"{want['sha256'][:16]}..."
            return f"checksum mismatch in {rel}: {got}, the manifest says {says}"
    return None
