"""The local runner's patches change nothing but the cost: the same answers, the same
output on a real BundleBasedDirectRunner pipeline patched and not, undone on request,
and refused on a Beam version they were not written for; and a streaming read from Pub/Sub
no longer piles up empty bundles (apache/beam#18642). The publisher DoFn
(pipelines/pubsub_write.py) is a supported route: one client per process, messages with
their attributes on the emulator."""

import logging
import threading
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import core, userstate
from apache_beam.utils.shared import Shared

from core.contracts import pubsub_io
from pipelines import direct_runner, pubsub_write


class _Stateful(beam.DoFn):
    def process(self, element, timestamp=beam.DoFn.TimestampParam, extra=3):
        yield element


class _RunningCount(beam.DoFn):
    """A stateful DoFn: the runner inspects its specs and arguments for every bundle."""

    COUNT = userstate.CombiningValueStateSpec("count", combine_fn=sum)

    def process(self, kv, count=beam.DoFn.StateParam(COUNT)):
        count.add(kv[1])  # 1 each: the running counts are the same in any order
        yield f"{kv[0]}:{count.read()}"


def _run_small_pipeline(out_dir) -> list[str]:
    options = PipelineOptions(["--runner=BundleBasedDirectRunner"])
    with beam.Pipeline(options=options) as p:
        (
            p
            | beam.Create([(k % 3, k) for k in range(12)])
            | beam.Map(lambda kv, one=1: (kv[0], one))
            | beam.ParDo(_RunningCount())
            | beam.io.WriteToText(str(out_dir / "out"))
        )
    return sorted(line for f in out_dir.iterdir() for line in f.read_text().splitlines())


@pytest.fixture(autouse=True)
def _unpatched():
    direct_runner.undo()
    yield
    direct_runner.undo()


def test_memoised_introspection_answers_as_beam_does():
    fn, wrapped = _Stateful(), beam.Map(lambda x, y=2: x).dofn
    want = core.get_function_arguments(fn, "process"), core.get_function_arguments(wrapped, "process")
    with direct_runner.patched() as on:
        assert on and core.get_function_arguments is not direct_runner._PATCH._saved[-1][2]
        for _ in range(2):  # the second answer comes from the cache
            got = core.get_function_arguments(fn, "process"), core.get_function_arguments(wrapped, "process")
            assert got == want
        args, _ = core.get_function_arguments(_Stateful(), "process")
        args.append("mutated")  # a caller's change never reaches the cache
        assert core.get_function_arguments(_Stateful(), "process") == want[0]
        other = beam.Map(lambda a, b, c=1: a).dofn  # per instance: never the first lambda's answer
        assert core.get_function_arguments(other, "process") != want[1]


def test_undo_puts_beams_functions_back():
    from apache_beam.runners.direct import transform_evaluator, watermark_manager

    def current():
        return (
            core.get_function_arguments,
            userstate.get_dofn_specs,
            transform_evaluator.get_dofn_specs,
            transform_evaluator.pickler,
            watermark_manager._TransformWatermarks.add_pending,
        )

    originals = current()
    assert direct_runner.apply() and direct_runner.apply()  # idempotent
    assert all(now is not before for now, before in zip(current(), originals))
    direct_runner.undo()
    assert current() == originals
    assert not direct_runner.applied()


def test_patched_and_unpatched_beam_give_the_same_output(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "patched").mkdir()
    plain = _run_small_pipeline(tmp_path / "plain")
    with direct_runner.patched() as on:
        assert on
        patched = _run_small_pipeline(tmp_path / "patched")
    assert not direct_runner.applied()
    assert plain == patched
    assert plain == sorted(f"{k}:{n}" for k in range(3) for n in range(1, 5))


class _Bundles(beam.DoFn):
    """Counts its own bundles and setups: a fresh instance per bundle would see 1 each time."""

    def __init__(self):
        self.bundles = self.setups = 0

    def setup(self):
        self.setups += 1

    def start_bundle(self):
        self.bundles += 1

    def process(self, element):
        yield (element, self.bundles, self.setups)


def test_each_dofn_is_round_tripped_once_per_thread():
    from apache_beam.runners.direct import transform_evaluator

    with direct_runner.patched():
        fn, other = _Bundles(), _Bundles()
        first = transform_evaluator.pickler.roundtrip(fn)
        assert first is not fn and transform_evaluator.pickler.roundtrip(fn) is first
        assert transform_evaluator.pickler.roundtrip(other) is not first
        elsewhere = []  # another executor thread gets its own copy
        worker = threading.Thread(target=lambda: elsewhere.append(transform_evaluator.pickler.roundtrip(fn)))
        worker.start()
        worker.join()
        assert elsewhere[0] is not first and elsewhere[0] is not fn
        assert transform_evaluator.pickler.dumps is not None  # the rest of the module is Beam's
        with pytest.raises(TypeError, match="not picklable"):  # an unpicklable DoFn still fails
            transform_evaluator.pickler.roundtrip(_Unpicklable())


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("not picklable")


_SEEN: list[tuple[int, int, int]] = []


def _record(row):  # by reference (a module function), so every copy appends to _SEEN
    _SEEN.append(row)


def test_a_reused_dofn_sees_every_bundle_and_is_set_up_for_each():
    from apache_beam.testing.test_stream import TestStream

    def run():
        _SEEN.clear()
        options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
        stream = TestStream().add_elements([1]).add_elements([2]).add_elements([3]).advance_watermark_to_infinity()
        with beam.Pipeline(options=options) as p:
            _ = p | stream | beam.ParDo(_Bundles()) | beam.Map(_record)
        return sorted(_SEEN)

    plain = run()
    with direct_runner.patched():
        patched = run()
    assert [e for e, _, _ in plain] == [e for e, _, _ in patched] == [1, 2, 3]
    assert {(b, s) for _, b, s in plain} == {(1, 1)}  # Beam's own: a fresh copy per bundle
    # Patched: one copy for every bundle; it counted them and was set up again for each.
    assert sorted((b, s) for _, b, s in patched) == [(1, 1), (2, 2), (3, 3)]


def test_an_unknown_beam_version_is_not_patched(monkeypatch, caplog):
    monkeypatch.setattr(direct_runner.apache_beam, "__version__", "9.99.0")
    original = core.get_function_arguments
    with caplog.at_level(logging.WARNING, logger=direct_runner.__name__):
        assert direct_runner.apply() is False
    assert core.get_function_arguments is original and not direct_runner.applied()
    assert "apache-beam 9.99.0: not patching" in caplog.text and "2.77.0" in caplog.text


def test_write_steps_share_one_publisher_and_publish_with_attributes(pubsub_emulator, unique_name, monkeypatch):
    monkeypatch.setattr(pubsub_write, "_PUBLISHER", Shared())  # a fresh client, on the emulator
    monkeypatch.setattr(pubsub_write, "_KEEP", [])
    emu = pubsub_emulator
    topics = [emu.create_topic(unique_name("write")) for _ in range(2)]
    subs = [emu.create_subscription(unique_name("write-sub"), t.rsplit("/", 1)[1]) for t in topics]
    options = PipelineOptions(["--runner=BundleBasedDirectRunner"])
    p = beam.Pipeline(options=options)
    for i, topic in enumerate(topics):
        msgs = [PubsubMessage(f"m{i}-{j}".encode(), {"kind": f"k{i}", "j": str(j)}) for j in range(5)]
        _ = p | f"Create{i}" >> beam.Create(msgs) | f"Write{i}" >> pubsub_write.WriteRecordsToPubSub(topic)
    result = p.run()
    result.wait_until_finish()
    assert len(pubsub_write._KEEP) == 1  # every bundle of both steps: one client
    published = result.metrics().query(MetricsFilter().with_name("pubsub_messages_published"))["counters"]
    assert sum(c.committed for c in published) == 10
    sub = pubsub_io.subscriber_client()
    for i, path in enumerate(subs):
        got = []
        for _ in range(20):
            msgs = pubsub_io.pull(sub, path, 10, timeout_s=2.0)
            pubsub_io.ack(sub, path, [m.ack_id for m in msgs])
            got += [m.message for m in msgs]
            if len(got) >= 5:
                break
        assert sorted((m.data, dict(m.attributes)) for m in got) == [
            (f"m{i}-{j}".encode(), {"kind": f"k{i}", "j": str(j)}) for j in range(5)
        ]


def test_a_topic_that_is_not_a_path_is_refused():
    with pytest.raises(ValueError, match="projects/P/topics/T"):
        pubsub_write.WriteRecordsToPubSub("records")


def _touch(message: bytes, out: str) -> None:
    (Path(out) / message.decode()).touch()  # the runner runs a copy of the step: a file is what comes back


def _pending_after_reading(subscription: str, topic: str, out: Path, n: int) -> dict[str, int]:
    """Runs ReadFromPubSub -> Map on the streaming local runner, publishes `n` messages one
    at a time, and once all are read answers each step's pending-bundle count."""
    out.mkdir()
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"]))
    _ = p | beam.io.ReadFromPubSub(subscription=subscription) | beam.Map(_touch, str(out))
    result = p.run()
    pub = pubsub_io.publisher_client()
    try:
        for i in range(n):  # 0.1 s apart: most pulls return one message
            pubsub_io.publish(pub, topic, f"m{i}".encode()).result(timeout=30)
            time.sleep(0.1)
        deadline = time.monotonic() + 60
        while len(list(out.iterdir())) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        watermarks = result._evaluation_context._watermark_manager._transform_to_watermarks
        return {step.full_label: len(tw._pending) for step, tw in watermarks.items()}
    finally:
        stopping = threading.Thread(target=result.cancel, daemon=True)  # joins the runner's threads
        stopping.start()
        while stopping.is_alive():  # its reader sits in a pull of up to 30 s: a message ends it
            pubsub_io.publish(pub, topic, b"stop").result(timeout=30)
            stopping.join(timeout=0.5)


def test_the_pubsub_reads_empty_bundles_do_not_pile_up(pubsub_emulator, unique_name, tmp_path):
    """The local runner's growth while it reads Pub/Sub (as in apache/beam#18642): each pull
    that returns messages leaves an empty bundle in the read step's pending set, never
    removed; patched, none is kept and every message still reaches the next step."""
    topic = pubsub_emulator.create_topic(unique_name("reads"))
    sent = {f"m{i}" for i in range(12)}

    def subscription():
        return pubsub_emulator.create_subscription(unique_name("reads-sub"), topic.rsplit("/", 1)[1])

    plain = _pending_after_reading(subscription(), topic, tmp_path / "plain", len(sent))
    assert plain["ReadFromPubSub"] >= 6, plain  # the leak: one a pull that returned messages
    with direct_runner.patched():
        patched = _pending_after_reading(subscription(), topic, tmp_path / "patched", len(sent))
    assert patched["ReadFromPubSub"] == 0, patched
    for run in ("plain", "patched"):
        assert {f.name for f in (tmp_path / run).iterdir()} >= sent, run
