"""Speed-ups and one leak fix for the local runner that have no supported route: undoable
patches of Beam internals, applied only to the Beam versions they were written for.

The BundleBasedDirectRunner builds every DoFn afresh for each bundle and, for each
bundle of a stateful DoFn (one bundle per key), calls `userstate.get_dofn_specs` several
times, which builds a signature wrapper for every method of the DoFn. Profiled with
py-spy on the demo's rollout job, that introspection took most of the runner's one
executor thread and starved the inference engine's thread of the GIL; so did the argument
lists every bundle's DoFnRunner inspects (`core.get_function_arguments`). State and timer
specs are declared as default arguments of a DoFn's methods, i.e. per class, so caching
them by class is exact; argument lists are cached per class and method where the method
is the class's own.

The runner also pickles and unpickles every ParDo's DoFn at the start of every bundle (its
check that the DoFn survives pickling, and a fresh instance per bundle): a fifth of the
executor thread in the rollout job's profile (benchmarks/beam_tax.py). The patch round-trips
each DoFn once per executor thread and reuses that copy for the thread's later bundles, as
a Dataflow worker reuses its deserialised DoFn; setup/teardown still run per bundle, and a
DoFn that does not pickle still fails at its first bundle.

The leak (it fits apache/beam#18642, an open report of the local runner growing while it
reads Pub/Sub): every pull of `ReadFromPubSub` that returns
messages hands the runner an empty "unprocessed" bundle to read again, which the watermark
manager adds to the read step's pending set; a bundle leaves that set only when a bundle
with elements completes, so these never do. The set grew by one bundle per request pulled,
for the job's life, and every watermark refresh walks all of it. An empty bundle holds no
watermark back (refresh reads only elements), so the patch leaves empty bundles out.

Applied only under the direct runners (Dataflow builds each DoFn once per worker).
`apply()` / `undo()` or `with patched():`; on a Beam version not in KNOWN_BEAM_VERSIONS
nothing is patched and a warning names the version (the job runs, slower).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import apache_beam

log = logging.getLogger(__name__)

# Versions whose internals these patches were read against (where the names are looked up
# at call time, and what they return).
KNOWN_BEAM_VERSIONS = ("2.77.0",)


class _Patch:
    """One process-wide set of attribute replacements, undone in reverse order."""

    def __init__(self):
        self._saved: list[tuple[object, str, object]] = []
        self._lock = threading.Lock()

    @property
    def applied(self) -> bool:
        return bool(self._saved)

    def apply(self, reuse_dofns: bool = True) -> bool:
        """Patches Beam; False (and a warning) on a Beam version it was not written for."""
        with self._lock:
            if self._saved:
                return True
            version = apache_beam.__version__
            if version not in KNOWN_BEAM_VERSIONS:
                log.warning(
                    "apache-beam %s: not patching the direct runner (written for %s); the local job runs slower",
                    version,
                    ", ".join(KNOWN_BEAM_VERSIONS),
                )
                return False
            for owner, name, value in _replacements(reuse_dofns):
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, value)
            return True

    def undo(self) -> None:
        with self._lock:
            while self._saved:
                owner, name, original = self._saved.pop()
                setattr(owner, name, original)


def _replacements(reuse_dofns: bool) -> list[tuple[object, str, object]]:
    from apache_beam.runners.direct import transform_evaluator, watermark_manager
    from apache_beam.transforms import core, userstate

    watermarks = watermark_manager._TransformWatermarks
    original_add_pending = watermarks.add_pending

    def add_pending(self, pending):
        if pending.has_elements():  # an empty one would never be removed (module docstring)
            original_add_pending(self, pending)

    original_specs, specs_cache = userstate.get_dofn_specs, {}

    def get_dofn_specs(dofn):
        cls = type(dofn)
        if cls not in specs_cache:
            specs_cache[cls] = original_specs(dofn)
        return specs_cache[cls]

    original_args, args_cache = core.get_function_arguments, {}

    def get_function_arguments(obj, func):
        # Per class only where the method is the class's own: Map/FlatMap wrappers answer
        # per instance (_inspect_*), and an instance attribute could shadow the method.
        if hasattr(obj, "_inspect_" + func) or func in getattr(obj, "__dict__", {}):
            return original_args(obj, func)
        key = (type(obj), func)
        if key not in args_cache:
            args_cache[key] = original_args(obj, func)
        args, defaults = args_cache[key]
        return list(args), list(defaults)

    reuse = [(transform_evaluator, "pickler", _RoundTripOnce(transform_evaluator.pickler))] if reuse_dofns else []
    return [
        *reuse,
        (userstate, "get_dofn_specs", get_dofn_specs),  # is_stateful_dofn looks it up here at call time
        (transform_evaluator, "get_dofn_specs", get_dofn_specs),  # imported by name there
        (core, "get_function_arguments", get_function_arguments),  # MethodWrapper looks it up at call time
        (watermarks, "add_pending", add_pending),
    ]


class _RoundTripOnce:
    """Beam's pickler module, but `roundtrip(dofn)` answers the same copy of the same DoFn
    object on the same thread (bundles of one step may run on several executor threads)."""

    def __init__(self, pickler):
        self._pickler = pickler
        self._local = threading.local()

    def __getattr__(self, name):
        return getattr(self._pickler, name)

    def roundtrip(self, obj):
        copies = self._local.__dict__.setdefault("copies", {})
        hit = copies.get(id(obj))
        if hit is None or hit[0] is not obj:  # keep the original, so its id is never reused
            hit = copies[id(obj)] = (obj, self._pickler.roundtrip(obj))
        return hit[1]


_PATCH = _Patch()


def apply(reuse_dofns: bool = True) -> bool:
    """Applies the direct-runner patches to this process (idempotent); True if applied.
    reuse_dofns=False leaves Beam's per-bundle DoFn round trip alone."""
    return _PATCH.apply(reuse_dofns)


def undo() -> None:
    """Puts Beam's own functions back."""
    _PATCH.undo()


def applied() -> bool:
    return _PATCH.applied


@contextlib.contextmanager
def patched():
    """The patches for the duration of a block (then undone, unless they were on before)."""
    was = applied()
    try:
        yield apply()
    finally:
        if not was:
            undo()
