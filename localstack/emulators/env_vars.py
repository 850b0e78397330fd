"""Setting a local service's client variables in os.environ, and putting them back."""

from __future__ import annotations

import os


class AppliesEnv:
    """Mixin for a service with `env() -> dict[str, str]` (what its clients need)."""

    _saved_env: dict[str, str | None] | None = None

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def apply_env(self) -> dict[str, str]:
        """Set env() in os.environ; restore_env() (or stop()) puts the old values back."""
        values = self.env()
        if self._saved_env is None:
            self._saved_env = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        return values

    def restore_env(self) -> None:
        for key, old in (self._saved_env or {}).items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        self._saved_env = None
