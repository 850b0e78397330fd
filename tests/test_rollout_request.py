"""Rollout requests: round trip, and every malformed message is a RequestError (so the
pipeline dead-letters it) rather than a crash."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts.rollout_request import MAX_REQUEST_BYTES, REQUEST_SCHEMA_VERSION, RequestError, RolloutRequest


def valid(**over) -> dict:
    obj = {
        "schema_version": REQUEST_SCHEMA_VERSION,
        "request_id": "run1-0000042",
        "env": "calculator",
        "task": {"task_id": "t-7", "prompt": "2+3*4", "answer": "14"},
        "group_size": 4,
        "env_config": {"max_turns": 3},
    }
    obj.update(over)
    return obj


def enc(obj) -> bytes:
    return json.dumps(obj).encode()


def rejects(data: bytes, match: str | None = None):
    with pytest.raises(RequestError, match=match):
        RolloutRequest.from_bytes(data)


def test_round_trip():
    req = RolloutRequest(
        request_id="r-1",
        env="calculator",
        task={"prompt": "1+1", "nested": [1, {"a": None}]},
        group_size=8,
        env_config={"seed": 3},
    )
    data = req.to_bytes()
    assert json.loads(data)["schema_version"] == REQUEST_SCHEMA_VERSION
    back = RolloutRequest.from_bytes(data)
    assert back == req
    assert back.to_bytes() == data


def test_env_config_is_optional():
    obj = valid()
    del obj["env_config"]
    req = RolloutRequest.from_bytes(enc(obj))
    assert req.env_config == {} and req.group_size == 4 and req.task["prompt"] == "2+3*4"


def test_unicode_round_trip():
    req = RolloutRequest(request_id="r-ü", env="calc", task={"prompt": "√2 ≈ 1.414 🙂"}, group_size=1)
    assert RolloutRequest.from_bytes(req.to_bytes()) == req


@pytest.mark.parametrize(
    "data", [b"", b"not json", b"{", b"\xff\xfe\x00garbage", b"{'single': 'quotes'}", b"\x80\x81\x82", b'{"a": NaN']
)
def test_rejects_non_json(data):
    rejects(data, "not JSON")


@pytest.mark.parametrize("data", [b"[]", b"[1, 2]", b"42", b'"a string"', b"null", b"true"])
def test_rejects_non_object_json(data):
    rejects(data, "JSON object")


@pytest.mark.parametrize("version", [0, 2, "1", None, [1], {"v": 1}])
def test_rejects_wrong_schema_version(version):
    rejects(enc(valid(schema_version=version)), "schema_version")


def test_rejects_missing_schema_version():
    obj = valid()
    del obj["schema_version"]
    rejects(enc(obj), "schema_version")


def test_rejects_boolean_schema_version():
    """`true` == 1 in Python, but it is not schema version 1 (the record schema refuses bools too)."""
    rejects(enc(valid(schema_version=True)), "schema_version")


@pytest.mark.parametrize("field", ["request_id", "env", "task", "group_size"])
def test_rejects_missing_fields(field):
    obj = valid()
    del obj[field]
    rejects(enc(obj), f"missing.*{field}")


@pytest.mark.parametrize("field", ["priority", "Group_size", "", "schema"])
def test_rejects_unknown_fields(field):
    rejects(enc(valid(**{field: 1})), f"unknown.*{field}")


@pytest.mark.parametrize("group_size", [0, -1, "4", True, False, 4.0, None, [4], 2.5])
def test_rejects_bad_group_size(group_size):
    rejects(enc(valid(group_size=group_size)), "group_size")


@pytest.mark.parametrize(
    "over", [{"request_id": ""}, {"request_id": 7}, {"request_id": None}, {"env": 3}, {"env": None}, {"env": ""}]
)
def test_rejects_bad_ids(over):
    """request_id and env must be non-empty strings (the error message says so)."""
    rejects(enc(valid(**over)), "non-empty strings")


@pytest.mark.parametrize(
    "over",
    [{"task": []}, {"task": "prompt"}, {"task": None}, {"env_config": []}, {"env_config": None}, {"env_config": "x"}],
)
def test_rejects_non_object_task_or_config(over):
    rejects(enc(valid(**over)), "JSON objects")


def test_oversized_payload():
    obj = valid(task={"prompt": "x" * MAX_REQUEST_BYTES})
    rejects(enc(obj), "exceeds")
    # Right at the limit is still parsed.
    base = len(enc(valid(task={"prompt": ""})))
    at_limit = enc(valid(task={"prompt": "x" * (MAX_REQUEST_BYTES - base)}))
    assert len(at_limit) == MAX_REQUEST_BYTES
    assert RolloutRequest.from_bytes(at_limit).group_size == 4


@pytest.mark.parametrize("depth", [2_000, 30_000])
def test_deeply_nested_json_under_the_size_cap_is_a_request_error(depth):
    """A small (< 64 KB) but deeply nested payload must be dead-lettered like any other
    malformed request, not crash the DoFn with a RecursionError."""
    data = b"[" * depth + b"]" * depth
    assert len(data) <= MAX_REQUEST_BYTES
    rejects(data)


def test_deeply_nested_task_is_a_request_error():
    levels = 5_000
    data = (
        b'{"schema_version": 1, "request_id": "r", "env": "e", "group_size": 2, "task": '
        + b'{"a": ' * levels
        + b"1"
        + b"}" * levels
        + b"}"
    )
    assert len(data) <= MAX_REQUEST_BYTES
    rejects(data)


def _fuzz(data: bytes):
    try:
        req = RolloutRequest.from_bytes(data)
    except RequestError:
        return
    assert isinstance(req, RolloutRequest)
    assert type(req.group_size) is int and req.group_size >= 1
    assert isinstance(req.request_id, str) and req.request_id and isinstance(req.env, str)
    assert isinstance(req.task, dict) and isinstance(req.env_config, dict)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_only_raise_request_error(data):
    _fuzz(data)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["schema_version", "request_id", "env", "task", "group_size", "env_config", "extra"]),
        json_values | st.just(1) | st.just({}),
        max_size=7,
    )
)
def test_arbitrary_json_objects_only_raise_request_error(obj):
    _fuzz(enc(obj))


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["request_id", "env", "task", "group_size", "env_config"]), json_values, max_size=5)
)
def test_near_valid_requests_only_raise_request_error(over):
    _fuzz(enc(valid(**over)))
