"""RunStats keeps counts and sums, not a list per trajectory: the learner runs for hours."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from trainer.learning.run_stats import RunStats


def _record(rewards):
    trajectories = [SimpleNamespace(reward=r, status="ok") for r in rewards]
    return SimpleNamespace(
        num_tokens=10, num_loss_tokens=5, shape=(2, 8), max_policy_version=1, trajectories=trajectories
    )


@given(st.lists(st.lists(st.floats(-10, 10, allow_nan=False), max_size=16), max_size=20))
def test_mean_reward_and_counts_over_any_records(records):
    stats = RunStats()
    for rewards in records:
        stats.on_record(_record(rewards))
    flat = [r for rewards in records for r in rewards]
    assert stats.trajectories_received == len(flat) == stats.statuses["ok"]
    assert abs(stats.mean_reward() - (sum(flat) / len(flat) if flat else 0.0)) < 1e-9


def test_its_size_does_not_grow_with_the_trajectories_it_saw():
    stats = RunStats()
    stats.on_record(_record([1.0] * 16))
    before = sum(sys.getsizeof(v) for v in vars(stats).values())
    for _ in range(1000):
        stats.on_record(_record([0.5] * 16))
    assert sum(sys.getsizeof(v) for v in vars(stats).values()) == before
