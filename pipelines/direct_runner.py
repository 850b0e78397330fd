"""Speed-ups for the local runner: work Beam's direct runners redo for every bundle.

The BundleBasedDirectRunner builds every DoFn afresh for each bundle (a pickle round
trip, then `setup()`), so per-instance work is paid per bundle, not per worker:

1. `memoise_dofn_specs`: the runner calls `userstate.get_dofn_specs` (which builds a signature
wrapper for every method of the DoFn) several times per bundle of each stateful DoFn, and
a stateful DoFn gets a bundle per key (DedupById was keyed by trajectory id then). Profiled
with py-spy on the demo's rollout job, that introspection took 72 % of the runner's one
executor thread and starved the inference engine's thread of the GIL (12 % of samples).
State and timer specs are declared as default arguments of a DoFn's methods, i.e. per
class, so caching them by class is exact. The same holds for the argument lists that
every bundle's DoFnRunner inspects (`core.get_function_arguments`: 11 % of the rollout
job's samples with 2 s tools), cached per class and method.
2. `share_pubsub_publishers`: WriteToPubSub's DoFn opens a new PublisherClient in every
   `setup()`, i.e. per bundle: py-spy on the rollout job (rollout-alone ceiling, 2 s tools)
   put 15 % of its samples in `PublisherClient.__init__` (mTLS config lookups, a gRPC
   channel) and 10 % more in closing the channels again. One client per process, shared
   by those DoFns (a PublisherClient is thread-safe), does the same publishes.
Applied only under the direct runners; Dataflow builds each DoFn once per worker and
replaces WriteToPubSub with its native sink.
"""

from __future__ import annotations

import threading

from core.telemetry import trace

_applied = False
_shared = False


def memoise_dofn_specs() -> None:
    global _applied
    if _applied:
        return
    from apache_beam.runners.direct import transform_evaluator
    from apache_beam.transforms import userstate

    original, cache = userstate.get_dofn_specs, {}

    def get_dofn_specs(dofn):
        cls = type(dofn)
        if cls not in cache:
            cache[cls] = original(dofn)
        return cache[cls]

    userstate.get_dofn_specs = get_dofn_specs  # is_stateful_dofn looks it up here at call time
    transform_evaluator.get_dofn_specs = get_dofn_specs  # imported by name there

    from apache_beam.transforms import core

    original_args, arg_cache = core.get_function_arguments, {}

    def get_function_arguments(obj, func):
        # Per class only where the method is the class's own: Map/FlatMap wrappers answer
        # per instance (_inspect_*), and an instance attribute could shadow the method.
        if hasattr(obj, "_inspect_" + func) or func in getattr(obj, "__dict__", {}):
            return original_args(obj, func)
        key = (type(obj), func)
        if key not in arg_cache:
            arg_cache[key] = original_args(obj, func)
        args, defaults = arg_cache[key]
        return list(args), list(defaults)

    core.get_function_arguments = get_function_arguments  # MethodWrapper looks it up at call time
    _applied = True


def share_pubsub_publishers() -> None:
    global _shared
    if _shared:
        return
    from apache_beam.io.gcp import pubsub as beam_pubsub

    write_fn = beam_pubsub._PubSubWriteDoFn
    original_setup, clients, lock = write_fn.setup, {}, threading.Lock()

    def setup(self):
        with lock:
            if self.with_ordering not in clients:
                original_setup(self)  # the client Beam would open, opened once
                clients[self.with_ordering] = self._pub_client
        self._pub_client = clients[self.with_ordering]
        self._topic = self._pub_client.topic_path(self.project, self.short_topic_name)

    original_flush = write_fn._flush

    def flush(self):
        if not self._buffer:  # called at every bundle's end, mostly with nothing to send
            return original_flush(self)
        with trace.current().span(
            "pubsub publish", "pubsub write", messages=len(self._buffer), topic=self.short_topic_name
        ):
            original_flush(self)

    write_fn.setup = setup
    write_fn._flush = flush  # one span per batch of messages published (records, notices, dead letters)
    _shared = True
