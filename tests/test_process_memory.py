"""core/process_memory.py: the gauges that tell a long run's growth apart by kind, and the
tracemalloc report that names the line that grew; and the growth they found, an evaluation
that kept its params alive."""

import gc
import sys
import threading
import tracemalloc

import jax
import jax.numpy as jnp
import pytest

import environments
from core import process_memory
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sampling.sampler import Sampler
from rollout.episodes import EpisodeLimits
from rollout.scoring import evaluate


def test_the_gauges_see_jax_arrays_and_python_objects_grow():
    gc.collect()  # what other tests left to collect would otherwise go between the samples
    before = process_memory.sample()
    kept = [jnp.ones((256, 1024)) for _ in range(4)]  # 4 MB on the device
    objects = [[] for _ in range(100_000)]  # containers: what the collector tracks
    after = process_memory.sample({"mem/compiled_variants": 3})
    assert after["mem/jax_live_arrays"] >= before["mem/jax_live_arrays"] + 4
    assert after["mem/jax_live_mb"] >= before["mem/jax_live_mb"] + 3.9
    assert after["mem/py_blocks"] >= before["mem/py_blocks"] + 90_000
    assert after["mem/rss_mb"] > 0 and after["mem/heap_in_use_mb"] > 0 and after["mem/compiled_variants"] == 3
    del kept, objects


def test_the_gauges_never_break_a_tuple_another_thread_is_building():
    """A learner died of this: its 30 s gauges listed every gc-tracked object while Orbax's
    save thread built `tuple(max(1, d) for d in shape)`, whose last resize then found the
    list's extra reference (SystemError, python/cpython#39117 before 3.13)."""
    errors: list[BaseException] = []
    done = threading.Event()

    def build_tuples():
        while not done.is_set():
            try:
                tuple(max(1, d) for d in range(40))
            except SystemError as e:
                errors.append(e)
                return

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over mid-generator, as a busy process does
    builder = threading.Thread(target=build_tuples)
    builder.start()
    try:
        for _ in range(300):  # the old gauges failed at the first sample in each of 5 tries
            process_memory.sample()
    finally:
        done.set()
        builder.join()
        sys.setswitchinterval(switch)
    assert not errors, errors


class _Grown:
    """A type the report must name among the objects that grew."""


def _grow(store: list) -> None:
    store.append(bytearray(3 << 20))  # the line the report must name
    store.extend([_Grown()] for _ in range(5_000))


def test_the_growth_report_names_the_line_that_grew(tmp_path, monkeypatch, walk_only_new_objects):
    monkeypatch.setenv("AGENTIC_RL_TRACEMALLOC", "3")
    monkeypatch.setattr(process_memory, "_FIRST", [])
    monkeypatch.setattr(process_memory, "_FIRST_TYPES", [])
    was_tracing = tracemalloc.is_tracing()
    try:
        assert process_memory.start_tracing()
        process_memory.write_growth(tmp_path / "growth.txt")  # the baseline
        assert not (tmp_path / "growth.txt").exists()
        store: list = []
        _grow(store)
        assert process_memory.sample()["mem/traced_mb"] >= 3
        process_memory.write_growth(tmp_path / "growth.txt")
        report = (tmp_path / "growth.txt").read_text()
        top = report.split(" MB in")[1].split(" MB in")[0]  # the biggest site's traceback
        assert report.startswith("+3.00 MB"), report[:500]
        assert "store.append(bytearray(3 << 20))" in top, report[:500]
        types = report.split("grown most since the first sample:")[1].split("\n\n")[0].splitlines()
        grown = {line.split()[1]: int(line.split()[0]) for line in types if line.strip()}
        assert grown.get(f"{__name__}._Grown", 0) >= 5_000 and grown.get("builtins.list", 0) >= 5_000, types
    finally:
        if not was_tracing:
            tracemalloc.stop()


@pytest.fixture
def untraced():
    """tracemalloc off for the test (another test may have left it on), as it was after."""
    was_tracing = tracemalloc.is_tracing()
    tracemalloc.stop()
    yield
    tracemalloc.stop()
    if was_tracing:
        tracemalloc.start()


def test_no_tracing_unless_asked(monkeypatch, untraced):
    monkeypatch.delenv("AGENTIC_RL_TRACEMALLOC", raising=False)
    assert not process_memory.start_tracing()
    assert "mem/traced_mb" not in process_memory.sample()
    monkeypatch.setenv("AGENTIC_RL_TRACEMALLOC", "1")  # asked: on, and in the gauges
    assert process_memory.start_tracing()
    assert "mem/traced_mb" in process_memory.sample()


def test_an_evaluation_leaves_no_reference_to_its_params_behind():
    """The evaluator's growth at SmolLM2's size: each evaluation's engine is in a reference
    cycle (it holds its loop task, whose coroutine holds it) that pinned the version's params
    until a full gc pass, so a second version's arrays sat beside the next one's."""
    cfg, env_config = ModelConfig(), {"tool_latency": "none"}
    sampler = Sampler(cfg, 4, 128, 16)
    tasks = environments.make_tasks("calculator", 0, 4, "test", env_config)
    limits = EpisodeLimits(max_new_tokens_per_turn=8, max_tokens=128, episode_timeout_s=60)
    gc.collect()
    gc.disable()  # no pass may tidy up behind the code under test
    try:
        counts = []
        for seed in range(3):
            params = split_params(init_model(cfg, seed))[1]
            evaluate(params, sampler, "calculator", tasks, limits, env_config)
            del params
            counts.append(len(jax.live_arrays()))
    finally:
        gc.enable()
    assert counts[0] == counts[1] == counts[2], counts


def test_the_types_alone_are_reported_without_tracing(tmp_path, monkeypatch, walk_only_new_objects, untraced):
    monkeypatch.setenv("AGENTIC_RL_GC_TYPES", "1")
    monkeypatch.setattr(process_memory, "_FIRST", [])
    monkeypatch.setattr(process_memory, "_FIRST_TYPES", [])
    process_memory.write_growth(tmp_path / "growth.txt")  # the baseline
    store = [[_Grown()] for _ in range(3_000)]
    process_memory.write_growth(tmp_path / "growth.txt")
    report = (tmp_path / "growth.txt").read_text()
    assert " MB in " not in report and not tracemalloc.is_tracing()
    assert f"{__name__}._Grown" in report.split("first sample:")[1], report
    shapes = report.split("with what holds one of each:\n")[1].splitlines()
    count, rest = shapes[0].split(" x ", 1)  # the most common shape: ours, held by the store
    assert int(count) >= 3_000 and rest.startswith("list[1] of _Grown:") and rest.endswith("<- ['list']"), shapes
    del store
