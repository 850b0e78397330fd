"""Prompt datasets as TFDS builders: one builder, one config per environment.

    build("guess", "/data/tfds", train_size=1000, test_size=256, seed=0)
    tasks = load_tasks("guess", "test", "/data/tfds")    # random access: tasks[17]

Any environment registered with `tasks=` has a dataset: the builder config is made from
the registry's name on each `build`, so plugins need no code here. Files are written as
ArrayRecord (random access, no TensorFlow) to `<data_dir>/agentic_rl_tasks/<env>/1.0.0/`,
in generation order, with features `task_id`, `prompt`, `target` and `meta` (a JSON
string). Reading goes through the files alone (TFDS's read-only builder), so a reader
needs neither the generator's code nor the registry entry.

Nothing is downloaded: there is no download step, GCS look-ups are off (`try_gcs=False`,
`try_download_gcs=False`, and TFDS's GCS switch pinned off), and a reader never prepares.

`tensorflow_datasets` costs ~0.4-0.6 s to import, more than all of `environments`, so it
is imported on first use, not at module import.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import hashlib
import json
import pathlib
import re
import shutil
from typing import Any

from environments import registry
from environments.base import Task

DATASET_NAME = "agentic_rl_tasks"
VERSION = "1.0.0"
SPLITS = ("train", "test")
FORMAT = 1  # Bump when the on-disk layout (features, metadata keys) changes.
_CONFIG_NAME_RE = re.compile(r"[\w\-.]+\Z")  # What TFDS accepts as a config name.
_FEATURES = ("task_id", "prompt", "target", "meta")


@functools.cache
def _tfds():
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.utils import gcs_utils

    # Off by default in tfds 4.9.x; pinned so an upgrade cannot start fetching dataset
    # info from gs://tfds-data (no network here, and our datasets are not there).
    gcs_utils._is_gcs_disabled = True
    tfds.disable_progress_bar()  # Per-split tqdm bars are noise for a ~1 s build.
    return tfds


@functools.cache
def _builder_class():
    """Defined on first use (TFDS import is slow); registered with TFDS once."""
    tfds = _tfds()

    @dataclasses.dataclass(eq=False)
    class TasksConfig(tfds.core.BuilderConfig):
        seed: int = 0
        train_size: int = 1000
        test_size: int = 256
        task_settings: str = "{}"  # JSON: the env_config entries that shape the tasks
        fingerprint: str = ""  # Of the generated content, computed once by `build`.

    class LocalDatasetInfo(tfds.core.DatasetInfo):
        def initialize_from_bucket(self) -> None:
            # Never on GCS. Also, tfds makes a temp dir here on every builder construction
            # and never removes it.
            pass

    class AgenticRlTasks(tfds.core.GeneratorBasedBuilder):
        """Tasks of one registered environment (the config name) as train/test splits."""

        VERSION = tfds.core.Version(VERSION)
        BUILDER_CONFIGS = []  # Made per build from the registry (see `build`).

        def _info(self):
            c = self.builder_config
            text = tfds.features.Text()
            # DatasetInfo directly: `dataset_info_from_configs` wants a package dir of
            # README/CITATIONS files next to the builder's module.
            return LocalDatasetInfo(
                builder=self,
                description=f"Tasks of the {c.name!r} environment.",
                features=tfds.features.FeaturesDict({k: text for k in _FEATURES}),
                disable_shuffling=True,  # Keep generation order: file index = task index.
                metadata=tfds.core.MetadataDict(
                    _metadata(c.name, c.seed, c.train_size, c.test_size, c.fingerprint, json.loads(c.task_settings))
                ),
            )

        def _split_generators(self, dl_manager):
            del dl_manager  # Generated locally; nothing to download.
            c = self.builder_config
            return {
                "train": self._generate_examples("train", c.train_size),
                "test": self._generate_examples("test", c.test_size),
            }

        def _generate_examples(self, split, n):
            c = self.builder_config
            for i, task in enumerate(registry.make_tasks(c.name, c.seed, n, split, json.loads(c.task_settings))):
                yield i, _encode(task)

    return TasksConfig, AgenticRlTasks


def _encode(task: Task) -> dict[str, str]:
    d = task.to_json_dict()
    return {
        "task_id": d["task_id"],
        "prompt": d["prompt"],
        "target": d["target"],
        "meta": json.dumps(d["meta"], sort_keys=True),
    }


def _decode(example: dict[str, Any]) -> Task:
    text = {k: (v.decode("utf-8") if isinstance(v, bytes) else str(v)) for k, v in example.items()}
    return Task.from_json_dict(
        {
            "task_id": text["task_id"],
            "prompt": text["prompt"],
            "target": text["target"],
            "meta": json.loads(text["meta"]),
        }
    )


def _fingerprint(env_name: str, seed: int, train_size: int, test_size: int, settings: dict) -> str:
    # Over the generated content, so a changed generator is noticed, not silently reused.
    h = hashlib.sha256()
    for split, n in (("train", train_size), ("test", test_size)):
        for task in registry.make_tasks(env_name, seed, n, split, settings):
            h.update(json.dumps(_encode(task), sort_keys=True).encode() + b"\n")
    return h.hexdigest()


def _metadata(env_name: str, seed: int, train_size: int, test_size: int, fingerprint: str, settings: dict) -> dict:
    return {
        "format": FORMAT,
        "env": env_name,
        "seed": seed,
        "train_size": train_size,
        "test_size": test_size,
        "fingerprint": fingerprint,
        **({"task_settings": settings} if settings else {}),  # absent for the defaults: old datasets still match
    }


def dataset_dir(env_name: str, data_dir: str | pathlib.Path) -> pathlib.Path:
    return pathlib.Path(data_dir) / DATASET_NAME / env_name / VERSION


def _check_args(env_name: str, sizes: dict[str, Any]) -> None:
    if not isinstance(env_name, str) or not _CONFIG_NAME_RE.match(env_name):
        raise ValueError(f"environment name must match {_CONFIG_NAME_RE.pattern}, got {env_name!r}")
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")


def build(
    env_name: str,
    data_dir: str | pathlib.Path,
    train_size: int = 1000,
    test_size: int = 256,
    seed: int = 0,
    *,
    overwrite: bool = False,
    env_config: dict | None = None,
) -> pathlib.Path:
    """Generate `env_name`'s train/test tasks into `data_dir`; return the dataset dir.
    `env_config`: the environment's settings; those that shape its tasks (guess's range)
    are part of the dataset, so another range is another dataset.

    Idempotent: if the same dataset (same generator output for these sizes and seed) is
    already there, nothing is written. A different one there is an error unless
    `overwrite`, so a stale dataset is never mistaken for the requested one.
    """
    _check_args(env_name, {"train_size": train_size, "test_size": test_size, "seed": seed})
    path = dataset_dir(env_name, data_dir)
    settings = registry.task_settings(env_name, env_config)  # KeyError: no tasks.
    fingerprint = _fingerprint(env_name, seed, train_size, test_size, settings)
    want = _metadata(env_name, seed, train_size, test_size, fingerprint, settings)
    if (path / "dataset_info.json").exists():
        have = _read_metadata(path)
        if have == want:
            return path
        if not overwrite:
            raise ValueError(
                f"{path} holds a different {env_name!r} dataset ({have}); pass overwrite=True or use another data_dir"
            )
        shutil.rmtree(path)  # Fresh builder below; no stale DatasetInfo carried over.
    tfds = _tfds()
    config_cls, builder_cls = _builder_class()
    config = config_cls(
        name=env_name,
        seed=seed,
        train_size=train_size,
        test_size=test_size,
        task_settings=json.dumps(settings, sort_keys=True),
        fingerprint=fingerprint,
    )
    builder = builder_cls(config=config, data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return path


def _read_metadata(path: pathlib.Path) -> dict | None:
    try:
        return json.loads((path / "metadata.json").read_text())
    except (OSError, ValueError):
        return None


class TaskSource(collections.abc.Sequence):
    """A random-access, read-only sequence of Tasks over one split's ArrayRecord files."""

    def __init__(self, source, metadata: dict | None) -> None:
        self._source = source
        self.metadata = metadata  # env, seed, sizes, fingerprint as written by `build`.

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"task index {index} out of range for {n} tasks")
        return _decode(self._source[i])


def load_tasks(env_name: str, split: str, data_dir: str | pathlib.Path) -> TaskSource:
    """The tasks of a built split, read through `tfds.data_source` (no TensorFlow)."""
    _check_args(env_name, {})
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = dataset_dir(env_name, data_dir)
    if not (path / "dataset_info.json").exists():
        raise FileNotFoundError(
            f"no {env_name!r} dataset at {path}; run environments.datasets.build({env_name!r}, ...) first"
        )
    metadata = _read_metadata(path)
    if not metadata or metadata.get("format") != FORMAT:
        raise ValueError(
            f"{path} was written in another layout ({metadata}); rebuild it "
            f"with environments.datasets.build(..., overwrite=True)"
        )
    source = _tfds().data_source(
        f"{DATASET_NAME}/{env_name}:{VERSION}", split=split, data_dir=str(data_dir), download=False, try_gcs=False
    )
    return TaskSource(source, metadata)
