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
