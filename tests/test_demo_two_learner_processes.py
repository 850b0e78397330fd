"""The main job with a learner of two JAX processes (`--learner_processes 2`): joined as on
Vertex AI (CLUSTER_SPEC on localhost, gloo), a mesh over both, process 0 owning the data
plane and the others following it (trainer/learning/step/lockstep.py). The run finishes, every
trajectory is accounted for, and both processes took every step."""

import re

import psutil
import pytest

from core import config
from localstack.launch.demo import run_local
from localstack.launch.demo_config import DemoConfig

pytestmark = pytest.mark.e2e


def test_a_two_process_learner_runs_the_main_job_and_balances(tmp_path):
    workdir = tmp_path / "run"
    args = config.build(
        DemoConfig,
        workdir=str(workdir),
        env="calculator",
        learner_processes=2,
        max_steps=4,
        publish_every=2,
        batch_records=2,  # 2 rows a step: one per process's device
        group_size=4,
        warmstart_steps=20,  # both processes run it, collectively, on the same demonstrations
        filter_zero_signal=False,  # a barely warm policy: train on equal-reward groups too
        tool_latency="none",
        policy_poll_s=0.2,
        timeout_s=600,
        eval_n=0,
        plan="off",
        live="off",
        trace=False,
        report=False,  # the async e2e test draws it
    )
    summary = run_local(args)
    learned = summary.learner
    assert learned.steps == 4 and learned.exit_code == 0
    assert learned.accounting.balanced, learned.accounting
    assert learned.policy_versions_published == [0, 1, 2]  # process 0 alone publishes
    primary = (workdir / "learner.log").read_text(errors="replace")
    follower = (workdir / "learner-1.log").read_text(errors="replace")
    assert "JAX process 0 of 2" in primary and "JAX process 1 of 2" in follower, primary[-2000:]
    assert learned.mesh == {"data": 2, "model": 1}
    assert re.search(r"step 4 version 2", primary), primary[-2000:]
    assert "Traceback" not in follower, follower[-3000:]
    assert not (workdir / "logs" / "learner-1").exists()  # telemetry: process 0 only
    survivors = [p for p in psutil.process_iter(["cmdline"]) if str(workdir) in " ".join(p.info["cmdline"] or [])]
    assert not survivors
