"""The trajectory balances close when every trajectory is somewhere, and say by how much
when one is not."""

from hypothesis import given
from hypothesis import strategies as st

from trainer.learning.data.accounting import format_accounting, trajectory_accounting

counts = st.integers(0, 10_000)


@given(counts, counts, counts, counts, st.dictionaries(st.sampled_from(["zero_signal", "dropped_overlong"]), counts))
def test_every_trajectory_somewhere_balances(trained, stale, buffered, in_flight, drops):
    received = trained + stale + buffered
    a = trajectory_accounting(
        requested=received + sum(drops.values()) + in_flight,
        received=received,
        trained=trained,
        dropped_stale=stale,
        buffered=buffered,
        dropped_by_pipeline=drops,
        written_off=0,
        in_flight=in_flight,
    )
    assert a.balanced and a.unexplained_requested == a.unexplained_received == 0
    assert not any(line.startswith("MISMATCH") for line in format_accounting(a))


def test_a_lost_trajectory_is_a_mismatch_with_its_size():
    a = trajectory_accounting(
        requested=64,
        received=40,
        trained=30,
        dropped_stale=8,
        buffered=0,  # 2 received trajectories are nowhere
        dropped_by_pipeline={"zero_signal": 16},
        written_off=0,
        in_flight=5,  # 3 requested trajectories are nowhere
    )
    assert not a.balanced
    assert (a.unexplained_requested, a.unexplained_received) == (3, 2)
    assert format_accounting(a)[-1].startswith("MISMATCH: 3 requested and 2 received")
