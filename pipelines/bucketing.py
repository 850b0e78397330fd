"""Length buckets: which record shape a trajectory goes to, and what happens when it
fits none (pure functions; the Beam steps in pack_transform.py only call these).

A trajectory goes to the smallest bucket that holds it, so short episodes are not
padded up to the longest sequence length. One longer than the largest bucket is cut to
it (a consistent prefix: tokens, loss mask, log-probs and versions cut at the same
place) or dropped, as configured; either way the caller counts it.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

from core.contracts.trajectory import Trajectory
from environments import EpisodeStatus

OVERLONG_POLICIES = ("truncate", "drop")
# Outcomes of fit_to_buckets, one counter each downstream.
FITS, TRUNCATED, DROPPED_OVERLONG, DROPPED_EMPTY = "fits", "truncated", "dropped_overlong", "dropped_empty"


def choose_bucket(length: int, seq_lens: Sequence[int]) -> int | None:
    """Index of the smallest bucket (seq_lens sorted ascending) that holds `length`
    tokens, or None when even the largest is too short."""
    i = bisect.bisect_left(seq_lens, length)
    return i if i < len(seq_lens) else None


def truncate(t: Trajectory, max_tokens: int) -> Trajectory:
    """The first `max_tokens` tokens of `t`, every per-token array cut at the same place,
    status "truncated". Reward and advantage are kept: they were computed for the whole
    group, and the cut tokens simply take no part in the loss."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if len(t) <= max_tokens:
        return t
    return dataclasses.replace(
        t,
        tokens=t.tokens[:max_tokens].copy(),
        loss_mask=t.loss_mask[:max_tokens].copy(),
        behaviour_logprobs=t.behaviour_logprobs[:max_tokens].copy(),
        policy_versions=t.policy_versions[:max_tokens].copy(),
        status=EpisodeStatus.TRUNCATED.value,
    )


@dataclasses.dataclass(frozen=True)
class BucketFit:
    outcome: str  # FITS | TRUNCATED | DROPPED_OVERLONG | DROPPED_EMPTY
    bucket: int | None = None  # index into seq_lens; None when dropped
    trajectory: Trajectory | None = None  # the (possibly truncated) trajectory to pack


def fit_to_buckets(t: Trajectory, seq_lens: Sequence[int], overlong: str) -> BucketFit:
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
    if len(t) == 0:  # a zero-length segment cannot be represented in a record
        return BucketFit(DROPPED_EMPTY)
    bucket = choose_bucket(len(t), seq_lens)
    if bucket is not None:
        return BucketFit(FITS, bucket, t)
    if overlong == "drop":
        return BucketFit(DROPPED_OVERLONG)
    return BucketFit(TRUNCATED, len(seq_lens) - 1, truncate(t, seq_lens[-1]))


def content_hash(t: Trajectory) -> str:
    """Hash of what the learner would train on (token ids + loss mask), for catching the
    same episode arriving under another id. Lengths are equal, so the concatenation is
    unambiguous."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(t.tokens, dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(t.loss_mask, dtype="u1").tobytes())
    return h.hexdigest()
