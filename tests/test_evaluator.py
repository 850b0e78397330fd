"""The evaluator scores policy versions from the store on held-out tasks, in its own
process, and never publishes anything: its episodes cannot reach the records topic."""

import asyncio
import os
import time
import weakref

import jax
import pytest
from flax import nnx

from core.contracts import pubsub_io
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.telemetry.scalars import read_rows
from localstack.launch.processes import ProcessGroup
from localstack.reports.heldout import FINAL_SCORING_MIN_S, final_scoring_budget_s, held_out_summary
from tests import _commands as commands

KEYS = {
    "version",
    "step",
    "mode",
    "published_at",
    "evaluated_at",
    "n",
    "success",
    "mean_turns",
    "tool_error_rate",
    "status",
    "skipped_versions",
    "tool_calls_per_episode",
    "malformed_rate",
    "eval_s",
    "mean_reward",
}


def publish(store: PolicyStore, version: int, seed: int) -> None:
    params = nnx.to_pure_dict(split_params(init_model(ModelConfig(), seed))[1])
    store.publish(version, params, {"step": 5 * version})


def run_evaluator(tmp_path, store_dir, final: int, n: int = 12, **extra) -> list[dict]:
    (tmp_path / "final").write_text(str(final))
    cmd = commands.evaluator(
        policy_root=str(store_dir),
        out=str(tmp_path / "eval.jsonl"),
        n=n,
        stop_file=str(tmp_path / "final"),
        slots=16,
        timeout_s=240,
        **extra,
    )
    with ProcessGroup(cmd, tmp_path / "evaluator.log", {**os.environ, "JAX_PLATFORMS": "cpu"}) as proc:
        deadline = time.monotonic() + 280
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        assert proc.poll() == 0, proc.log_tail()
    return read_rows(tmp_path / "eval.jsonl")


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_scores_the_newest_version_in_both_modes_and_counts_what_it_skipped(tmp_path):
    store = PolicyStore(tmp_path / "store")
    for v in range(3):
        publish(store, v, seed=v)
    rows = run_evaluator(tmp_path, tmp_path / "store", final=2)
    # Three versions were waiting: it scored the newest, and says it skipped two.
    assert [(r["version"], r["mode"]) for r in rows] == [(2, "sampled"), (2, "greedy")]
    for r in rows:
        assert KEYS <= set(r) and r["n"] == 12 and r["step"] == 10 and r["skipped_versions"] == 2
        assert sum(r["status"].values()) == 12
        wins = round(r["success"] * 12)  # success: the share of the 12 episodes with a reward
        assert r["success"] == pytest.approx(wins / 12) and wins <= r["status"].get("finished", 0)
    summary = held_out_summary(rows)
    assert summary["sampled"]["first"]["version"] == summary["sampled"]["last"]["version"] == 2
    # Beside the rows, up to 2 transcripts of each failure class a row counted (an untrained
    # model fails), and none of a success; the rows themselves carry none.
    examples = read_rows(tmp_path / "eval.examples.jsonl")
    for r in rows:
        assert "examples" not in r
        failed = {k: c for k, c in r["outcomes"].items() if k != "success"}
        mine = [e for e in examples if (e["version"], e["mode"]) == (2, r["mode"])]
        assert failed and {e["class"] for e in mine} == set(failed)
        assert all(sum(e["class"] == k for e in mine) == min(2, c) for k, c in failed.items())
        assert all(e["prompt"] and e["target"] and isinstance(e["text"], str) for e in mine)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_samples_per_task_give_pass_at_k_and_v0_is_swept_over_temperatures(tmp_path):
    """--samples 4: the sampled rows score each task 4 times (pass@1, 2, 4 with standard
    errors), greedy once; --temperatures: v0 alone gets a row at each, 1 being the sampled
    row itself; a version between the ends (samples_at ends) gets one sample."""
    store = PolicyStore(tmp_path / "store")
    publish(store, 0, seed=0)
    rows = run_evaluator(tmp_path, tmp_path / "store", final=0, n=6, samples=4, temperatures="0.5,1")
    by = {(r["mode"], r["temperature"]): r for r in rows}
    assert sorted(by) == [("greedy", 0.0), ("sampled", 1.0), ("sweep", 0.5)], sorted(by)
    for key in [("sampled", 1.0), ("sweep", 0.5)]:
        r = by[key]
        assert (r["samples"], r["tasks"], r["n"]) == (4, 6, 24) and sum(r["status"].values()) == 24
        assert sorted(r["pass_at"], key=int) == ["1", "2", "4"] == sorted(r["pass_at_se"], key=int)
        assert r["pass_at"]["1"] == pytest.approx(r["success"], abs=1e-4)
        assert r["pass_at"]["1"] <= r["pass_at"]["2"] <= r["pass_at"]["4"]
    greedy = by[("greedy", 0.0)]
    assert (greedy["samples"], greedy["n"]) == (1, 6) and "pass_at" not in greedy and "success_se" in greedy
    log = (tmp_path / "evaluator.log").read_text()
    assert "eval v0 sweep@0.5" in log and "over 6 tasks x 4" in log


@pytest.mark.timeout(400)
def test_evaluation_never_reaches_the_records_topic(pubsub_emulator, unique_name, tmp_path):
    records = unique_name("records")
    pubsub_emulator.create_topic(records)
    sub = pubsub_emulator.create_subscription(records + "-sub", records)
    store = PolicyStore(tmp_path / "store")
    publish(store, 0, seed=0)
    rows = run_evaluator(tmp_path, tmp_path / "store", final=0)  # PUBSUB_EMULATOR_HOST is set for it
    assert {r["mode"] for r in rows} == {"sampled", "greedy"} and sum(r["n"] for r in rows) == 24
    subscriber = pubsub_io.subscriber_client()
    try:
        assert pubsub_io.pull(subscriber, sub, 100, 2.0) == []  # 24 episodes ran; nothing was published
    finally:
        subscriber.close()
    log = (tmp_path / "evaluator.log").read_text()
    assert "eval v0 sampled" in log and "eval v0 greedy" in log


def _wait_for_rows(path, n: int, thread, timeout_s: float = 120.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and thread.is_alive():
        rows = read_rows(path) if path.exists() else []
        if len(rows) >= n:
            return rows
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} rows: {read_rows(path) if path.exists() else []}")


@pytest.mark.timeout(300)
def test_greedy_at_the_ends_scores_greedy_for_the_first_and_the_final_version_only(tmp_path):
    """A slow model's run spends half its evaluation on greedy: with --greedy_at=ends only
    v0 and the final version get it, even a final version scored before it was known final."""
    import threading

    from core import config
    from rollout import evaluator

    store, out, stop = PolicyStore(tmp_path / "store"), tmp_path / "eval.jsonl", tmp_path / "final"
    cfg = config.build(
        evaluator.EvaluatorConfig,
        policy_root=str(tmp_path / "store"),
        out=str(out),
        n=4,
        slots=4,
        stop_file=str(stop),
        greedy_at="ends",
        poll_s=0.05,
        timeout_s=240,
    )
    publish(store, 0, seed=0)
    thread = threading.Thread(target=evaluator.run, args=(cfg,), daemon=True)
    thread.start()
    _wait_for_rows(out, 2, thread)  # v0, both modes
    publish(store, 1, seed=1)
    _wait_for_rows(out, 3, thread)  # v1: sampled only, not known to be final
    stop.write_text("1")  # the learner is done: v1 was the final version after all
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert [(r["version"], r["mode"]) for r in read_rows(out)] == [
        (0, "sampled"),
        (0, "greedy"),
        (1, "sampled"),
        (1, "greedy"),
    ]


def test_the_demo_waits_for_the_final_scoring_as_long_as_four_of_its_longest_evaluations():
    # SmolLM2 run 15: evaluations of 297-425 s, and a fixed 900 s cut the final greedy one.
    rows = [{"version": 0, "mode": "sampled", "eval_s": 297.0}, {"version": 3, "mode": "sampled", "eval_s": 425.0}]
    assert final_scoring_budget_s(rows) == 4 * 425.0
    assert final_scoring_budget_s([{"eval_s": 12.0}]) == FINAL_SCORING_MIN_S  # the byte policy: the floor
    assert final_scoring_budget_s([]) == FINAL_SCORING_MIN_S  # nothing scored yet


def test_an_evaluation_given_up_part_way_cancels_every_episode(monkeypatch):
    """Once the learner is done, an evaluation of an earlier version is not worth finishing:
    at SmolLM2's size it takes 5-7 minutes, and the final version waited behind it (run 15)."""
    from rollout import scoring

    started, cancelled, asked = [], [], []

    async def endless_episode(engine, env, task, limits):
        started.append(task)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(task)
            raise

    monkeypatch.setattr(scoring, "run_episode", endless_episode)

    def superseded():  # the third time it is asked
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(scoring.Superseded):
        asyncio.run(scoring._episodes(None, [None] * 3, [1, 2, 3], None, superseded, 0.01))
    assert sorted(started) == sorted(cancelled) == [1, 2, 3] and len(asked) == 3


def _tiny_evaluation(seed: int):
    """The real engine on the tiny model: 256 calculator episodes on 8 slots take about 5 s
    here, so one given up a second in has some episodes ended and some mid-turn. Returns
    (params, a new sampler, evaluate's other arguments, a superseded() true at its 2nd ask)."""
    import environments
    from core.policy.sampling.sampler import Sampler
    from rollout.episodes import EpisodeLimits

    cfg, env_config = ModelConfig(), {"tool_latency": "none"}
    tasks = environments.make_tasks("calculator", 0, 256, "test", env_config)
    limits = EpisodeLimits(max_new_tokens_per_turn=8, max_tokens=128, episode_timeout_s=120)
    asked = []

    def at_the_second_ask() -> bool:  # asked at the start, then a second later
        asked.append(1)
        return len(asked) > 1

    at_the_second_ask.asked = asked
    params = split_params(init_model(cfg, seed))[1]
    return params, lambda: Sampler(cfg, 8, 128, 16), ("calculator", tasks, limits, env_config), at_the_second_ask


def test_a_sampler_whose_evaluation_was_given_up_scores_the_next_one_as_a_fresh_one():
    from rollout import scoring

    params, new_sampler, args, at_the_second_ask = _tiny_evaluation(seed=0)
    env, tasks, *rest = args
    few = (env, tasks[:48], *rest)  # the scorings compared: a fraction of the 256's time
    fresh = scoring.evaluate(params, new_sampler(), *few)
    sampler = new_sampler()
    with pytest.raises(scoring.Superseded):
        scoring.evaluate(params, sampler, *args, superseded=at_the_second_ask)
    again = scoring.evaluate(params, sampler, *few)
    assert again["n"] == 48 and (again["outcomes"], again["status"]) == (fresh["outcomes"], fresh["status"])


def test_a_version_given_up_is_freed_as_soon_as_its_caller_drops_it():
    """The cancelled episodes leave reference cycles (engine, tasks, the exception's frames)
    that held the given-up version's params until a full gc pass: at SmolLM2's size the
    evaluator then held two versions, 0.5 GB more (run 17's final scoring)."""
    from rollout import scoring

    params, new_sampler, args, at_the_second_ask = _tiny_evaluation(seed=1)
    refs = [weakref.ref(leaf) for leaf in jax.tree.leaves(params)]
    with pytest.raises(scoring.Superseded):
        scoring.evaluate(params, new_sampler(), *args, superseded=at_the_second_ask)
    del params
    assert len(at_the_second_ask.asked) == 2 and [r for r in refs if r() is not None] == []


def _run_evaluator_scripted(tmp_path, monkeypatch, script, **flags) -> tuple[list[tuple], list[bool]]:
    """The evaluator's loop with scoring.evaluate stood in for: before its k-th call returns,
    script[k](store, stop) runs (a learner publishing, then writing the stop file); then the
    call gives up if the evaluator tells it the version is superseded, as evaluate would."""
    from core import config
    from rollout import evaluator

    store, out, stop = PolicyStore(tmp_path / "store"), tmp_path / "eval.jsonl", tmp_path / "final"
    publish(store, 0, seed=0)
    asked = []  # per call: whether the evaluator gave it a way to give up

    def evaluate(params, sampler, env, tasks, limits, env_config, fmt, examples, superseded, samples=1):
        asked.append(superseded is not None)
        SAMPLES.append(samples)
        script.get(len(asked), lambda store, stop: None)(store, stop)
        if superseded is not None and superseded():
            raise evaluator.Superseded
        row = {"n": len(tasks) * samples, "tasks": len(tasks), "success": 1.0, "mean_turns": 1.0, "status": {}}
        return {**row, "outcomes": {}, "eval_s": 0.1}

    monkeypatch.setattr(evaluator, "evaluate", evaluate)
    cfg = config.build(
        evaluator.EvaluatorConfig, policy_root=str(tmp_path / "store"), out=str(out), n=2, slots=2,
        stop_file=str(stop), poll_s=0.05, timeout_s=60, **flags,
    )  # fmt: skip
    rows = evaluator.run(cfg)
    assert [(r["version"], r["mode"]) for r in read_rows(out)] == [(r["version"], r["mode"]) for r in rows]
    return [(r["version"], r["mode"], r["skipped_versions"]) for r in rows], asked


SAMPLES: list[int] = []  # the samples per task each scripted evaluate was asked for


def test_a_version_scored_once_a_task_before_it_was_known_final_is_scored_again_with_the_samples(tmp_path, monkeypatch):
    # The chained run of 2026-12-07: v10 was taken up before the learner wrote the final
    # version, scored once a task, and its pass@k was never measured.
    def stop_at_1(store, stop):
        stop.write_text("1")

    SAMPLES.clear()
    script = {2: lambda store, stop: publish(store, 1, seed=1), 3: stop_at_1}
    rows, _ = _run_evaluator_scripted(tmp_path, monkeypatch, script, samples=4, greedy_at="ends")
    assert [(v, m) for v, m, _ in rows] == [
        (0, "sampled"),
        (0, "greedy"),
        (1, "sampled"),
        (1, "sampled"),
        (1, "greedy"),
    ]
    assert SAMPLES == [4, 1, 1, 4, 1]


def _finish_at(version: int):
    def learner_done(store, stop):
        publish(store, version, seed=version)
        stop.write_text(str(version))

    return learner_done


def test_the_evaluator_gives_up_an_earlier_version_once_the_final_is_known(tmp_path, monkeypatch):
    # v1 is published as v0's greedy evaluation ends; the learner stops at v2 during v1's.
    script = {2: lambda store, stop: publish(store, 1, seed=1), 3: _finish_at(2)}
    rows, asked = _run_evaluator_scripted(tmp_path, monkeypatch, script)
    assert rows == [(0, "sampled", 0), (0, "greedy", 0), (2, "sampled", 1), (2, "greedy", 1)]
    assert asked == [False, False, True, True, True]


def test_the_evaluator_never_gives_up_the_baseline(tmp_path, monkeypatch):
    # The learner stops at v1 while v0, the first version scored, is in flight.
    rows, asked = _run_evaluator_scripted(tmp_path, monkeypatch, {1: _finish_at(1)})
    assert rows == [(0, "sampled", 0), (0, "greedy", 0), (1, "sampled", 0), (1, "greedy", 0)]
    assert asked == [False, False, True, True]
