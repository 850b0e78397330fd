"""Speed-ups for the local runner that have no supported route: undoable patches of Beam
internals, applied only to the Beam versions they were written for.

The BundleBasedDirectRunner builds every DoFn afresh for each bundle and, for each
bundle of a stateful DoFn (one bundle per key), calls `userstate.get_dofn_specs` several
times, which builds a signature wrapper for every method of the DoFn. Profiled with
py-spy on the demo's rollout job, that introspection took most of the runner's one
executor thread and starved the inference engine's thread of the GIL; so did the argument
lists every bundle's DoFnRunner inspects (`core.get_function_arguments`). State and timer
specs are declared as default arguments of a DoFn's methods, i.e. per class, so caching
them by class is exact; argument lists are cached per class and method where the method
is the class's own.

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

    def apply(self) -> bool:
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
            for owner, name, value in _replacements():
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, value)
            return True

    def undo(self) -> None:
        with self._lock:
            while self._saved:
                owner, name, original = self._saved.pop()
                setattr(owner, name, original)


def _replacements() -> list[tuple[object, str, object]]:
    from apache_beam.runners.direct import transform_evaluator
    from apache_beam.transforms import core, userstate

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

    return [
        (userstate, "get_dofn_specs", get_dofn_specs),  # is_stateful_dofn looks it up here at call time
        (transform_evaluator, "get_dofn_specs", get_dofn_specs),  # imported by name there
        (core, "get_function_arguments", get_function_arguments),  # MethodWrapper looks it up at call time
    ]


_PATCH = _Patch()


def apply() -> bool:
    """Applies the direct-runner patches to this process (idempotent); True if applied."""
    return _PATCH.apply()


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
