"""The whole loop on real parts: Pub/Sub emulator, Beam streaming pipeline on the
BundleBasedDirectRunner, JAX learner, on-disk policy store; then nothing left running."""
import psutil
import pytest

from localstack.demo import parse_args, run_local
from trainer.store import PolicyStore


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in p.info["cmdline"] or []):
                found.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'])[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.timeout(600)
def test_pipeline_and_learner_close_the_loop(tmp_path):
    workdir = tmp_path / "demo"
    args = parse_args([f"--workdir={workdir}", "--max_steps=10", "--publish_every=3",
                       "--tool_latency=fixed:0.02", "--policy_poll_s=0.2", "--timeout_s=400",
                       "--warmstart_steps=0"])
    s = run_local(args)

    assert s["steps"] >= 10
    assert len(s["policy_versions_published"]) >= 3  # v0 plus at least two trained versions
    assert PolicyStore(str(workdir / "policy-store")).latest_version() == s["policy_versions_published"][-1]
    by_version = {int(v): n for v, n in s["records_by_max_policy_version"].items()}
    assert any(v >= 1 and n > 0 for v, n in by_version.items()), f"no record from a reloaded policy: {by_version}"
    assert s["declared_record_shapes"] == ["4x256"]
    assert s["record_shapes"] == {"4x256": s["records_consumed"]}
    assert s["records_consumed"] >= 10 * 2 and s["records_rejected"] == 0
    assert s["tokens_consumed"] > 0 and s["trajectories"] > 0
    assert s["compiled_train_steps"] == 1  # fixed shapes: one compile for every step
    assert 0.0 <= s["mean_reward"] <= 1.0

    for pid in s["pids"].values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _processes_mentioning(str(workdir)) == []  # emulator, pipeline and learner all gone
