"""The policy store's errors: a leaf module, so the store's helpers can raise them."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store is corrupt or unreachable, or a requested version is missing or incomplete."""


class StoreAccessError(RuntimeError):
    """The store's bucket is missing, or this identity may not read it: permanent, so not a
    StoreError (which pollers ride out); the process stops, naming the root."""


class ChecksumError(StoreError):
    """A version's files differ from its manifest (a flipped byte, a truncated, missing or
    extra file). A StoreError, so pollers keep their current version and count the failure."""
