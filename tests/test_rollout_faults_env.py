"""Environments that hang, raise or return garbage, mixed into one run of a rollout job
(tests/_rollout_job.py): each fault ends its episodes with a status or dead-letters its
request, and the worker serves good requests during and after.
"""

from __future__ import annotations

import math
import time
import types

import pytest

from tests._rollout_job import (
    GROUP,
    STARTUP_S,
    STEP_TIMEOUT_S,
    Job,
    counted_by_status,
    group_of,
    packed_by_status,
    store_with_v0,
)


def _assert_caught(run, request_id: str) -> None:
    """A faulty request is caught when its episodes end as env_error (packed, reward 0) or the
    request is dead-lettered with its error, and the job serves on."""
    assert run.alive, run.log
    group, dead = group_of(run.trajectories, request_id), run.dead.get(request_id, [])
    if dead:
        assert not group and len(dead) == 1, (group, dead)
    else:
        assert [t["status"] for t in group] == ["env_error"] * GROUP, group
        assert all(t["reward"] == 0.0 for t in group), group
    assert run.row.get("rollout/episodes_finished", 0) >= GROUP  # the good request after it


# -- environments that hang, raise or return garbage, mixed into one run -------------------------

# A reset that fails: no episode began, so the request is dead-lettered with the error.
DEAD_LETTERED = {
    "reset_raise": "RuntimeError: faulty environment: reset raised on purpose",
    "reset_not_str": "TypeError: env.reset must return str, got int",
    "reset_hang": f"TimeoutError: env.reset took over the step timeout ({STEP_TIMEOUT_S} s)",
}
# Garbage from a step (rollout/episodes.py::_checked): the episode ends as env_error.
GARBAGE = ("obs_bytes", "str_reward", "not_a_result", "none_result", "nan_reward", "bad_status")
MIXED = ("hang", "raise", *GARBAGE, *DEAD_LETTERED)
DURING = ("ok-during-0", "ok-during-1")  # sent right after the faulty requests
AFTER = ("ok-after-0", "ok-after-1")  # sent once the hung steps have timed out


@pytest.fixture(scope="module")
def mixed_run(pubsub_emulator, tmp_path_factory):
    """One job serves every fault of MIXED, then good requests; afterwards, what came out."""
    tmp = tmp_path_factory.mktemp("mixed-faults")
    run = types.SimpleNamespace()
    with Job(pubsub_emulator, tmp, store_with_v0(tmp)) as job:
        for fault in MIXED:
            job.send(fault, fault)
        for i, rid in enumerate(DURING):
            job.send(rid, "ok", i)
        job.wait_for("the good requests sent after the faulty ones", lambda: job.done(*DURING), STARTUP_S)
        run.hang_done_before_during = job.done("hang")
        job.wait_for("the hung steps' trajectories", lambda: job.done("hang"), STEP_TIMEOUT_S + 60)
        job.wait_for("the dead letters", lambda: len(job.dead) >= len(DEAD_LETTERED), 30)
        job.wait_for("a telemetry row with the timeouts", lambda: job.telemetry().get("rollout/episodes_timeout"), 30)
        for i, rid in enumerate(AFTER):
            job.send(rid, "ok", 10 + i)
        job.wait_for("the good requests sent after the timeouts", lambda: job.done(*AFTER), 60)
        end = time.monotonic() + 3  # anything still on its way (a reset timeout, were there one)
        while time.monotonic() < end:
            job.poll()
        run.alive, run.log = job.group.poll() is None, job.group.log_tail()
    run.trajectories, run.dead, run.row = job.trajectories(), job.dead_by_request(), job.telemetry()
    return run


@pytest.mark.timeout(300)
def test_a_hanging_step_times_out_while_the_worker_serves_others(mixed_run):
    run = mixed_run
    assert run.alive, run.log
    hang = group_of(run.trajectories, "hang")
    assert [t["status"] for t in hang] == ["timeout"] * GROUP
    assert all(t["reward"] == 0.0 and t["versions"] == {0} for t in hang)
    # Requests sent after the hung one were served while its steps still hung.
    assert not run.hang_done_before_during
    assert all(t["status"] == "finished" for r in DURING for t in group_of(run.trajectories, r))
    assert run.row["rollout/episodes_timeout"] == packed_by_status(run.trajectories)["timeout"]


@pytest.mark.timeout(300)
def test_a_raising_step_ends_its_episodes_as_env_error(mixed_run):
    run = mixed_run
    assert run.alive, run.log
    raised = group_of(run.trajectories, "raise")
    assert [t["status"] for t in raised] == ["env_error"] * GROUP
    assert all(t["reward"] == 0.0 for t in raised)
    assert "raise" not in run.dead
    assert run.row["rollout/episodes_env_error"] == packed_by_status(run.trajectories)["env_error"]


@pytest.mark.timeout(300)
def test_a_failing_or_hanging_reset_dead_letters_its_request(mixed_run):
    """Not an episode status: no episode began, so EpisodeGroupFn dead-letters the whole
    request with the error and counts it in rollout/dead_letters; a hung reset times out."""
    run = mixed_run
    assert run.alive, run.log
    assert sorted(run.dead) == sorted(DEAD_LETTERED)
    for rid, error in DEAD_LETTERED.items():
        assert run.dead[rid] == [error], rid
        assert not group_of(run.trajectories, rid), rid  # nothing of it packed
    assert run.row["rollout/dead_letters"] == len(DEAD_LETTERED)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", GARBAGE)
def test_garbage_from_a_step_ends_its_episodes_as_env_error(mixed_run, fault):
    """A None, a non-StepResult, bytes for text, a string, NaN reward or an unknown status:
    each is the environment's error; before, NaN and an unknown status stopped the job."""
    _assert_caught(mixed_run, fault)
    assert fault not in mixed_run.dead
    assert all(math.isfinite(t["reward"]) for t in mixed_run.trajectories.values())


@pytest.mark.timeout(300)
def test_good_requests_after_the_faults_are_served_and_every_episode_is_counted(mixed_run):
    run = mixed_run
    assert run.alive, run.log
    for rid in DURING + AFTER:
        group = group_of(run.trajectories, rid)
        assert len(group) == GROUP, rid
        assert all(t["status"] == "finished" and t["reward"] == 1.0 and t["versions"] == {0} for t in group), group
    # The telemetry counts every episode that ended, by status, as packed: nothing else ran.
    assert counted_by_status(run.row) == packed_by_status(run.trajectories)
    assert run.row["rollout/episodes"] == len(run.trajectories)
    assert run.row["rollout/policy_reload_failures"] == 0
