"""Real tests against the real Pub/Sub emulator (no mocks)."""

from __future__ import annotations

import os
import socket
import time

import psutil
import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from core.contracts import pubsub_io
from localstack.emulators.pubsub import (
    DEFAULT_PROJECT,
    EmulatorStartError,
    EmulatorUnavailable,
    PubSubEmulator,
)


@pytest.fixture
def clients(pubsub_emulator):
    publisher = pubsub_io.publisher_client()  # via the env the session fixture set
    subscriber = pubsub_io.subscriber_client()
    yield publisher, subscriber
    publisher.stop()
    publisher.transport.close()
    subscriber.close()


@pytest.fixture
def topic_and_sub(pubsub_emulator, unique_name):
    topic = pubsub_emulator.create_topic(unique_name("topic"))
    sub = pubsub_emulator.create_subscription(unique_name("sub"), topic)
    return topic, sub


def _gone_or_zombie(pids, timeout_s=10.0) -> list[int]:
    """Pids still really running after timeout_s (a zombie holds no port or memory)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_session_env_points_at_emulator(pubsub_emulator):
    assert os.environ["PUBSUB_EMULATOR_HOST"] == pubsub_emulator.host
    assert os.environ["PUBSUB_PROJECT_ID"] == pubsub_emulator.project == DEFAULT_PROJECT
    assert pubsub_emulator.env() == {
        "PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
        "PUBSUB_PROJECT_ID": DEFAULT_PROJECT,
    }
    assert pubsub_emulator.host.startswith("127.0.0.1:")


def test_create_is_idempotent_and_paths_match(pubsub_emulator, unique_name):
    name, sub_name = unique_name("topic"), unique_name("sub")
    topic = pubsub_emulator.create_topic(name)
    assert pubsub_emulator.create_topic(name) == topic
    assert topic == f"projects/{DEFAULT_PROJECT}/topics/{name}"
    sub = pubsub_emulator.create_subscription(sub_name, name)
    assert pubsub_emulator.create_subscription(sub_name, topic) == sub
    assert sub == f"projects/{DEFAULT_PROJECT}/subscriptions/{sub_name}"
    with pytest.raises(ValueError, match="3 characters"):
        pubsub_emulator.create_topic("ab")


def test_publish_pull_round_trip_with_attributes(clients, topic_and_sub):
    publisher, subscriber = clients
    topic, sub = topic_and_sub
    sent = {f"payload-{i}".encode(): {"record_id": str(i), "schema": "v1"} for i in range(5)}
    for data, attrs in sent.items():
        assert pubsub_io.publish(publisher, topic, data, **attrs).result(timeout=30)

    got = {}
    deadline = time.monotonic() + 30
    while len(got) < len(sent) and time.monotonic() < deadline:
        msgs = pubsub_io.pull(subscriber, sub, max_messages=10, timeout_s=5)
        got.update({m.message.data: dict(m.message.attributes) for m in msgs})
        pubsub_io.ack(subscriber, sub, [m.ack_id for m in msgs])
    assert got == sent
    assert pubsub_io.pull(subscriber, sub, max_messages=10, timeout_s=1) == []


def test_publish_refuses_non_str_attributes(clients, topic_and_sub):
    publisher, _ = clients
    with pytest.raises(TypeError, match="str"):
        pubsub_io.publish(publisher, topic_and_sub[0], b"x", version=3)
    with pytest.raises(TypeError, match="bytes"):
        pubsub_io.publish(publisher, topic_and_sub[0], "not bytes")


def test_large_message_needs_unlimited_channel(pubsub_emulator, clients, unique_name):
    publisher, subscriber = clients
    topic = pubsub_emulator.create_topic(unique_name("big"))
    ours = pubsub_emulator.create_subscription(unique_name("big-ours"), topic)
    plain = pubsub_emulator.create_subscription(unique_name("big-plain"), topic)
    payload = os.urandom(6 * 1024 * 1024)
    pubsub_io.publish(publisher, topic, payload, kind="big").result(timeout=60)

    msgs = pubsub_io.pull(subscriber, ours, max_messages=1, timeout_s=30)
    assert len(msgs) == 1 and msgs[0].message.data == payload
    assert msgs[0].message.attributes["kind"] == "big"
    pubsub_io.ack(subscriber, ours, [msgs[0].ack_id])

    # The stock emulator client keeps gRPC's 4 MiB receive limit (observed: 429
    # "Received message larger than max (… vs. 4194304)").
    default = pubsub_v1.SubscriberClient()
    try:
        with pytest.raises(gexc.ResourceExhausted, match="larger than max"):
            default.pull(request={"subscription": plain, "max_messages": 1}, timeout=30)
    finally:
        default.close()


def test_pull_on_empty_subscription_returns_empty_quickly(clients, topic_and_sub):
    _, subscriber = clients
    start = time.monotonic()
    assert pubsub_io.pull(subscriber, topic_and_sub[1], max_messages=10, timeout_s=1.0) == []
    assert time.monotonic() - start < 5.0
    pubsub_io.ack(subscriber, topic_and_sub[1], [])  # empty ack is a no-op, not an error


@pytest.mark.e2e
def test_body_raising_leaves_no_process(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with PubSubEmulator(log_dir=tmp_path) as emu:
            leader = psutil.Process(emu.pid)
            children = leader.children(recursive=True)
            assert any("java" in c.name() for c in children), children
            pids = [leader.pid] + [c.pid for c in children]
            host = emu.host
            raise RuntimeError("boom")
    assert _gone_or_zombie(pids) == []
    assert emu.pid is None
    # The port is released: nothing answers there any more.
    with pytest.raises(gexc.GoogleAPICallError):
        sub = pubsub_io.subscriber_client(host)
        try:
            project = f"projects/{DEFAULT_PROJECT}"
            sub.list_subscriptions(request={"project": project}, timeout=2, retry=None)
        finally:
            sub.close()


@pytest.mark.e2e
def test_taken_port_fails_fast_and_leaves_no_process(tmp_path):
    # On a bind failure java logs a BindException but keeps running; the harness must
    # notice it in the log rather than wait for the startup timeout (or, worse, take
    # whoever holds the port for its own emulator).
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        emu = PubSubEmulator(log_dir=tmp_path, port=port, startup_timeout_s=60)
        start = time.monotonic()
        with pytest.raises(EmulatorStartError, match=r"BindException|already in use"):
            emu.start()
    assert time.monotonic() - start < 30
    assert emu.pid is None
    ours = [p.pid for p in psutil.process_iter(["cmdline"]) if f"--port={port}" in " ".join(p.info["cmdline"] or [])]
    assert _gone_or_zombie(ours) == []


@pytest.mark.e2e
def test_env_is_restored_after_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "sentinel:1")
    monkeypatch.delenv("PUBSUB_PROJECT_ID", raising=False)
    with PubSubEmulator(log_dir=tmp_path, project="other-project-1") as emu:
        emu.apply_env()
        assert os.environ["PUBSUB_EMULATOR_HOST"] == emu.host
        assert os.environ["PUBSUB_PROJECT_ID"] == "other-project-1"
    assert os.environ["PUBSUB_EMULATOR_HOST"] == "sentinel:1"
    assert "PUBSUB_PROJECT_ID" not in os.environ


def test_missing_gcloud_names_what_to_install(tmp_path):
    emu = PubSubEmulator(log_dir=tmp_path, gcloud_bin=str(tmp_path / "no" / "gcloud"))
    with pytest.raises(EmulatorUnavailable) as err:
        emu.start()
    msg = str(err.value)
    assert "gcloud" in msg and "google-cloud-cli-pubsub-emulator" in msg
    assert "gcloud components install beta pubsub-emulator" in msg
    assert emu.pid is None


def test_gcloud_not_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no gcloud, no java
    with pytest.raises(EmulatorUnavailable, match="apt-get install google-cloud-cli"):
        PubSubEmulator(log_dir=tmp_path).start()


def test_missing_java_names_what_to_install(tmp_path, monkeypatch):
    gcloud = tmp_path / "gcloud"
    gcloud.write_text("#!/bin/sh\nexit 1\n")
    gcloud.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmulatorUnavailable, match="java") as err:
        PubSubEmulator(log_dir=tmp_path, gcloud_bin=str(gcloud)).start()
    assert "openjdk-17-jre-headless" in str(err.value)
