"""torch and transformers, imported on first use.

Each pytest worker collects every test module; importing torch and transformers there cost
each worker about 8 s of the unit tier, though only the modules that compare against them
use them, and those run on one worker (their `xdist_group`, tests/conftest.py).
"""

from __future__ import annotations

import importlib


class LazyModule:
    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


torch = LazyModule("torch")
transformers = LazyModule("transformers")
