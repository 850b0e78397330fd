"""A learner that gets no records says why, with counts, and stops a run that can never train."""

import pytest

from core.contracts.run_summary import Accounting
from trainer.learning.data.starvation import StarvationConfig, StarvationWatch, describe


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def acc(requested=64, received=0, zero_signal=0, in_flight=0, **drops):
    return Accounting(
        requested=requested,
        received=received,
        dropped_by_pipeline={"zero_signal": zero_signal, **drops},
        in_flight_at_end=in_flight,
    )


def test_no_line_while_records_come_or_before_warn_s():
    clock = Clock()
    watch = StarvationWatch(StarvationConfig(warn_s=60, stop_s=240), clock)
    clock.t = 59
    assert watch.check(0, acc(in_flight=64)) is None
    clock.t = 200
    assert watch.check(3, acc(received=48, in_flight=16)) is None  # a record resets the wait
    clock.t = 250
    assert watch.check(0, acc(received=48, in_flight=16)) is None and watch.waiting is None


def test_a_starved_learner_names_where_the_trajectories_went_once_per_warn_interval():
    clock = Clock()
    watch = StarvationWatch(StarvationConfig(warn_s=60, stop_s=0), clock)
    clock.t = 61
    line = watch.check(0, acc(requested=128, zero_signal=24, dropped_overlong=8, in_flight=96))
    assert "no record for 61 s" in line and "128 trajectories requested" in line
    assert "zero_signal 24" in line and "dropped_overlong 8" in line and "in Pub/Sub 96" in line
    assert "zero signal" not in line  # the hint only when zero-signal groups are all the drops
    assert watch.waiting == line
    clock.t = 90
    assert watch.check(0, acc(requested=128, zero_signal=24, in_flight=96)) is None  # not again yet
    clock.t = 10_000
    assert watch.check(0, acc(requested=128, zero_signal=600)) is not None
    assert watch.stopped is None  # stop_s 0: never stops


def test_a_run_whose_every_group_is_dropped_stops_with_the_reason():
    clock = Clock()
    watch = StarvationWatch(StarvationConfig(warn_s=60, stop_s=240, min_dropped=32), clock)
    clock.t = 239
    watch.check(0, acc(requested=256, zero_signal=200))
    assert watch.stopped is None
    clock.t = 240
    watch.check(0, acc(requested=256, zero_signal=200, in_flight=56))
    assert watch.stopped.startswith("nothing can train: no record for 240 s")
    assert "zero_signal 200" in watch.stopped and "equal rewards" in watch.stopped


def test_silence_without_drops_is_only_reported_not_stopped():
    """A pipeline that answers nothing may be starting or restarting: the demo's own
    restarts and timeouts handle it; the learner only says so."""
    clock = Clock()
    watch = StarvationWatch(StarvationConfig(warn_s=60, stop_s=240, min_dropped=32), clock)
    clock.t = 1000
    assert watch.check(0, acc(requested=256, zero_signal=8, in_flight=248)) is not None
    assert watch.stopped is None


def test_drops_before_the_last_record_do_not_count_toward_the_stop():
    clock = Clock()
    watch = StarvationWatch(StarvationConfig(warn_s=60, stop_s=240, min_dropped=32), clock)
    clock.t = 100
    watch.check(1, acc(requested=256, received=16, zero_signal=100))
    clock.t = 400
    watch.check(0, acc(requested=256, received=16, zero_signal=110))
    assert watch.stopped is None


def test_describe_counts_written_off_requests():
    text = describe(Accounting(requested=32, written_off=16, in_flight_at_end=16), 75)
    assert "written off (request timed out) 16" in text and "dropped by the pipeline: none" in text


@pytest.mark.parametrize(
    "bad, flag",
    [
        ({"warn_s": 0}, "starved_warn_s"),
        ({"warn_s": 60, "stop_s": 30}, "starved_stop_s"),
        ({"min_dropped": 0}, "starved_min_dropped"),
    ],
)
def test_config_refuses_settings_that_would_never_warn_or_stop_early(bad, flag):
    with pytest.raises(ValueError, match=flag):
        StarvationConfig(**bad)


def test_the_demos_timeout_message_says_what_it_waited_for(tmp_path):
    import json

    from localstack.launch.demo import waited_for

    assert waited_for(tmp_path, 40) == "it had trained 0 of 40 steps, and was still in its warm start (no policy v0)"
    (tmp_path / "policy-store").mkdir()
    (tmp_path / "policy-store" / "LATEST").write_text("0")
    logs = tmp_path / "logs" / "learner"
    logs.mkdir(parents=True)
    (logs / "metrics.jsonl").write_text(json.dumps({"step": 3}) + "\n")
    assert waited_for(tmp_path, 40) == "it had trained 3 of 40 steps"
    (logs / "status.json").write_text(json.dumps({"waiting": "no record for 61 s: ..."}))
    assert waited_for(tmp_path, 40).endswith("the learner was waiting for records: no record for 61 s: ...")


def test_the_live_panel_shows_why_the_learner_waits_and_how_many_groups_had_no_signal(tmp_path):
    import json

    from localstack.reports.live import RunState

    rollout = tmp_path / "logs" / "rollout-0"
    rollout.mkdir(parents=True)
    row = {"rollout/groups": 40, "rollout/groups_zero_signal": 40, "rollout/records": 0}
    (rollout / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "logs" / "learner").mkdir()
    (tmp_path / "logs" / "learner" / "status.json").write_text(json.dumps({"waiting": "no record for 61 s: ..."}))
    state = RunState(tmp_path, 10)
    state.refresh()
    fields = dict(state.fields())
    assert fields["learner waiting"] == "no record for 61 s: ..."
    assert fields["groups"] == "40 ended   40 with equal rewards (no signal)"
    (tmp_path / "logs" / "learner" / "status.json").write_text(json.dumps({"waiting": None}))  # records came
    state.refresh()
    assert "learner waiting" not in dict(state.fields())


def test_a_learner_training_on_buffered_records_is_not_starving():
    clock = Clock()
    watch = StarvationWatch(StarvationConfig(warn_s=60, stop_s=240, min_dropped=32), clock)
    clock.t = 10
    watch.check(0, acc(requested=256, zero_signal=100))
    clock.t = 230
    watch.progressed()  # a long step on records that came earlier
    clock.t = 280
    assert watch.check(0, acc(requested=256, zero_signal=100)) is None  # 50 s since the step
    clock.t = 480
    watch.check(0, acc(requested=256, zero_signal=120))  # 250 s since the step, but 20 new drops
    assert watch.stopped is None and watch.waiting is not None


def test_the_live_panel_shows_the_records_held_until_their_checkpoint_lands(tmp_path):
    import json
    import time

    from localstack.reports.live import RunState

    (tmp_path / "logs" / "learner").mkdir(parents=True)
    row = {"wall_time": time.time(), "step": 4, "policy/version": 4, "staleness/mean": 1.0, "staleness/max": 2}
    row |= dict.fromkeys(["perf/trained_tokens_per_s_recent", "perf/trained_tokens_per_s"], 10.0)
    row |= dict.fromkeys(["perf/duty_cycle_recent", "perf/duty_cycle"], 0.5)
    row["data/records_held_unacked"] = 7
    row |= {"staleness/records_0": 5, "staleness/records_2": 9, "staleness/records_10": 1}
    (tmp_path / "logs" / "learner" / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    state = RunState(tmp_path, 10)
    state.refresh()
    fields = dict(state.fields())
    assert fields["records held, not acked"] == "7"
    # The run's staleness distribution, in order of versions behind (10 after 2, not after 0).
    assert fields["staleness"] == "mean 1.00   max 2   records by versions behind 0: 5  2: 9  10: 1"
