"""Environments from separate packages, found through the `agentic_rl.environments` entry
point group: installed for real with pip (offline) and loaded in a fresh interpreter."""

import base64
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import pytest

from environments.registry import ENTRY_POINT_GROUP

REPO = pathlib.Path(__file__).resolve().parents[1]

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
        return [Task(f"say-{split}-{seed}-{i}", f"Say {i}. ", str(i)) for i in range(n)]

    # The entry point carries only the factory; a plugin that also wants tasks registers
    # them on import (the same factory object, so load_entry_points does not clash).
    environments.register("my_plugin", make_env, tasks=tasks)
''')


def _write_wheel(out_dir: pathlib.Path, dist: str, files: dict[str, str], entry_points: dict[str, str]) -> pathlib.Path:
    """A minimal, valid pure-Python wheel, as a build backend would write it.

    Hand-made because the venv's setuptools (65) needs the `wheel` package to build one,
    and nothing may be fetched; `pip install` of the result is still the real install path.
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


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> pathlib.Path:
    """Two plugin distributions pip-installed into a private site dir, no network."""
    tmp = tmp_path_factory.mktemp("plugins")
    good = _write_wheel(
        tmp, "my_plugin_env", {"my_plugin_env/__init__.py": PLUGIN_SOURCE}, {"my_plugin": "my_plugin_env:make_env"}
    )
    broken = _write_wheel(
        tmp,
        "broken_plugin_env",
        {"broken_plugin_env/__init__.py": "raise ImportError('plugin is broken on purpose')\n"},
        {"broken_plugin": "broken_plugin_env:make_env", "missing_attr": "my_plugin_env:no_such_factory"},
    )
    site = tmp / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-input",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(good),
            str(broken),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "my_plugin_env-0.1.0.dist-info" / "entry_points.txt").exists()
    return site


RUN_PLUGIN = textwrap.dedent("""
    import asyncio, json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import environments
        loaded = environments.load_entry_points()
    env = environments.make("my_plugin", max_turns=3)
    task = environments.make_tasks("my_plugin", 0, 5, "test")[3]

    async def episode():
        prompt = await env.reset(task)
        first = await env.step("hello")
        last = await env.step(f"<answer>{task.target}</answer>")
        return prompt, first, last

    prompt, first, last = asyncio.run(episode())
    print(json.dumps({
        "loaded": loaded, "names": environments.names(), "type": type(env).__name__,
        "is_env": isinstance(env, environments.Environment), "prompt": prompt,
        "first": [first.observation, first.reward, first.done],
        "last": [last.observation, last.reward, last.done, last.info["status"]],
        "warnings": [str(w.message) for w in caught]}))
""")


def _run(code: str, site: pathlib.Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plugin_environment_loads_through_its_entry_point(plugin_site):
    out = _run(RUN_PLUGIN, plugin_site)
    assert "my_plugin" in out["loaded"] and "my_plugin" in out["names"]
    assert "calculator" in out["names"]  # built-ins are still there
    assert out["type"] == "SayNumberEnv" and out["is_env"]
    assert out["prompt"] == "Say 3. "
    assert out["first"] == ["<error>answer with &lt;answer&gt;N&lt;/answer&gt;</error>", 0.0, False]
    assert out["last"] == ["", 1.0, True, "finished"]


def test_broken_plugins_are_skipped_with_a_warning(plugin_site):
    out = _run(RUN_PLUGIN, plugin_site)
    assert "broken_plugin" not in out["loaded"] and "missing_attr" not in out["loaded"]
    assert "broken_plugin" not in out["names"] and "missing_attr" not in out["names"]
    broken = [w for w in out["warnings"] if "'broken_plugin'" in w]
    missing = [w for w in out["warnings"] if "'missing_attr'" in w]
    assert len(broken) == 1 and "broken on purpose" in broken[0]
    assert len(missing) == 1 and "no_such_factory" in missing[0]


def test_without_the_plugin_site_nothing_extra_loads(tmp_path):
    out = _run("import json, environments; print(json.dumps({'loaded': environments.load_entry_points()}))", tmp_path)
    assert "my_plugin" not in out["loaded"] and "broken_plugin" not in out["loaded"]
