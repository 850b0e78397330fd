"""A directory written whole or not at all: files go to a hidden sibling that is renamed
into place at the end, so a writer killed at any point (SIGKILL included) leaves the
target as it was, plus a `.NAME.<verb>-*` directory beside it that no reader takes for a
checkpoint (the next writer of the same target removes it)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def refuse_non_empty(out: Path, overwrite: bool, flag: str) -> None:
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not empty; remove it ({flag} replaces it)")


@contextlib.contextmanager
def staged_dir(out: str | Path, verb: str) -> Iterator[Path]:
    """Yields an empty directory beside `out`; on a clean exit it becomes `out` (an existing
    `out` is replaced whole), on an exception it is removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.{verb}-*"):  # left by a writer that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.{verb}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()  # not mkdtemp: the directory gets the umask's permissions, not 0700
    try:
        yield tmp
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace(tmp: Path, out: Path) -> None:
    """tmp becomes out. An existing out is moved aside first and removed after, so out is
    at every moment either the old directory or the whole new one."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.replaced-", dir=out.parent))
    os.replace(out, old / "dir")
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
