"""Versioned packed-record schema: the contract between the rollout pipeline
(producer) and the learner (consumer). One record = one Pub/Sub message.

Wire format (no pickle, no eval):
    b"PKRC" | uint32 LE header length | JSON header | raw little-endian arrays
The arrays sit back to back in ARRAY_SPECS order; the header states each one's
dtype, offset (relative to the end of the header) and nbytes, and the decoder
insists on exactly that canonical layout, so a hostile message cannot point
anywhere odd or ask for more memory than its own length.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import numpy as np

from core.contracts.trajectory import token_digest

SCHEMA_VERSION = 1
# Messages on the records topic that are not records carry kind=<...> (records carry none).
KIND_ATTRIBUTE = "kind"
KIND_DROPPED = "dropped"  # trajectories deliberately not packed: attribute "trajectories" = count
MAGIC = b"PKRC"
MAX_MESSAGE_BYTES = 4_000_000  # the Pub/Sub emulator's streaming pull stalls above ~4.2 MB
MAX_HEADER_BYTES = 1 << 20
MAX_ELEMENTS = 16 * 1024 * 1024  # rows * seq_len
MAX_RECORD_ID_CHARS = 256  # ids travel as Pub/Sub attributes (1024-byte value limit)
_PREFIX = struct.Struct("<4sI")

# name -> wire dtype (explicit little-endian; equals the native dtype on x86/ARM hosts).
ARRAY_SPECS: dict[str, np.dtype] = {
    "tokens": np.dtype("<i4"),
    "segment_ids": np.dtype("<i4"),
    "positions": np.dtype("<i4"),
    "loss_mask": np.dtype("|u1"),
    "behaviour_logprobs": np.dtype("<f4"),
    "advantages": np.dtype("<f4"),
    "policy_versions": np.dtype("<i4"),
}
ARRAY_NAMES = tuple(ARRAY_SPECS)
_HEADER_KEYS = {"schema_version", "record_id", "rows", "seq_len", "arrays", "trajectories"}


class RecordError(ValueError):
    """A packed record is malformed, inconsistent or from another schema version."""


@dataclasses.dataclass(frozen=True)
class TrajectoryInfo:
    """One segment of one row: which trajectory it holds and how it ended."""

    trajectory_id: str
    row: int
    segment: int
    num_tokens: int
    reward: float
    status: str
    # token_digest of the tokens and loss mask as sampled; validate() checks the segment
    # against it ("" from producers before it existed: nothing to check).
    digest: str = ""

    def to_json(self) -> dict:
        return dict(vars(self))  # flat scalar fields: no need for asdict's deep copy

    @classmethod
    def from_json(cls, obj) -> TrajectoryInfo:
        if not isinstance(obj, dict) or set(obj) not in (_TRAJ_FIELDS, _TRAJ_FIELDS - {"digest"}):
            raise RecordError(f"trajectory entry must have exactly the TrajectoryInfo fields, got {obj!r:.200}")
        _check_traj_types(obj)
        return cls(**{**obj, "reward": float(obj["reward"])})


def _check_traj_types(obj: dict) -> None:
    for key in ("row", "segment", "num_tokens"):
        if type(obj[key]) is not int:  # bool is an int subclass: refuse it too
            raise RecordError(f"trajectory {key} must be an int, got {obj[key]!r:.50}")
    reward = obj["reward"]
    # An int too large for a float (JSON allows 10**400) must be refused, not overflow.
    if type(reward) not in (int, float) or (type(reward) is int and abs(reward) > 2**53) or not math.isfinite(reward):
        raise RecordError(f"trajectory reward must be a finite number, got {obj['reward']!r:.50}")
    if not isinstance(obj["trajectory_id"], str) or not obj["trajectory_id"]:
        raise RecordError(f"trajectory_id must be a non-empty str, got {obj['trajectory_id']!r:.50}")
    if not isinstance(obj["status"], str):
        raise RecordError(f"trajectory status must be a str, got {obj['status']!r:.50}")
    digest = obj.get("digest", "")
    if not isinstance(digest, str) or len(digest) > 64:
        raise RecordError(f"trajectory digest must be a str of at most 64 chars, got {digest!r:.80}")


_TRAJ_FIELDS = {f.name for f in dataclasses.fields(TrajectoryInfo)}


@dataclasses.dataclass(eq=False)  # array fields make dataclass __eq__ meaningless
class PackedRecord:
    record_id: str
    tokens: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    loss_mask: np.ndarray
    behaviour_logprobs: np.ndarray
    advantages: np.ndarray
    policy_versions: np.ndarray
    trajectories: list[TrajectoryInfo]

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAY_NAMES}

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)

    @property
    def num_tokens(self) -> int:
        return int(np.count_nonzero(self.segment_ids))

    @property
    def num_loss_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))

    @property
    def min_policy_version(self) -> int:
        gen = self.policy_versions[self.loss_mask == 1]
        return int(gen.min()) if gen.size else -1

    @property
    def max_policy_version(self) -> int:
        gen = self.policy_versions[self.loss_mask == 1]
        return int(gen.max()) if gen.size else -1

    def validate(self, expected_shape: tuple[int, int] | None = None) -> PackedRecord:
        """Checks every invariant of the schema; raises RecordError, returns self."""
        _validate(self, expected_shape)
        return self


def empty_record_arrays(rows: int, seq_len: int) -> dict[str, np.ndarray]:
    """All-padding arrays with the schema dtypes (policy_versions -1 = not generated)."""
    if rows <= 0 or seq_len <= 0 or rows * seq_len > MAX_ELEMENTS:
        raise RecordError(f"bad record shape ({rows}, {seq_len})")
    out = {name: np.zeros((rows, seq_len), dt.newbyteorder("=")) for name, dt in ARRAY_SPECS.items()}
    out["policy_versions"].fill(-1)
    return out


def _fail(msg: str):
    raise RecordError(msg)


def _validate(rec: PackedRecord, expected_shape) -> None:
    if not isinstance(rec.record_id, str) or not 0 < len(rec.record_id) <= MAX_RECORD_ID_CHARS:
        _fail(f"record_id must be a non-empty str of at most {MAX_RECORD_ID_CHARS} chars")
    arrays = rec.arrays()
    for name, arr in arrays.items():
        if not isinstance(arr, np.ndarray):
            _fail(f"{name} must be a numpy array, got {type(arr).__name__}")
        if arr.dtype != ARRAY_SPECS[name]:
            _fail(f"{name} dtype mismatch: got {arr.dtype.str}, expected {ARRAY_SPECS[name].str}")
        if arr.ndim != 2:
            _fail(f"{name} must be 2-D [rows, seq_len], got shape {arr.shape}")
    shape = rec.tokens.shape
    for name, arr in arrays.items():
        if arr.shape != shape:
            _fail(f"{name} shape {arr.shape} != tokens shape {shape}")
    if expected_shape is not None and tuple(shape) != tuple(expected_shape):
        _fail(f"shape mismatch: got {tuple(shape)}, expected {tuple(expected_shape)}")
    rows, seq_len = shape
    if rows == 0 or seq_len == 0 or rows * seq_len > MAX_ELEMENTS:
        _fail(f"bad record shape {shape}")

    seg, pos, mask = rec.segment_ids, rec.positions, rec.loss_mask
    if (rec.tokens < 0).any():
        _fail("tokens must be >= 0")
    if (seg < 0).any():
        _fail("segment_ids must be >= 0")
    pad = seg == 0
    if (pos[pad] != 0).any():
        _fail("positions must be 0 on padding")
    # A segment run starts where the id changes; positions count 0,1,2,... along a run.
    starts = np.ones_like(pad)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    run_start = starts & ~pad
    if (pos[run_start] != 0).any():
        _fail("positions must restart at 0 at the start of each segment")
    cont = ~starts[:, 1:] & ~pad[:, 1:]
    if (pos[:, 1:][cont] != pos[:, :-1][cont] + 1).any():
        _fail("positions must be consecutive (0,1,2,...) within each segment")
    # Each row holds segments 1..k, each one contiguous run.
    runs_per_row = run_start.sum(axis=1)
    if (runs_per_row != seg.max(axis=1)).any():
        _fail("segment ids in each row must be 1..k with each segment contiguous")
    if ((mask != 0) & (mask != 1)).any():
        _fail("loss_mask values must be 0 or 1")
    if (mask[pad] != 0).any():
        _fail("loss_mask must be 0 on padding")
    off = mask == 0
    for name in ("behaviour_logprobs", "advantages"):
        arr = arrays[name]
        if not np.isfinite(arr).all():
            _fail(f"{name} contains non-finite values (NaN/inf)")
        if (arr[off] != 0).any():
            _fail(f"{name} must be 0 where loss_mask is 0")
    pv = rec.policy_versions
    if (pv[~off] < 0).any():
        _fail("policy_versions must be >= 0 where loss_mask is 1")
    if (pv[off] != -1).any():
        _fail("policy_versions must be -1 where loss_mask is 0")
    _validate_trajectories(rec.trajectories, seg, run_start, rows, arrays)


def _validate_trajectories(trajs, seg, run_start, rows, rec_arrays) -> None:
    if not isinstance(trajs, list) or not all(isinstance(t, TrajectoryInfo) for t in trajs):
        _fail("trajectories must be a list of TrajectoryInfo")
    if len(trajs) != int(run_start.sum()):
        _fail(f"{len(trajs)} trajectories listed but {int(run_start.sum())} segments present")
    r, c = np.nonzero(seg)  # segments are known to be contiguous here: count tokens per (row, id)
    keys, lengths = np.unique(r.astype(np.int64) * (1 << 32) + seg[r, c], return_counts=True)
    length_of = dict(zip(keys.tolist(), lengths.tolist()))
    seen = set()
    for t in trajs:  # one per segment, not per token
        _check_traj_types(vars(t))
        key = t.row * (1 << 32) + t.segment if 0 <= t.row < rows and t.segment > 0 else None
        if key not in length_of:
            _fail(f"trajectory {t.trajectory_id!r:.80} points at row {t.row} segment {t.segment}, not present")
        if key in seen:
            _fail(f"two trajectories claim row {t.row} segment {t.segment}")
        seen.add(key)
        if t.num_tokens != length_of[key]:
            _fail(f"trajectory {t.trajectory_id!r:.80} num_tokens {t.num_tokens} != segment length {length_of[key]}")
    for t in trajs:
        if t.digest and not digest_matches(rec_arrays, t):
            _fail(f"trajectory {t.trajectory_id!r:.80}: tokens or loss mask differ from what was sampled (digest)")


def segment_of(arrays, info: TrajectoryInfo, name: str) -> np.ndarray:
    """One trajectory's slice of a [rows, seq_len] array (its segment is contiguous)."""
    cols = np.flatnonzero(arrays["segment_ids"][info.row] == info.segment)
    return arrays[name][info.row, cols[0] : cols[-1] + 1]


def digest_matches(arrays, info: TrajectoryInfo) -> bool:
    """Whether the record's tokens and loss mask for `info` are exactly what was sampled."""
    return token_digest(segment_of(arrays, info, "tokens"), segment_of(arrays, info, "loss_mask")) == info.digest


def encode(record: PackedRecord) -> bytes:
    """Validates and serialises one record; raises RecordError if over MAX_MESSAGE_BYTES."""
    record.validate()
    rows, seq_len = record.shape
    specs, offset = {}, 0
    for name, dt in ARRAY_SPECS.items():
        nbytes = rows * seq_len * dt.itemsize
        specs[name] = {"dtype": dt.str, "offset": offset, "nbytes": nbytes}
        offset += nbytes
    header = json.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "record_id": record.record_id,
            "rows": rows,
            "seq_len": seq_len,
            "arrays": specs,
            "trajectories": [t.to_json() for t in record.trajectories],
        },
        separators=(",", ":"),
        allow_nan=False,
    ).encode()
    if len(header) > MAX_HEADER_BYTES:
        _fail(f"header is {len(header)} bytes, over the {MAX_HEADER_BYTES} cap")
    total = _PREFIX.size + len(header) + offset
    if total > MAX_MESSAGE_BYTES:
        _fail(f"encoded record is {total} bytes, over MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    parts = [_PREFIX.pack(MAGIC, len(header)), header]
    parts += [np.ascontiguousarray(getattr(record, n), dtype=dt).tobytes() for n, dt in ARRAY_SPECS.items()]
    return b"".join(parts)


def _reject_constant(name):
    raise RecordError(f"header contains {name}, not valid JSON here")


def _parse_header(data: memoryview) -> tuple[dict, int]:
    if len(data) < _PREFIX.size:
        _fail(f"truncated record: {len(data)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, hlen = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        _fail(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if hlen > MAX_HEADER_BYTES:
        _fail(f"header length {hlen} is over the {MAX_HEADER_BYTES} cap")
    end = _PREFIX.size + hlen
    if len(data) < end:
        _fail(f"truncated record: header needs {hlen} bytes, only {len(data) - _PREFIX.size} present")
    try:
        header = json.loads(bytes(data[_PREFIX.size : end]), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # includes JSONDecodeError, UnicodeDecodeError
        raise RecordError(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        _fail("header must be a JSON object")
    return header, end


def decode(data: bytes, expected_shape: tuple[int, int] | None = None) -> PackedRecord:
    """Strictly parses and validates one record; anything wrong raises RecordError."""
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise RecordError(f"expected bytes, got {type(data).__name__}") from None
    if len(view) > MAX_MESSAGE_BYTES:  # no encoder makes one: refuse before parsing any of it
        _fail(f"message is {len(view)} bytes, over MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    header, body_start = _parse_header(view)
    version = header.get("schema_version")
    if version != SCHEMA_VERSION or type(version) is not int:
        _fail(f"unsupported schema_version: got {version!r:.50}, expected {SCHEMA_VERSION}")
    if set(header) != _HEADER_KEYS:
        _fail(f"header keys {sorted(header)!r:.300} != expected {sorted(_HEADER_KEYS)}")
    rows, seq_len = header["rows"], header["seq_len"]
    if type(rows) is not int or type(seq_len) is not int or rows <= 0 or seq_len <= 0:
        _fail(f"rows/seq_len must be positive ints, got {rows!r:.50}/{seq_len!r:.50}")
    if rows * seq_len > MAX_ELEMENTS:
        _fail(f"rows*seq_len = {rows * seq_len} is over the {MAX_ELEMENTS} element cap")
    if expected_shape is not None and (rows, seq_len) != tuple(expected_shape):
        _fail(f"shape mismatch: got {(rows, seq_len)}, expected {tuple(expected_shape)}")
    specs = header["arrays"]
    if not isinstance(specs, dict) or set(specs) != set(ARRAY_NAMES):
        names = sorted(specs) if isinstance(specs, dict) else specs
        _fail(f"arrays {names!r:.300} != expected {sorted(ARRAY_NAMES)} (unknown or missing)")
    body = view[body_start:]
    arrays, offset = {}, 0
    for name, dt in ARRAY_SPECS.items():
        spec = specs[name]
        if not isinstance(spec, dict) or set(spec) != {"dtype", "offset", "nbytes"}:
            _fail(f"array {name}: spec must have exactly dtype/offset/nbytes")
        if spec["dtype"] != dt.str:
            _fail(f"array {name}: dtype mismatch, got {spec['dtype']!r:.30}, expected {dt.str!r}")
        nbytes = rows * seq_len * dt.itemsize
        if spec["nbytes"] != nbytes or type(spec["nbytes"]) is not int:
            _fail(f"array {name}: wrong byte size, got {spec['nbytes']!r:.30}, expected {nbytes}")
        if spec["offset"] != offset or type(spec["offset"]) is not int:
            _fail(f"array {name}: offset {spec['offset']!r:.30} != canonical {offset}")
        if offset + nbytes > len(body):
            _fail(f"truncated record: array {name} needs bytes [{offset}, {offset + nbytes}), body has {len(body)}")
        # Copy out of the message buffer: owned, writable, native-order arrays.
        arr = np.frombuffer(body, dtype=dt, count=rows * seq_len, offset=offset)
        arrays[name] = arr.astype(dt.newbyteorder("="), copy=True).reshape(rows, seq_len)
        offset += nbytes
    if len(body) != offset:
        _fail(f"record has {len(body) - offset} trailing bytes after the arrays")
    if not isinstance(header["record_id"], str):
        _fail("record_id must be a str")
    trajs = header["trajectories"]
    if not isinstance(trajs, list):
        _fail("trajectories must be a list")
    record = PackedRecord(
        record_id=header["record_id"], trajectories=[TrajectoryInfo.from_json(t) for t in trajs], **arrays
    )
    return record.validate()


def attributes(record: PackedRecord) -> dict[str, str]:
    """Pub/Sub message attributes (all str) so consumers can filter before decoding."""
    rows, seq_len = record.shape
    return {
        "schema_version": str(SCHEMA_VERSION),
        "record_id": record.record_id,
        "rows": str(rows),
        "seq_len": str(seq_len),
        "min_policy_version": str(record.min_policy_version),
        "max_policy_version": str(record.max_policy_version),
        "num_tokens": str(record.num_tokens),
        "num_loss_tokens": str(record.num_loss_tokens),
        "num_segments": str(len(record.trajectories)),
    }
