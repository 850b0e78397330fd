"""Permanent errors fail fast, naming the resource; transient ones are retried.
One test per row of docs/RELIABILITY.md's "Errors from Pub/Sub and GCS" table, against the
real Pub/Sub emulator and gcp-storage-emulator. PermissionDenied and Unauthenticated cannot
be provoked from an emulator (neither checks credentials): their rows are covered by the
classifier test, which uses the same function every call site goes through."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc

from core.contracts import pubsub_io
from core.contracts.store import PolicyStore, StoreAccessError, StoreError
from localstack.emulators import gcs as gcs_emulator
from tests import _commands as commands
from trainer.learning.data.consumer import RecordConsumer
from trainer.learning.data.feeder import Feeder

REPO = Path(__file__).resolve().parents[1]
FAIL_FAST_S = 10.0  # the bound, from the first use (or the start-up check) to the error


@pytest.mark.parametrize(
    "err, permanent",
    [
        (gexc.NotFound("x"), True),
        (gexc.PermissionDenied("x"), True),
        (gexc.InvalidArgument("x"), True),
        (gexc.Unauthenticated("x"), True),
        (gexc.RetryError("spent", cause=gexc.NotFound("x")), True),
        (gexc.ServiceUnavailable("x"), False),
        (gexc.InternalServerError("x"), False),
        (gexc.Aborted("x"), False),
        (gexc.ResourceExhausted("x"), False),
        (gexc.DeadlineExceeded("x"), False),
        (gexc.Unknown("x"), False),
        (gexc.RetryError("spent", cause=gexc.ServiceUnavailable("x")), False),
        (TimeoutError(), False),
    ],
)
def test_the_classifier_splits_permanent_from_transient(err, permanent):
    got = pubsub_io.permanent_error(err, "topic projects/p/topics/t")
    assert (got is not None) == permanent
    if permanent:
        assert "topic projects/p/topics/t" in str(got) and "not retried" in str(got)


def test_start_up_check_names_a_missing_subscription_and_topic(pubsub_emulator, unique_name):
    topic = pubsub_emulator.create_topic(unique_name("t"))
    sub = pubsub_emulator.create_subscription(unique_name("s"), topic)
    assert pubsub_io.preflight(subscriptions=[sub], topics=[topic]) == []  # both exist: silent
    wrong_sub, wrong_topic = pubsub_emulator.subscription_path("nope-sub"), pubsub_emulator.topic_path("nope-topic")
    for kwargs, name in (({"subscriptions": [wrong_sub]}, wrong_sub), ({"topics": [topic, wrong_topic]}, wrong_topic)):
        t0 = time.monotonic()
        with pytest.raises(pubsub_io.PermanentError, match=f"{name}: NotFound"):
            pubsub_io.preflight(**kwargs)
        assert time.monotonic() - t0 < FAIL_FAST_S


def test_a_malformed_name_is_invalid_argument(pubsub_emulator):
    bad = f"projects/{pubsub_emulator.project}/subscriptions/no spaces allowed"
    with pytest.raises(pubsub_io.PermanentError, match="InvalidArgument"):
        pubsub_io.preflight(subscriptions=[bad])


def test_no_credentials_at_all_is_permanent(monkeypatch, tmp_path):
    """Real Pub/Sub (no emulator) and nowhere to find credentials: the start-up check stops."""
    monkeypatch.delenv(pubsub_io.EMULATOR_ENV, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    with pytest.raises(pubsub_io.PermanentError, match="no credentials"):
        pubsub_io.preflight(subscriptions=["projects/p/subscriptions/s"])


def test_first_pull_from_a_missing_subscription_raises_at_once(pubsub_emulator):
    wrong = pubsub_emulator.subscription_path("missing-records")
    consumer = RecordConsumer(wrong, {(2, 256)})
    t0 = time.monotonic()
    with pytest.raises(pubsub_io.PermanentError, match="missing-records"):
        consumer.poll(timeout_s=1.0)
    assert time.monotonic() - t0 < FAIL_FAST_S
    assert consumer.pubsub_errors == 0  # not counted as a retried failure


def test_the_feeder_stops_on_a_missing_topic_instead_of_retrying(pubsub_emulator):
    from environments import make_tasks
    from trainer.learning.data.feeder import TrajectoryCredits

    wrong = pubsub_emulator.topic_path("missing-requests")
    tasks = make_tasks("calculator", 0, 100, "train")
    feeder = Feeder(wrong, tasks, TrajectoryCredits(8), group_size=2, env="calculator")
    t0 = time.monotonic()
    feeder.start()
    feeder.join(timeout=FAIL_FAST_S)
    try:
        assert not feeder.is_alive()
        assert isinstance(feeder.error, pubsub_io.PermanentError) and "missing-requests" in str(feeder.error)
        assert feeder.publish_errors == 0 and time.monotonic() - t0 < FAIL_FAST_S
    finally:
        feeder.stop()


def test_a_transient_outage_is_retried_not_fatal(pubsub_emulator, unique_name):
    """A refused connection (nothing listens on the port): pulls come back empty and are
    counted, no PermanentError; the consumer goes on when Pub/Sub is back."""
    topic = pubsub_emulator.create_topic(unique_name("t"))
    sub = pubsub_emulator.create_subscription(unique_name("s"), topic)
    consumer = RecordConsumer(sub, {(2, 256)})
    consumer.subscriber = pubsub_io.subscriber_client(host="127.0.0.1:9")  # discard port: refused
    assert consumer.poll(timeout_s=0.5) == [] and consumer.pubsub_errors == 1
    consumer.subscriber = pubsub_io.subscriber_client()
    assert consumer.poll(timeout_s=0.5) == [] and consumer.pubsub_errors == 1


def _run_until_exit(cmd: list[str], env: dict, timeout_s: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - t0


def _seconds_from_start_to_error(log: str) -> float:
    """From the process's first log line to its "stopped"/traceback line (imports excluded:
    JAX and Beam take longer than the bound to import on a loaded 2-core machine)."""
    import re

    stamps = [time.mktime(time.strptime(m, "%Y-%m-%d %H:%M:%S")) for m in re.findall(r"^(\S+ \S+),\d+ ", log, re.M)]
    assert len(stamps) >= 2, f"too few log lines to time:\n{log[-2000:]}"
    return stamps[-1] - stamps[0]


@pytest.mark.parametrize("which", ["records_subscription", "requests_topic"])
def test_the_learner_exits_naming_a_wrong_name(pubsub_emulator, unique_name, tmp_path, which):
    topic = pubsub_emulator.create_topic(unique_name("req"))
    rec_topic = pubsub_emulator.create_topic(unique_name("rec"))
    names = {
        "requests_topic": topic,
        "records_subscription": pubsub_emulator.create_subscription(unique_name("rec"), rec_topic),
    }
    names[which] = names[which].rsplit("/", 1)[0] + "/misspelled-" + which.replace("_", "-")
    cmd = commands.learner(
        **names,
        policy_root=str(tmp_path / "store"),
        max_steps=2,
        warmstart_steps=0,
        timeout_s=600,
        **commands.SMALL_LAYOUT,
    )
    rc, log, took = _run_until_exit(cmd, {**os.environ}, timeout_s=300)
    assert rc == 2, log[-3000:]
    assert f"misspelled-{which.replace('_', '-')}: NotFound" in log and "stopped:" in log
    assert not (tmp_path / "store").exists()  # refused before anything was written
    assert _seconds_from_start_to_error(log) < FAIL_FAST_S, log[-2000:]
    print(f"learner with a wrong {which}: exit {rc} after {took:.1f} s (imports included)")


@pytest.mark.parametrize("which", ["requests_subscription", "records_topic"])
def test_the_rollout_job_exits_naming_a_wrong_name(pubsub_emulator, unique_name, tmp_path, which):
    req = pubsub_emulator.create_topic(unique_name("req"))
    names = {
        "requests_subscription": pubsub_emulator.create_subscription(unique_name("req"), req),
        "records_topic": pubsub_emulator.create_topic(unique_name("rec")),
    }
    names[which] = names[which].rsplit("/", 1)[0] + "/misspelled-" + which.replace("_", "-")
    cmd = commands.rollout(pubsub_emulator.project, **names, policy_root=str(tmp_path / "store"))
    t0 = time.monotonic()
    rc, log, _ = _run_until_exit(cmd, {**os.environ}, timeout_s=300)
    assert rc == 2, log[-3000:]
    assert f"misspelled-{which.replace('_', '-')}: NotFound" in log and "stopped:" in log, log[-3000:]
    assert "Traceback" not in log
    assert _seconds_from_start_to_error(log) < FAIL_FAST_S, log[-2000:]
    print(f"rollout job with a wrong {which}: exit {rc} after {time.monotonic() - t0:.1f} s (imports included)")


@pytest.fixture(scope="module")
def gcs():
    emu = gcs_emulator.shared()
    emu.apply_env()
    yield emu
    emu.restore_env()


def test_a_missing_bucket_is_refused_at_start(gcs):
    store = PolicyStore("gs://no-such-bucket-here/store", gcs_read_timeout_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(StoreAccessError, match="gs://no-such-bucket-here/store: NotFound"):
        store.check_access()
    assert time.monotonic() - t0 < FAIL_FAST_S
    PolicyStore(gcs.uri("fine")).check_access()  # the bucket exists: nothing to say, even when empty


def test_an_unreachable_gcs_is_transient_not_an_access_error(gcs, monkeypatch):
    """GCS down at start-up: the check says it could not look (first use decides) and
    readers get StoreError, which pollers ride out keeping their version."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    store = PolicyStore(gcs.uri("nowhere"), gcs_read_timeout_s=1.0)
    assert "cannot check now" in store.check_access()
    with pytest.raises(StoreError):
        store.latest_version()
