"""A third-party environment as a separate distribution: its source, a wheel of it, and
an in-process install (the unpacked wheel on sys.path) for the environment contract.

tests/test_plugins.py pip-installs the wheel and loads it in a fresh interpreter;
tests/test_environment_contract.py holds it to the contract every environment keeps.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import pathlib
import sys
import textwrap
import zipfile

from environments import registry
from environments.registry import ENTRY_POINT_GROUP

NAME, DIST, PACKAGE = "my_plugin", "my_plugin_env", "my_plugin_env"

PLUGIN_SOURCE = textwrap.dedent('''
    """A third-party environment: say the number from the prompt."""
    import environments
    from environments import (Environment, EpisodeStatus, FinalAnswer, StepResult, Task,
                              format_error, parse_action)

    class SayNumberEnv(Environment):
        name = "my_plugin"

        def __init__(self, max_turns=2):
            self.max_turns = max_turns

        async def reset(self, task):
            self._task, self._turns = task, 0
            return task.prompt

        async def step(self, action_text):
            self._turns += 1
            action = parse_action(action_text)
            if isinstance(action, FinalAnswer):
                reward = float(action.text.strip() == self._task.target)
                return StepResult("", reward, True, {"status": EpisodeStatus.FINISHED})
            done = self._turns >= self.max_turns
            info = {"status": EpisodeStatus.TRUNCATED} if done else {}
            return StepResult(format_error("answer with <answer>N</answer>"), 0.0, done, info)

    def make_env(**cfg):
        return SayNumberEnv(**cfg)

    def tasks(seed, n, split):
        # Odd numbers for the test split, even for train: the splits never share a prompt.
        if split not in ("train", "test"):
            raise ValueError(f"split must be train or test, got {split!r}")
        first = 1000 * seed + (split == "test")
        return [Task(f"say-{split}-{seed}-{i}", f"Say {first + 2 * i}. ", str(first + 2 * i)) for i in range(n)]

    # The entry point carries only the factory; a plugin that also wants tasks registers
    # them on import (the same factory object, so load_entry_points does not clash).
    environments.register("my_plugin", make_env, tasks=tasks)
''')


def write_wheel(out_dir: pathlib.Path, dist: str, files: dict[str, str], entry_points: dict[str, str]) -> pathlib.Path:
    """A minimal, valid pure-Python wheel, as a build backend would write it.

    Hand-made because the venv's setuptools needs the `wheel` package to build one, and
    nothing may be fetched; `pip install` of the result is still the real install path.
    """
    info = f"{dist}-0.1.0.dist-info"
    eps = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[{ENTRY_POINT_GROUP}]\n{eps}",
    }
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = out_dir / f"{dist}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def good_wheel(out_dir: pathlib.Path) -> pathlib.Path:
    return write_wheel(out_dir, DIST, {f"{PACKAGE}/__init__.py": PLUGIN_SOURCE}, {NAME: f"{PACKAGE}:make_env"})


@contextlib.contextmanager
def installed(site: pathlib.Path):
    """The plugin unpacked into `site` (a purelib wheel is a site dir), found through its
    entry point by `environments.load_entry_points`; afterwards, gone from the registry."""
    with zipfile.ZipFile(good_wheel(site)) as z:
        z.extractall(site)
    saved = {table: dict(getattr(registry, table)) for table in ("_FACTORIES", "_TASKS", "_ORACLES")}
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield registry.load_entry_points()
    finally:
        sys.path.remove(str(site))
        sys.modules.pop(PACKAGE, None)
        importlib.invalidate_caches()
        for table, entries in saved.items():
            getattr(registry, table).clear()
            getattr(registry, table).update(entries)
