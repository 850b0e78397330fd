"""Staleness control: drop, wait, and the request version bound."""

import pytest
from _learner_data import random_record

from trainer.learning.data.staleness import StalenessConfig, StalenessControl


def record_of_version(v: int, seed: int = 0):
    rec = random_record(seed, rows=2, seq_len=32)
    rec.policy_versions[rec.loss_mask == 1] = v
    return rec


def test_records_beyond_max_staleness_are_dropped_and_counted():
    ctl = StalenessControl(StalenessConfig(max_staleness=2))
    assert ctl.admit(record_of_version(5), learner_version=7)  # staleness 2
    stale = record_of_version(4)
    assert not ctl.admit(stale, learner_version=7)  # staleness 3
    assert ctl.dropped_records == 1 and ctl.dropped_trajectories == len(stale.trajectories)
    assert ctl.histogram == {2: 1}


def test_buffered_records_go_stale_when_the_version_moves_on():
    ctl = StalenessControl(StalenessConfig(max_staleness=1))
    rec = record_of_version(3)
    assert ctl.admit(rec, 4) and ctl.admit_again(rec, 4)
    assert not ctl.admit_again(rec, 5)
    assert ctl.dropped_records == 1


def test_mean_staleness_threshold_makes_the_learner_wait():
    ctl = StalenessControl(StalenessConfig(max_staleness=4, max_mean_staleness=1.0))
    fresh, old = record_of_version(10), record_of_version(7)
    assert not ctl.should_wait([fresh, fresh], 10)
    assert ctl.should_wait([fresh, old], 10)  # mean 1.5
    assert ctl.waits == 1
    assert not StalenessControl(StalenessConfig(4)).should_wait([old, old], 10)  # no threshold: never


def test_synchronous_baseline_bounds():
    cfg = StalenessConfig(max_staleness=0)
    assert cfg.min_request_version(6) == 6  # every request waits for the newest policy
    assert StalenessConfig(max_staleness=3).min_request_version(2) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_staleness": -1},
        {"max_staleness": 1.5},
        {"max_staleness": 2, "max_mean_staleness": 3.0},
        {"max_staleness": 2, "max_mean_staleness": -0.1},
    ],
)
def test_config_refuses_settings_that_cannot_work(kwargs):
    with pytest.raises(ValueError):
        StalenessConfig(**kwargs)


# Mutation testing (make mutation) found these unchecked: counters that must add up over
# many records, the bounds' edges, and a record with nothing generated.


def test_drops_and_the_histogram_add_up_over_records():
    ctl = StalenessControl(StalenessConfig(max_staleness=1))
    stale = [record_of_version(2, seed) for seed in range(3)]
    assert ctl.admit(record_of_version(9), 10) and ctl.admit(record_of_version(9, 1), 10)
    assert not any(ctl.admit(r, 10) for r in stale[:2]) and not ctl.admit_again(stale[2], 10)
    assert ctl.histogram == {1: 2}
    assert ctl.dropped_records == 3
    assert ctl.dropped_trajectories == sum(len(r.trajectories) for r in stale) > 3


def test_a_record_with_no_generated_token_is_never_stale():
    rec = record_of_version(3)
    rec.loss_mask[:] = 0  # a prompt-only record: no token has a generating version
    assert StalenessControl.staleness(rec, 10) == 0
    assert StalenessControl.staleness(record_of_version(3), 10) == 7


def test_the_mean_bound_waits_only_above_it_and_counts_every_wait():
    ctl = StalenessControl(StalenessConfig(max_staleness=4, max_mean_staleness=2.0))
    v9, v7, v6 = record_of_version(9), record_of_version(7), record_of_version(6)
    assert not ctl.should_wait([v9, v7], 10)  # mean (1 + 3) / 2 = 2: at the bound, trains
    assert ctl.should_wait([v7, v6], 10) and ctl.should_wait([v6], 10)  # 3.5, 4
    assert ctl.waits == 2


@pytest.mark.parametrize("mean, ok", [(0.0, True), (3.0, True), (-0.5, False), (3.5, False)])
def test_the_mean_bound_lies_between_zero_and_max_staleness_inclusive(mean, ok):
    if ok:
        assert StalenessConfig(max_staleness=3, max_mean_staleness=mean).max_mean_staleness == mean
    else:
        with pytest.raises(ValueError, match=r"max_mean_staleness must lie in \[0, max_staleness=3\]"):
            StalenessConfig(max_staleness=3, max_mean_staleness=mean)
