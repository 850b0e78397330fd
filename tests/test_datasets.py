"""Prompt datasets as TFDS builders: build, load through tfds.data_source, reuse, offline."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

import environments
from environments import datasets, guess

REPO = pathlib.Path(__file__).resolve().parents[1]
# protobuf's deprecation of FieldDescriptor.label, raised from inside tfds's logging.
pytestmark = pytest.mark.filterwarnings("ignore:label\\(\\) is deprecated:DeprecationWarning")


def _ensure_guess_registered():
    # The lead registers "guess" in registry._register_builtins; until then, do it here
    # (only if missing, so a built-in registration is never replaced).
    try:
        environments.make_tasks("guess", 0, 1)
    except KeyError:
        environments.register(
            "guess",
            lambda **cfg: guess.GuessEnv(guess.GuessConfig(**cfg)),
            tasks=guess.generate_tasks,
            oracle=guess.oracle_action,
            overwrite=True,
        )


@pytest.fixture(autouse=True)
def _registry():
    _ensure_guess_registered()


def _files(path: pathlib.Path) -> dict[str, float]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("env_name", ["calculator", "guess"])
def test_build_then_load_gives_the_generators_tasks(tmp_path, env_name):
    t0 = time.perf_counter()
    path = datasets.build(env_name, tmp_path, train_size=120, test_size=40, seed=3)
    print(f"{env_name}: built in {time.perf_counter() - t0:.2f} s")
    assert path == tmp_path / "agentic_rl_tasks" / env_name / "1.0.0"
    assert sorted(p.name for p in path.glob("*.array_record-*")) == [
        f"agentic_rl_tasks-{s}.array_record-00000-of-00001" for s in ("test", "train")
    ]
    loaded = {}
    for split, n in (("train", 120), ("test", 40)):
        tasks = datasets.load_tasks(env_name, split, tmp_path)
        assert len(tasks) == n
        expected = environments.make_tasks(env_name, 3, n, split)
        assert list(tasks) == expected  # same tasks, same order, meta round-tripped
        assert tasks[-1] == expected[-1] and tasks[5:8] == expected[5:8]  # random access
        with pytest.raises(IndexError):
            tasks[n]
        assert all(isinstance(t, environments.Task) for t in tasks)
        loaded[split] = {t.task_id for t in tasks}
    assert loaded["train"] and loaded["test"] and not loaded["train"] & loaded["test"]
    meta = datasets.load_tasks(env_name, "test", tmp_path).metadata
    assert (meta["env"], meta["seed"], meta["train_size"], meta["test_size"]) == (env_name, 3, 120, 40)
    assert "tensorflow" not in sys.modules  # TFDS ran on its numpy/array_record path


def test_second_build_is_a_no_op_and_a_different_one_is_refused(tmp_path):
    path = datasets.build("guess", tmp_path, train_size=50, test_size=20, seed=1)
    before = _files(path)
    t0 = time.perf_counter()
    assert datasets.build("guess", tmp_path, train_size=50, test_size=20, seed=1) == path
    assert time.perf_counter() - t0 < 1.0  # regenerates tasks for the fingerprint only
    assert _files(path) == before  # nothing rewritten
    for changed in [dict(train_size=51), dict(test_size=19), dict(seed=2)]:
        with pytest.raises(ValueError, match="overwrite"):
            datasets.build("guess", tmp_path, **{"train_size": 50, "test_size": 20, "seed": 1, **changed})
    datasets.build("guess", tmp_path, train_size=10, test_size=5, seed=2, overwrite=True)
    assert len(datasets.load_tasks("guess", "train", tmp_path)) == 10
    assert list(datasets.load_tasks("guess", "test", tmp_path)) == guess.generate_tasks(2, 5, "test")


def test_bad_requests(tmp_path):
    with pytest.raises(FileNotFoundError, match="build"):
        datasets.load_tasks("guess", "train", tmp_path)
    with pytest.raises(ValueError):
        datasets.load_tasks("guess", "validation", tmp_path)
    with pytest.raises(KeyError, match="no task generator"):
        datasets.build("no_such_env", tmp_path)
    for kwargs in [
        dict(env_name="a/b"),
        dict(env_name=""),
        dict(env_name="guess", train_size=-1),
        dict(env_name="guess", seed=1.5),
    ]:
        with pytest.raises(ValueError):
            datasets.build(data_dir=tmp_path, **kwargs)
    assert not (tmp_path / "agentic_rl_tasks").exists()


_NO_NETWORK = textwrap.dedent("""
    import json, socket, sys

    class NoNetwork(socket.socket):
        def __init__(self, *args, **kwargs):
            raise AssertionError("network touched")
    def refuse(*args, **kwargs):
        raise AssertionError("network touched")
    socket.socket = NoNetwork
    socket.create_connection = socket.getaddrinfo = refuse
""")

_OFFLINE_SCRIPT = _NO_NETWORK + textwrap.dedent("""
    import environments
    assert "tensorflow_datasets" not in sys.modules, "import environments must stay light"
    from environments import datasets, guess, Task
    # Any environment registered with tasks= gets a dataset, e.g. one from a plugin.
    def toy_tasks(seed, n, split):
        return [Task(f"toy-{split}-{seed}-{i}", f"Say {i}. ", str(i), {"i": i})
                for i in range(n)]
    environments.register("toy_plugin", lambda **cfg: None, tasks=toy_tasks)
    try:
        environments.make_tasks("guess", 0, 1)
    except KeyError:
        environments.register("guess", lambda **c: guess.GuessEnv(guess.GuessConfig(**c)),
                              tasks=guess.generate_tasks)
    data_dir = sys.argv[1]
    sizes = {}
    for env in ("calculator", "guess", "toy_plugin"):
        datasets.build(env, data_dir, train_size=30, test_size=10)
        datasets.build(env, data_dir, train_size=30, test_size=10)
        sizes[env] = [len(datasets.load_tasks(env, s, data_dir)) for s in ("train", "test")]
    assert datasets.load_tasks("toy_plugin", "test", data_dir)[7] == toy_tasks(0, 10, "test")[7]
    heavy = sorted({m.split(".")[0] for m in sys.modules} &
                   {"tensorflow", "apache_beam", "jax", "flax", "optax"})
    print(json.dumps({"sizes": sizes, "heavy": heavy}))
""")


@pytest.mark.e2e
def test_builds_offline_without_tensorflow_or_downloads(tmp_path):
    home, data_dir = tmp_path / "home", tmp_path / "data"
    tmp = tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "TFDS_DATA_DIR": str(tmp_path / "default_tfds"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _OFFLINE_SCRIPT, str(data_dir)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"sizes": {e: [30, 10] for e in ("calculator", "guess", "toy_plugin")}, "heavy": []}
    # A reader needs only the files: no generator code, no registry entry, no building.
    load_only = _NO_NETWORK + (
        "from environments import datasets\n"
        "t = datasets.load_tasks('toy_plugin', 'test', sys.argv[1])\n"
        "print(json.dumps([len(t), t[7].to_json_dict()]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", load_only, str(data_dir)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [
        10,
        {"task_id": "toy-test-0-7", "prompt": "Say 7. ", "target": "7", "meta": {"i": 7}},
    ]
    downloaded = [p for p in (data_dir / "downloads").rglob("*") if p.is_file()]
    assert downloaded == []  # tfds's download dir stays empty
    assert not (tmp_path / "default_tfds").exists()
    assert not any(home.iterdir()) and not any(tmp.iterdir())  # nothing written elsewhere
