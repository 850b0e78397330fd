"""WriteRecordsToPubSub: PubsubMessages out to a topic, through one publisher per process.

Our own DoFn rather than Beam's WriteToPubSub, on every runner: Beam's opens a new
PublisherClient (mTLS lookups, a gRPC channel) in each DoFn's setup(), and the
BundleBasedDirectRunner builds DoFns afresh for every bundle. Here every write step of a
process shares one client (a PublisherClient is thread-safe), acquired through Beam's
`Shared`. The client is `pubsub_io.publisher_client()`: emulator-aware, with no message
size cap below Pub/Sub's own. A bundle finishes only once each of its messages is
published (a failed publish fails the bundle, which the runner retries: at least once).
"""

from __future__ import annotations

import threading

import apache_beam as beam
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.metrics import Metrics
from apache_beam.utils.shared import Shared

from core.telemetry import trace
from pipelines.metrics import NAMESPACE

# One handle (one key) for every write step of the process: one client between them.
_PUBLISHER = Shared()
# Shared keeps alive only the object acquired last in the process (the rollout worker
# displaces the client), and a publisher's channel is worth keeping for the process's life.
_KEEP: list = []
_KEEP_LOCK = threading.Lock()
PUBLISH_TIMEOUT_S = 300.0


class _Publisher:
    """The process's client (a weak-referenceable holder, as Shared needs)."""

    def __init__(self):
        from core.contracts import pubsub_io

        self.client = pubsub_io.publisher_client()
        with _KEEP_LOCK:
            _KEEP.append(self)


def process_publisher():
    """The PublisherClient every WriteRecordsToPubSub step of this process publishes with."""
    return _PUBLISHER.acquire(_Publisher).client


class _PublishFn(beam.DoFn):
    def __init__(self, topic: str, max_pending: int):
        self.topic, self.max_pending = topic, max_pending
        self.published = Metrics.counter(NAMESPACE, "pubsub_messages_published")
        self.published_bytes = Metrics.counter(NAMESPACE, "pubsub_bytes_published")
        self.failed = Metrics.counter(NAMESPACE, "pubsub_publish_failures")

    def setup(self):
        self._client = process_publisher()

    def start_bundle(self):
        self._pending: list = []

    def process(self, msg: PubsubMessage):
        attributes = dict(msg.attributes or {})
        self._pending.append((len(msg.data), self._client.publish(self.topic, msg.data, **attributes)))
        if len(self._pending) >= self.max_pending:
            self._wait()

    def finish_bundle(self):
        self._wait()

    def _wait(self):
        if not self._pending:  # every bundle ends here, mostly with nothing sent
            return
        pending, self._pending = self._pending, []
        with trace.current().span("pubsub publish", "pubsub write", messages=len(pending), topic=self.topic):
            for size, future in pending:
                try:
                    future.result(timeout=PUBLISH_TIMEOUT_S)
                except Exception as e:
                    self.failed.inc()
                    from core.contracts import pubsub_io

                    if (fatal := pubsub_io.permanent_error(e, f"topic {self.topic}")) is not None:
                        raise fatal from None  # names the topic; the runner's retries cannot fix it
                    raise
                self.published.inc()
                self.published_bytes.inc(size)


class WriteRecordsToPubSub(beam.PTransform):
    """PubsubMessages (data and attributes) -> `topic` (projects/P/topics/T)."""

    def __init__(self, topic: str, max_pending: int = 100):
        super().__init__()
        if not topic or not topic.startswith("projects/") or "/topics/" not in topic:
            raise ValueError(f"topic must be projects/P/topics/T, got {topic!r}")
        self.topic, self.max_pending = topic, max_pending

    def expand(self, messages):
        return messages | "Publish" >> beam.ParDo(_PublishFn(self.topic, self.max_pending))
