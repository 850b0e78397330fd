"""The rollout pipeline alone, as a real streaming job on the emulator: good requests
become fixed-shape records, bad ones become dead letters with a reason."""
import json
import sys
import time

import pytest
from flax import nnx

import environments
from localstack.processes import ProcessGroup
from trainer import pubsub_io
from trainer.config import ModelConfig
from trainer.model import init_model, split_params
from trainer.records import decode
from trainer.rollout_request import RolloutRequest
from trainer.store import PolicyStore


def _pull_until(sub, path, n, timeout_s):
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        msgs = pubsub_io.pull(sub, path, 10, timeout_s=1.0)
        pubsub_io.ack(sub, path, [m.ack_id for m in msgs])
        got += [m.message for m in msgs]
    return got


@pytest.mark.timeout(300)
def test_requests_in_records_and_dead_letters_out(pubsub_emulator, unique_name, tmp_path):
    emu = pubsub_emulator
    names = {k: unique_name(k) for k in ("requests", "records", "dead")}
    topics = {k: emu.create_topic(v) for k, v in names.items()}
    subs = {k: emu.create_subscription(v + "-sub", v) for k, v in names.items()}
    store = PolicyStore(str(tmp_path / "store"))
    store.publish(0, nnx.to_pure_dict(split_params(init_model(ModelConfig(), 0))[1]))

    cmd = [sys.executable, "-m", "pipelines.rollout", "--runner=BundleBasedDirectRunner", "--streaming",
           f"--project={emu.project}", f"--requests_subscription={subs['requests']}",
           f"--records_topic={topics['records']}", f"--dead_letter_topic={topics['dead']}",
           f"--policy_root={store.root}", "--rows=2", "--seq_len=256", "--engine_slots=8",
           "--max_wait_s=0.5", "--commit_interval_s=0.1"]
    pub = pubsub_io.publisher_client()
    task = environments.generate_tasks(0, 2, "test")
    good = [RolloutRequest(f"good-{i}", "calculator", t.to_json_dict(), 4, {"max_turns": 2}) for i, t in enumerate(task)]
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
