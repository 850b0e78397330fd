"""A speed-up for the local runner: Beam's DoFn state/timer introspection, memoised.

The BundleBasedDirectRunner calls `userstate.get_dofn_specs` (which builds a signature
wrapper for every method of the DoFn) several times per bundle of each stateful DoFn, and
a stateful DoFn gets a bundle per key (DedupById was keyed by trajectory id then). Profiled
with py-spy on the demo's rollout job, that introspection took 72 % of the runner's one
executor thread and starved the inference engine's thread of the GIL (12 % of samples).
State and timer specs are declared as default arguments of a DoFn's methods, i.e. per
class, so caching them by class is exact. Applied only under the direct runners; Dataflow
builds each DoFn runner once per worker.
"""

from __future__ import annotations

_applied = False


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
    _applied = True
