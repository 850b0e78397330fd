"""The rollout side's counts joined to the learner's balances (localstack/reports/reconcile.py):
remainders are what was still in flight, never negative; a negative one is a mismatch."""

import json

from localstack.reports.reconcile import format_reconciliation, reconcile, rollout_totals
from trainer.learning.data.accounting import trajectory_accounting


def _accounting(**kw):
    base = dict(
        requested=96,
        received=70,
        trained=64,
        dropped_stale=0,
        buffered=6,
        dropped_by_pipeline={"zero_signal": 8},
        written_off=0,
        in_flight=18,
    )
    return trajectory_accounting(**(base | kw))


ROLLOUT = {
    "episodes": 88,
    "episodes_finished": 80,
    "episodes_timeout": 8,
    "trajectories_packed": 74,
    "trajectories_dropped_zero_signal": 8,
    "dead_letters": 0,
    "episodes_per_s": 3.5,  # a gauge: not a status
}


def test_what_is_in_flight_at_the_end_is_a_remainder_not_a_mismatch():
    acc = _accounting()
    r = reconcile(acc, ROLLOUT, group_size=8)
    assert r.reconciled and r.episodes_by_status == {"finished": 80, "timeout": 8}
    assert r.remainders == {
        "not_yet_run": 96 - 88,
        "in_runner_or_packer": 88 - 74 - 8,
        "packed_not_received": 74 - 70,
        "zero_signal_notices_not_received": 0,
    }
    assert not any(line.startswith("MISMATCH") for line in format_reconciliation(r, acc))


def test_the_learner_receiving_more_than_was_packed_is_a_mismatch():
    acc = _accounting(received=80, buffered=16)
    r = reconcile(acc, ROLLOUT, group_size=8)
    assert not r.reconciled and r.mismatch == {"packed_not_received": -6}
    assert format_reconciliation(r, acc)[-1] == "MISMATCH (rollout vs learner): packed_not_received -6"
    # ... unless those were trajectories from before a restart
    assert reconcile(_accounting(received=80, buffered=16, foreign=6), ROLLOUT, 8).reconciled


def test_a_notice_the_workers_never_sent_is_a_mismatch():
    acc = _accounting(dropped_by_pipeline={"zero_signal": 8, "dropped_empty": 1}, in_flight=17)
    assert reconcile(acc, ROLLOUT, 8).mismatch == {"dropped_empty_notices_not_received": -1}


def test_rollout_totals_sum_the_newest_row_of_every_worker(tmp_path):
    for worker, rows in {"rollout-1": [{"rollout/episodes": 5}, {"rollout/episodes": 9}], "rollout-2": [{}]}.items():
        d = tmp_path / "logs" / worker
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "logs" / "rollout-2" / "metrics.jsonl").write_text('{"rollout/episodes": 4, "rollout/x": "y"}\n')
    assert rollout_totals(tmp_path) == {"episodes": 13}
    assert rollout_totals(tmp_path / "nothing") is None
