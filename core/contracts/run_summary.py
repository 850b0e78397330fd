"""The learner's end-of-run summary: a versioned, typed contract, written as JSON.

The learner prints it and writes it at --summary_path; the demo, the report and the
tests read it back with `RunSummary.from_json`, which refuses a summary of another
schema version (or none) instead of guessing at its fields. Field names are the JSON
keys. `from_dict` also checks each value's type, so a hand-edited or truncated summary
fails on read, naming the field, never later as a KeyError in a report.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

SCHEMA_VERSION = 1


class SchemaError(ValueError):
    """A summary this code cannot read: another schema version, or a malformed field."""


@dataclasses.dataclass
class Accounting:
    """Where every trajectory the learner asked for ended up (trainer/learning/data/accounting.py):
    requested = received + dropped by the pipeline + written off + in flight - late - foreign,
    received = trained + dropped stale + buffered at the end."""

    requested: int = 0
    received: int = 0
    trained: int = 0
    dropped_stale: int = 0
    buffered_at_end: int = 0
    dropped_by_pipeline: dict[str, int] = dataclasses.field(default_factory=dict)  # drop notices, by reason
    written_off: int = 0  # a request timed out, or a sync round did
    in_flight_at_end: int = 0
    late: int = 0  # came back after their request was written off
    foreign: int = 0  # requested before a restart, by the learner's previous life
    unexplained_requested: int = 0
    unexplained_received: int = 0
    balanced: bool = True


@dataclasses.dataclass
class DedupIds:
    """The consumer's dedup set of record ids (bounded by the staleness horizon)."""

    at_end: int = 0
    peak: int = 0
    expired: int = 0


@dataclasses.dataclass
class SyncRounds:
    """The synchronous baseline's rounds (trainer/learning/data/schedule.py)."""

    rounds: int = 0
    extra_steps: int = 0  # steps beyond publish_every, when a round's records did not fit
    padding_records: int = 0
    timed_out_rounds: int = 0
    lost_trajectories: int = 0  # never came back within their round's timeout
    round_sizes: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RunSummary:
    """What one learner run saw and did."""

    SCHEMA_VERSION: typing.ClassVar[int] = SCHEMA_VERSION

    steps: int = 0
    exit_code: int = 0  # 128 + signal when a signal stopped it
    schedule: str = "async"  # or "sync"
    sync: SyncRounds | None = None  # the sync baseline's rounds; None when asynchronous
    mesh: dict[str, int] | None = None
    resumed_from_step: int | None = None
    warmstart_s: float = 0.0
    policy_versions_published: list[int] = dataclasses.field(default_factory=list)
    # What each published version cost on storage: {"version", "kind": "full"|"delta", "bytes", "seconds"}.
    policy_version_writes: list[dict] = dataclasses.field(default_factory=list)
    trained_record_ids: list[str] = dataclasses.field(default_factory=list)
    # Records and their contents.
    records_consumed: int = 0
    records_rejected: int = 0  # dead-lettered
    records_duplicate: int = 0
    records_redelivered_while_held: int = 0
    dedup_ids: DedupIds = dataclasses.field(default_factory=DedupIds)
    pubsub_errors: int = 0
    trajectories_dropped_by_pipeline: dict[str, int] = dataclasses.field(default_factory=dict)
    tokens_consumed: int = 0
    loss_tokens_consumed: int = 0
    trajectories: int = 0
    # Trained trajectories whose tokens and loss mask were checked, at the train step, to be
    # exactly what the rollout side sampled (core.contracts.trajectory.token_digest).
    trajectories_tokens_verified: int = 0
    mean_reward: float = 0.0
    episode_status: dict[str, int] = dataclasses.field(default_factory=dict)
    declared_record_shapes: list[str] = dataclasses.field(default_factory=list)
    record_shapes: dict[str, int] = dataclasses.field(default_factory=dict)
    records_by_max_policy_version: dict[str, int] = dataclasses.field(default_factory=dict)
    # Staleness.
    staleness_histogram: dict[str, int] = dataclasses.field(default_factory=dict)  # versions behind -> records
    records_dropped_stale: int = 0
    trajectories_dropped_stale: int = 0
    staleness_waits: int = 0
    # The closed loop on the lag (trainer/learning/data/lag_control.py): target, window,
    # bounds, last measured lag and every change with its reason; None when off.
    lag_control: dict | None = None
    # The feeder (None off the primary process, which runs none).
    requests_published: int | None = None
    requests_redone: int | None = None  # written off after request_timeout_s and asked again
    request_publish_errors: int | None = None
    # Time and throughput.
    compiled_train_steps: int = 0
    wall_s: float = 0.0
    learner_duty_cycle: float = 0.0
    trained_tokens_per_s: float = 0.0
    trained_tokens_per_step_s: float = 0.0
    step_tflops_per_s: float = 0.0
    mfu: float | None = None  # needs --peak_tflops
    # After the first step (its compile and the rollout side's start excluded).
    steady_duty_cycle: float = 0.0
    steady_trained_tokens_per_s: float = 0.0
    steady_wall_s: float = 0.0
    first_step_s: float = 0.0
    last_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    accounting: Accounting = dataclasses.field(default_factory=Accounting)

    def to_dict(self) -> dict:
        return {"schema_version": self.SCHEMA_VERSION, **dataclasses.asdict(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data) -> RunSummary:
        check_schema(data, cls.SCHEMA_VERSION, "run summary")
        return from_dict(cls, data)

    @classmethod
    def from_json(cls, text: str) -> RunSummary:
        return cls.from_dict(loads(text, "run summary"))


# ----------------------------------------------------------------------------- reading
def loads(text: str, what: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise SchemaError(f"the {what} is not JSON ({e})") from None


def check_schema(data, version: int, what: str) -> None:
    """Refuses a `what` without `schema_version == version`, saying which it has."""
    if not isinstance(data, dict):
        raise SchemaError(f"a {what} is a JSON object, got {type(data).__name__}")
    found = data.get("schema_version")
    if found is None:
        raise SchemaError(f"the {what} has no schema_version (written before summaries were versioned)")
    if found != version:
        raise SchemaError(
            f"the {what} has schema_version {found!r}; this code reads version {version} only "
            "(written by another version of it)"
        )


def from_dict(cls, data: dict, where: str | None = None):
    """A `cls` dataclass from its `dataclasses.asdict` form, nested dataclasses included:
    unknown fields and values of the wrong type are refused, naming the field; an absent
    field takes its default."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise SchemaError(f"{where} must be a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields) - {"schema_version"})
    if unknown:
        raise SchemaError(f"{where} has unknown fields {unknown}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _value(hints[name], data[name], f"{where}.{name}") for name in fields if name in data}
    return cls(**kwargs)


def _value(tp, value, where: str) -> Any:
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    origin = typing.get_origin(tp) or tp
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        list: lambda v: isinstance(v, list),
        dict: lambda v: isinstance(v, dict),
    }.get(origin, lambda v: True)
    if not ok(value):
        raise SchemaError(f"{where} must be {getattr(tp, '__name__', tp)}, got {value!r}")
    if origin is list and args:
        return [_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and len(args) == 2:
        return {str(k): _value(args[1], v, f"{where}[{k!r}]") for k, v in value.items()}
    return float(value) if origin is float else value
