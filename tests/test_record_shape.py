"""One record layout, parsed by one function, read the same way by both sides."""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import given
from hypothesis import strategies as st

from core import config
from core.contracts.record_shape import (
    DEFAULT_BUCKETS,
    DEFAULT_MAX_SEGMENTS_PER_ROW,
    DEFAULT_ROWS,
    LayoutConfig,
    RecordLayout,
    RecordShape,
)
from pipelines.options import RolloutOptions, rollout_config
from trainer import task

LEARNER_FLAGS = ["--requests_topic=t", "--records_subscription=s", "--policy_root=/x"]


def parse(flags: list[str]) -> RecordLayout:
    """The layout the flags give, through the same config section both sides hold."""
    return config.from_namespace(LayoutConfig, config.make_parser(LayoutConfig).parse_args(flags)).layout


def to_flags(layout: RecordLayout) -> list[str]:
    return config.to_argv(LayoutConfig.of(layout))


def test_defaults_are_the_contracts():
    assert parse([]) == RecordLayout() == RecordLayout(DEFAULT_BUCKETS, DEFAULT_ROWS, DEFAULT_MAX_SEGMENTS_PER_ROW)
    assert RecordLayout().shapes == (RecordShape(),)


@pytest.mark.parametrize("text", ["256,128", "128,128", "0,128", "-64"])
def test_unsorted_repeated_or_non_positive_buckets_are_refused_not_fixed(text):
    with pytest.raises(ValueError, match="bucket"):
        parse([f"--buckets={text}"])


def test_non_integer_buckets_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse(["--buckets=128,big"])
    assert "--buckets: '128,big' is not a comma-separated list of int" in capsys.readouterr().err


@given(
    buckets=st.lists(st.integers(1, 4096), min_size=1, max_size=4, unique=True).map(sorted),
    rows=st.integers(1, 16),
    segments=st.integers(1, 16),
)
def test_to_flags_round_trips(buckets, rows, segments):
    layout = RecordLayout(tuple(buckets), rows, segments)
    assert parse(to_flags(layout)) == layout
    assert [s.seq_len for s in layout.shapes] == buckets and layout.max_seq_len == buckets[-1]
    assert all(s.max_trajectories == rows * segments for s in layout.shapes)


def test_learner_and_pipeline_read_the_same_flags_the_same_way():
    flags = to_flags(RecordLayout((128, 512), 8, 4))
    learner = task.parse_config(LEARNER_FLAGS + flags).record_layout
    pipeline = rollout_config(PipelineOptions(flags).view_as(RolloutOptions)).layout.layout
    assert learner == pipeline == RecordLayout((128, 512), 8, 4)


def test_the_learner_refuses_unsorted_buckets_at_start(capsys):
    with pytest.raises(SystemExit):
        task.parse_config([*LEARNER_FLAGS, "--buckets=512,128"])
    assert "strictly increasing" in capsys.readouterr().err


def test_trajectories_may_be_shorter_than_rows_never_longer():
    assert RecordLayout().trajectory_len == 256  # the tiny policy's context
    assert RecordLayout((128,)).trajectory_len == 128  # rows shorter than that cap it
    long_rows = RecordLayout((1024,), 2, 16, max_trajectory_len=256)
    assert long_rows.trajectory_len == 256 and parse(to_flags(long_rows)) == long_rows
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        RecordLayout((128,), max_trajectory_len=256)
    with pytest.raises(ValueError, match="max_trajectory_len"):
        RecordLayout((256,), max_trajectory_len=0)


def test_both_sides_cap_episodes_at_the_trajectory_length():
    from pipelines.options import rollout_config

    flags = ["--policy_root=/x", "--buckets=1024", "--rows=2", "--max_segments_per_row=16", "--max_trajectory_len=200"]
    assert rollout_config(PipelineOptions(flags)).layout.layout.trajectory_len == 200  # the workers' max_tokens
    learner = task.parse_config([*LEARNER_FLAGS, *flags[1:], "--warmstart_steps=1"])
    assert learner.record_layout.trajectory_len == 200  # the learner's span and its warm start's rows
