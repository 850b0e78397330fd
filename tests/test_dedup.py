"""DedupBy: first copy per key within the window, bounded state, counted.

The expiry rule is checked against an independent reference on random arrival sequences
(DedupFn.process driven directly, its state in a plain holder); the transform itself runs
on the real local runner.
"""

import apache_beam as beam
import numpy as np
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts.trajectory import Trajectory
from pipelines.dedup import DedupBy, DedupFn, SeenKeysCoder, expire
from pipelines.metrics import NAMESPACE


class _State:
    """A ReadModifyWrite state cell that round-trips through the real coder."""

    def __init__(self):
        self.encoded, self.writes = None, 0

    def read(self):
        return None if self.encoded is None else SeenKeysCoder().decode(self.encoded)

    def write(self, value):
        self.encoded, self.writes = SeenKeysCoder().encode(value), self.writes + 1


def reference(arrivals, window_s):
    """Element i passes iff no earlier *passed* element has its key and arrived within window_s."""
    passed = []
    for i, (key, t) in enumerate(arrivals):
        if not any(k == key and t - tj <= window_s for k, tj in passed):
            passed.append((key, t))
            yield i


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.sampled_from("abcde"), min_size=1, max_size=60),
    gaps=st.lists(st.integers(0, 5), min_size=60, max_size=60),
    window_s=st.integers(0, 20).map(lambda w: w + 0.5),  # never a tie with integer times
)
def test_keeps_exactly_the_first_copy_per_window(keys, gaps, window_s):
    times = [float(t) for t in np.cumsum(gaps[: len(keys)])]
    clock_values = iter(times)
    fn = DedupFn("d", window_s, clock=lambda: next(clock_values))
    state = _State()
    kept = [i for i, key in enumerate(keys) if list(fn.process((0, (key, i)), seen_state=state))]
    # The reference compares t - t_first <= window, as expire() keeps entries with t >= now - window.
    assert kept == list(reference(list(zip(keys, times, strict=True)), window_s))
    seen = state.read()
    assert all(t >= times[-1] - window_s for t in seen.values()) or seen == {}  # bounded by the window
    assert len(seen) <= len(set(keys))


def test_expire_keeps_order_and_drops_only_old_entries():
    seen = {"a": 1.0, "b": 5.0, "c": 9.0}
    assert list(expire(seen, now=12.0, window_s=5.0)) == ["c"]
    assert expire(seen, now=6.0, window_s=5.0) is seen  # nothing old: the same map, no rewrite
    assert SeenKeysCoder().decode(SeenKeysCoder().encode(seen)) == seen


def _traj(tid: str) -> Trajectory:
    return Trajectory(
        trajectory_id=tid,
        request_id=tid.split("/")[0],
        task_id="t",
        tokens=np.arange(4, dtype=np.int32),
        loss_mask=np.array([0, 1, 1, 1], np.uint8),
        behaviour_logprobs=np.zeros(4, np.float32),
        policy_versions=np.zeros(4, np.int32),
        reward=1.0,
        status="finished",
    )


def test_transform_drops_duplicates_and_counts_them_on_the_local_runner():
    ids = [f"r{i}/{j}" for i in range(30) for j in range(4)]
    stream = [_traj(i) for i in ids] + [_traj(i) for i in ids[::3]]  # every third id twice
    p = beam.Pipeline(options=PipelineOptions(runner="BundleBasedDirectRunner"))
    out = (
        p
        | beam.Create(stream)
        | DedupBy("dd", lambda t: t.trajectory_id, window_s=600.0, num_shards=4, clock=lambda: 0.0)
        | beam.Map(lambda t: t.trajectory_id)
    )
    assert_that(out, equal_to(ids))
    result = p.run()
    result.wait_until_finish()
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    }
    assert counters["dd_in"] == len(stream)
    assert counters["dd_out"] == len(ids)
    assert counters["dd_dropped"] == len(ids[::3])
    dist = {
        d.key.metric.name: d.committed
        for d in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["distributions"]
    }
    assert dist["dd_state_keys"].max <= len(ids)  # keys of one shard, never more than there are ids
