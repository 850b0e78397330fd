"""Environments from separate packages, found through the `agentic_rl.environments` entry
point group: installed for real with pip (offline) and loaded in a fresh interpreter."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests._plugin_env import good_wheel, write_wheel

REPO = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e  # each test starts a fresh interpreter importing environments


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> pathlib.Path:
    """Two plugin distributions pip-installed into a private site dir, no network."""
    tmp = tmp_path_factory.mktemp("plugins")
    good = good_wheel(tmp)
    broken = write_wheel(
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
    assert out["prompt"] == "Say 7. "  # the test split's fourth task: odd numbers
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
