"""Rollout request: what the feeder publishes and the pipeline consumes (JSON, versioned)."""

from __future__ import annotations

import dataclasses
import json

REQUEST_SCHEMA_VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024
HEARTBEAT_ATTRIBUTE = "heartbeat"  # DirectRunner keep-alive messages carry this attribute


class RequestError(ValueError):
    """A rollout request that cannot be run; it goes to the dead-letter output."""


@dataclasses.dataclass(frozen=True)
class RolloutRequest:
    request_id: str
    env: str
    task: dict  # environments.Task.to_json_dict()
    group_size: int
    env_config: dict = dataclasses.field(default_factory=dict)
    min_policy_version: int = 0  # workers wait for at least this policy version (staleness bound)

    def to_bytes(self) -> bytes:
        return json.dumps({"schema_version": REQUEST_SCHEMA_VERSION, **dataclasses.asdict(self)}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RolloutRequest:
        if len(data) > MAX_REQUEST_BYTES:
            raise RequestError(f"request of {len(data)} bytes exceeds {MAX_REQUEST_BYTES}")
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # deep nesting too
            raise RequestError(f"request is not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise RequestError("request must be a JSON object")
        version = obj.get("schema_version")
        if type(version) is not int or version != REQUEST_SCHEMA_VERSION:  # refuses True too
            raise RequestError(
                f"request schema_version {obj.get('schema_version')!r}, expected {REQUEST_SCHEMA_VERSION}"
            )
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        missing = {"request_id", "env", "task", "group_size"} - set(obj)
        if missing or set(obj) - set(fields) - {"schema_version"}:
            unknown = sorted(set(obj) - set(fields) - {"schema_version"})
            raise RequestError(f"request fields: missing {sorted(missing)}, unknown {unknown}")
        obj.pop("schema_version")
        req = cls(**obj)
        if not all(isinstance(v, str) and v for v in (req.request_id, req.env)):
            raise RequestError("request_id and env must be non-empty strings")
        if not isinstance(req.task, dict) or not isinstance(req.env_config, dict):
            raise RequestError("task and env_config must be JSON objects")
        if type(req.group_size) is not int or req.group_size < 1:
            raise RequestError(f"group_size must be a positive int, got {req.group_size!r}")
        if type(req.min_policy_version) is not int or req.min_policy_version < 0:
            raise RequestError(f"min_policy_version must be an int >= 0, got {req.min_policy_version!r}")
        return req
