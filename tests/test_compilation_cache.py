"""The test run's compilation cache keeps working after a process was killed mid-write."""

from __future__ import annotations

import pytest
from conftest import _drop_half_written_cache_entries
from jax._src.lru_cache import LRUCache


def test_an_entry_cut_off_before_its_atime_stops_every_write_until_it_is_dropped(tmp_path):
    cache = LRUCache(str(tmp_path), max_size=1 << 20)
    cache.put("whole", b"x" * 10)
    (tmp_path / "killed-cache").write_bytes(b"half an execu")  # its "-atime" never written
    with pytest.raises(FileNotFoundError):  # JAX warns and compiles on, uncached, for good
        cache.put("next", b"y" * 10)
    _drop_half_written_cache_entries(str(tmp_path))
    cache.put("next", b"y" * 10)
    assert cache.get("next") == b"y" * 10 and cache.get("whole") == b"x" * 10
    assert not (tmp_path / "killed-cache").exists()
