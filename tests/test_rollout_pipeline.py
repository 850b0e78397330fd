"""The rollout pipeline alone, as a real streaming job on the emulator: good requests
become fixed-shape records, bad ones become dead letters with a reason."""

import json
import time

import pytest
from flax import nnx

import environments
from core.contracts import pubsub_io
from core.contracts.records import decode
from core.contracts.rollout_request import RolloutRequest
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from localstack.launch.processes import ProcessGroup
from tests import _commands as commands
from trainer.learning.data.consumer import RecordConsumer


def _pull_until(sub, path, n, timeout_s):
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        msgs = pubsub_io.pull(sub, path, 10, timeout_s=1.0)
        pubsub_io.ack(sub, path, [m.ack_id for m in msgs])
        got += [m.message for m in msgs]
    return got


def _setup(emu, unique_name, tmp_path, **settings):
    names = {k: unique_name(k) for k in ("requests", "records", "dead")}
    topics = {k: emu.create_topic(v) for k, v in names.items()}
    subs = {k: emu.create_subscription(v + "-sub", v) for k, v in names.items()}
    store = PolicyStore(str(tmp_path / "store"))
    store.publish(0, nnx.to_pure_dict(split_params(init_model(ModelConfig(), 0))[1]))
    cmd = commands.rollout(
        emu.project,
        requests_subscription=subs["requests"],
        records_topic=topics["records"],
        dead_letter_topic=topics["dead"],
        policy_root=store.root,
        **commands.SMALL_LAYOUT,
        **{**commands.FAST_ROLLOUT, "engine_slots": 8, "policy_poll_s": 1.0, **settings},
    )
    return topics, subs, cmd


@pytest.mark.timeout(300)
def test_requests_in_records_and_dead_letters_out(pubsub_emulator, unique_name, tmp_path):
    emu = pubsub_emulator
    topics, subs, cmd = _setup(emu, unique_name, tmp_path)
    pub = pubsub_io.publisher_client()
    task = environments.generate_tasks(0, 2, "test")
    good = [
        RolloutRequest(f"good-{i}", "calculator", t.to_json_dict(), 4, {"max_turns": 2}) for i, t in enumerate(task)
    ]
    bad = {
        b"not json": "not JSON",
        RolloutRequest("unknown-env", "no_such_env", task[0].to_json_dict(), 2).to_bytes(): "KeyError",
        RolloutRequest("too-big", "calculator", task[0].to_json_dict(), 64).to_bytes(): "group_size",
        RolloutRequest("bad-task", "calculator", {"prompt": "x"}, 2).to_bytes(): "ValueError",
    }
    with ProcessGroup(cmd, tmp_path / "pipeline.log", env=None) as pipeline:
        for req in good:
            pubsub_io.publish(pub, topics["requests"], req.to_bytes()).result()
        for data in bad:
            pubsub_io.publish(pub, topics["requests"], data).result()
        # Twice the same request: its trajectories must not be packed twice.
        pubsub_io.publish(pub, topics["requests"], good[0].to_bytes()).result()
        dead = _pull_until(emu.subscriber(), subs["dead"], len(bad), 150)
        records = _pull_until(emu.subscriber(), subs["records"], 100, 8) if dead else []
        assert pipeline.poll() is None, pipeline.log_tail()

    errors = sorted(m.attributes["error"] for m in dead)
    assert len(dead) == len(bad), errors
    for data, reason in bad.items():
        assert any(m.data == data and reason in m.attributes["error"] for m in dead), (reason, errors)
    decoded = [decode(m.data, (2, 256)) for m in records]
    ids = [t.trajectory_id for r in decoded for t in r.trajectories]
    assert sorted(ids) == sorted(f"good-{i}/{s}" for i in range(2) for s in range(4))  # no duplicates
    for m, r in zip(records, decoded):
        assert m.attributes["record_id"] == r.record_id and m.attributes["rows"] == "2"
        assert json.loads(m.attributes["max_policy_version"]) == 0


@pytest.mark.timeout(300)
def test_filtered_groups_send_drop_notices_that_return_credits(pubsub_emulator, unique_name, tmp_path):
    """A random policy never solves a task: every group has equal rewards, so with the
    zero-signal filter on nothing is packed, and every trajectory is reported dropped."""
    emu = pubsub_emulator
    topics, subs, cmd = _setup(emu, unique_name, tmp_path, filter_zero_signal=True)
    pub = pubsub_io.publisher_client()
    tasks = environments.generate_tasks(1, 3, "test")
    with ProcessGroup(cmd, tmp_path / "pipeline.log", env=None) as pipeline:
        for i, t in enumerate(tasks):
            req = RolloutRequest(f"zero-{i}", "calculator", t.to_json_dict(), 4, {"max_turns": 1})
            pubsub_io.publish(pub, topics["requests"], req.to_bytes()).result()
        consumer = RecordConsumer(subs["records"], {(2, 256)})
        deadline, records = time.monotonic() + 150, []
        while consumer.dropped_trajectories.get("zero_signal", 0) < 12 and time.monotonic() < deadline:
            records += consumer.poll(max_messages=10, timeout_s=1.0)
        assert pipeline.poll() is None, pipeline.log_tail()
    assert records == [] and consumer.rejected == 0
    assert consumer.dropped_trajectories == {"zero_signal": 12}
    dropped = consumer.take_dropped()
    assert len(dropped) == 12 and all(t.startswith("zero-") for t in dropped) and consumer.take_dropped() == []
