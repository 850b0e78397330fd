"""The local runner's speed-ups change nothing but the cost: the same arguments, the same
publisher behaviour, one client per process."""

import apache_beam as beam
from apache_beam.io.gcp import pubsub as beam_pubsub
from apache_beam.transforms import core

from pipelines import direct_runner


class _Stateful(beam.DoFn):
    def process(self, element, timestamp=beam.DoFn.TimestampParam, extra=3):
        yield element


def test_memoised_introspection_answers_as_beam_does():
    fn, wrapped = _Stateful(), beam.Map(lambda x, y=2: x).dofn
    want = core.get_function_arguments(fn, "process"), core.get_function_arguments(wrapped, "process")
    direct_runner.memoise_dofn_specs()
    for _ in range(2):  # the second answer comes from the cache
        got = core.get_function_arguments(fn, "process"), core.get_function_arguments(wrapped, "process")
        assert got == want
    args, _ = core.get_function_arguments(_Stateful(), "process")
    args.append("mutated")  # a caller's change never reaches the cache
    assert core.get_function_arguments(_Stateful(), "process") == want[0]
    other = beam.Map(lambda a, b, c=1: a).dofn  # per instance: never the first lambda's answer
    assert core.get_function_arguments(other, "process") != want[1]


def test_write_to_pubsub_dofns_share_one_publisher(monkeypatch):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "localhost:1")  # no credentials needed; nothing is sent
    direct_runner.share_pubsub_publishers()
    fns = [beam_pubsub._PubSubWriteDoFn(beam.io.WriteToPubSub(f"projects/local-project/topics/t{i}")) for i in range(2)]
    for fn in fns:
        fn.setup()
    assert fns[0]._pub_client is fns[1]._pub_client
    assert [fn._topic for fn in fns] == ["projects/local-project/topics/t0", "projects/local-project/topics/t1"]
