"""Small Pub/Sub client helpers shared by the learner, the feeder and the local stack.

Why this module exists: with ``PUBSUB_EMULATOR_HOST`` set, the stock clients build a
plain ``grpc.insecure_channel(host)`` whose receive limit is gRPC's default 4 MiB.
The emulator ignores streaming-pull flow control and answers with ~10 MB responses,
so the stock subscriber fails with "Received message larger than max". Here the
emulator channel is built with unlimited message sizes. Against real Pub/Sub the
generated transport already uses unlimited sizes, so the default client is kept.

Import rule: nothing from ``pipelines`` or ``localstack`` may be imported here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import google.auth.exceptions
import grpc
from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports.grpc import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports.grpc import SubscriberGrpcTransport

EMULATOR_ENV = "PUBSUB_EMULATOR_HOST"
PROJECT_ENV = "PUBSUB_PROJECT_ID"

# -1 = unlimited. http_proxy off: a proxy from the environment must never see loopback.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.enable_http_proxy", 0),
)

# Pull retries only on transient server errors (as the generated default does),
# never on DeadlineExceeded: that is the emulator's answer for "nothing to pull".
_PULL_RETRYABLE = gretry.if_exception_type(
    gexc.Aborted, gexc.InternalServerError, gexc.ServiceUnavailable, gexc.Unknown
)


# Errors that retrying cannot fix: a wrong name, a missing grant, a malformed request, bad
# credentials. Everything else from the API (Unavailable, InternalServerError, Aborted,
# ResourceExhausted, Unknown, DeadlineExceeded, a refused connection) is transient.
PERMANENT = (gexc.NotFound, gexc.PermissionDenied, gexc.InvalidArgument, gexc.Unauthenticated)


class PermanentError(RuntimeError):
    """A Pub/Sub call failed in a way no retry fixes; the message names the resource."""


def permanent_error(err: BaseException, resource: str) -> PermanentError | None:
    """`err` as a PermanentError naming `resource` (e.g. "subscription projects/p/subscriptions/s"),
    or None when it is transient (retry it). A RetryError is judged by its cause."""
    cause = err.cause if isinstance(err, gexc.RetryError) and err.cause is not None else err
    if not isinstance(cause, PERMANENT):
        return None
    message = getattr(cause, "message", None) or str(cause)
    return PermanentError(f"Pub/Sub {resource}: {type(cause).__name__}: {message} (permanent: not retried)")


def preflight(subscriber=None, publisher=None, *, subscriptions=(), topics=(), timeout_s: float = 10.0) -> list[str]:
    """Checks at start-up that each subscription and topic exists: a wrong name raises
    PermanentError now instead of at first use. Least-privilege identities (subscriber or
    publisher roles only) may not hold `*.get`: a PermissionDenied there cannot tell a
    missing resource from a missing grant, so it is returned as a note and first use decides.
    """
    notes: list[str] = []
    checks = [("subscription", s, subscriber) for s in subscriptions] + [("topic", t, publisher) for t in topics]
    for kind, path, client in checks:
        try:  # the client too: it looks for credentials as it is made
            client = client or (subscriber_client() if kind == "subscription" else publisher_client())
            getattr(client, f"get_{kind}")(request={kind: path}, timeout=timeout_s)
        except gexc.PermissionDenied as e:
            notes.append(f"{kind} {path}: cannot check ({e.message}); its first use will")
        except google.auth.exceptions.GoogleAuthError as e:  # no credentials at all: nothing will work
            raise PermanentError(f"Pub/Sub {kind} {path}: no credentials: {e}") from None
        except (gexc.GoogleAPICallError, gexc.RetryError) as e:
            if (perm := permanent_error(e, f"{kind} {path}")) is not None:
                raise perm from None
            notes.append(f"{kind} {path}: cannot check now ({type(e).__name__}); its first use will")
    return notes


def emulator_host(host: str | None = None) -> str | None:
    """The emulator host to use: the explicit one, else ``$PUBSUB_EMULATOR_HOST``."""
    return host or os.environ.get(EMULATOR_ENV) or None


def emulator_channel(host: str) -> grpc.Channel:
    """An insecure gRPC channel to the emulator with unlimited message sizes."""
    return grpc.insecure_channel(host, options=list(CHANNEL_OPTIONS))


def subscriber_client(host: str | None = None) -> pubsub_v1.SubscriberClient:
    """A SubscriberClient that can receive messages and responses over 4 MiB.

    ``host`` overrides ``$PUBSUB_EMULATOR_HOST``; with neither, this is the normal
    client for real Pub/Sub (whose transport already has unlimited sizes).
    """
    target = emulator_host(host)
    if not target:
        return pubsub_v1.SubscriberClient()
    transport = SubscriberGrpcTransport(host=target, channel=emulator_channel(target))
    return pubsub_v1.SubscriberClient(transport=transport)


def publisher_client(host: str | None = None, batch_settings: Any = None) -> pubsub_v1.PublisherClient:
    """A PublisherClient, emulator-aware like :func:`subscriber_client`."""
    kwargs: dict[str, Any] = {}
    if batch_settings is not None:
        kwargs["batch_settings"] = batch_settings
    target = emulator_host(host)
    if not target:
        return pubsub_v1.PublisherClient(**kwargs)
    transport = PublisherGrpcTransport(host=target, channel=emulator_channel(target))
    return pubsub_v1.PublisherClient(transport=transport, **kwargs)


def pull(
    subscriber: pubsub_v1.SubscriberClient,
    subscription: str,
    max_messages: int,
    timeout_s: float = 5.0,
) -> list[Any]:
    """Unary pull of up to ``max_messages`` ReceivedMessages; ``[]`` when none arrive.

    The emulator answers an empty subscription with DeadlineExceeded after
    ``timeout_s``; real Pub/Sub may answer with an empty list. Both become ``[]``.
    """
    if max_messages <= 0:
        return []
    try:
        response = subscriber.pull(
            request={"subscription": subscription, "max_messages": int(max_messages)},
            timeout=timeout_s,
            retry=gretry.Retry(predicate=_PULL_RETRYABLE, timeout=timeout_s),
        )
    except gexc.DeadlineExceeded:
        return []
    except gexc.RetryError as err:  # retry budget spent on transient errors
        if isinstance(err.cause, gexc.DeadlineExceeded):
            return []
        raise
    return list(response.received_messages)


def ack(subscriber: pubsub_v1.SubscriberClient, subscription: str, ack_ids: Sequence[str]) -> None:
    """Acknowledge ``ack_ids``; a no-op for an empty sequence (the API refuses it)."""
    for chunk in _chunks(ack_ids):
        subscriber.acknowledge(request={"subscription": subscription, "ack_ids": chunk})


def modify_ack_deadline(
    subscriber: pubsub_v1.SubscriberClient, subscription: str, ack_ids: Sequence[str], seconds: int
) -> None:
    """Extend (or, with 0, give up: a nack) the ack deadline of ``ack_ids``, in chunks the
    API accepts; a no-op for an empty sequence."""
    for chunk in _chunks(ack_ids):
        subscriber.modify_ack_deadline(
            request={"subscription": subscription, "ack_ids": chunk, "ack_deadline_seconds": int(seconds)}
        )


def _chunks(ack_ids: Sequence[str], size: int = 1000) -> list[list[str]]:
    """Requests of at most `size` ack ids (the API's limit is per request)."""
    ids = list(ack_ids)
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def publish(publisher: pubsub_v1.PublisherClient, topic: str, data: bytes, **attributes: str):
    """Publish one message; returns the future (``.result()`` gives the message id).

    Attributes must be str -> str: Pub/Sub would reject anything else later, less
    clearly, so refuse it here.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    bad = {k: type(v).__name__ for k, v in attributes.items() if not isinstance(v, str)}
    if bad:
        raise TypeError(f"attribute values must be str, got {bad}")
    return publisher.publish(topic, bytes(data), **attributes)
