"""The main job on Hugging Face checkpoints (`make demo ARGS="--model DIR ..."`), end to end
on real parts: a tiny Qwen2 checkpoint fully fine-tuned after a warm start in its own chat
format, a tiny Llama 3 checkpoint through LoRA adapters. Each run's learner checks that
every trajectory it trained on is token for token what the rollout side sampled, and the
final version, exported, loads in transformers with weights that moved."""

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from agentic_rl import export
from core import config
from core.contracts.store import PolicyStore
from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint
from localstack.launch.demo import run_local, with_model_layout
from localstack.launch.demo_config import DemoConfig
from tests import _hf_tiny

pytestmark = pytest.mark.e2e


def _run(tmp_path: Path, family: str, **flags):
    ckpt = write_tiny_checkpoint(tmp_path / f"tiny-{family}", family)
    args = config.build(
        DemoConfig,
        workdir=str(tmp_path / "run"),
        model=str(ckpt),
        env="calculator",
        max_steps=2,
        publish_every=1,
        batch_records=1,
        group_size=4,
        warmstart_steps=20,
        warmstart_tasks=64,
        warmstart_batch=8,
        tool_latency="none",
        policy_poll_s=0.2,
        timeout_s=400,
        eval_n=8,
        filter_zero_signal=False,  # a tiny random checkpoint: most groups score all zero
        plan="off",
        report=False,  # the async e2e test draws it
        **flags,
    )
    s = run_local(with_model_layout(args))
    return ckpt, tmp_path / "run", s


def _check_run(s, trajectory_len_at_least: int):
    L = s.learner
    assert L.steps >= 2 and L.exit_code == 0
    assert L.compiled_train_steps == 1  # one record shape, one compile
    acc = L.accounting
    assert acc.balanced, acc
    # Token in, token out: every trained trajectory's tokens and loss mask, as the learner
    # trained on them, equal what the rollout side sampled (checked per trajectory).
    assert L.trajectories_tokens_verified == acc.trained > 0, (L.trajectories_tokens_verified, acc)
    ((shape, _),) = L.record_shapes.items()
    assert int(shape.split("x")[1]) >= trajectory_len_at_least  # the layout followed the chat prompt
    assert s.held_out["sampled"]["last"]["version"] == L.policy_versions_published[-1]


def _export_and_compare(tmp_path: Path, ckpt: Path, workdir: Path) -> dict:
    out = tmp_path / "export"
    assert export.main(["--store", str(workdir / "policy-store"), "--out", str(out)]) == 0
    hf = _hf_tiny.load_hf(out)
    base, trained = load_file(ckpt / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(base) == set(trained)
    moved = {k for k in base if not np.array_equal(base[k], trained[k])}
    with torch.no_grad():
        logits = hf(torch.tensor([[5, 6, 7, 8]])).logits
    assert torch.isfinite(logits).all()
    return {"moved": moved, "n": len(base)}


@pytest.mark.timeout(900)
def test_a_qwen2_checkpoint_trains_in_its_own_chat_format_and_exports(tmp_path):
    ckpt, workdir, s = _run(tmp_path, "qwen2")
    _check_run(s, trajectory_len_at_least=128)
    meta = PolicyStore(str(workdir / "policy-store")).read_metadata(s.learner.policy_versions_published[-1])
    assert meta["metadata"]["tokenizer"] == str(ckpt) and "lora" not in meta["metadata"]
    moved = _export_and_compare(tmp_path, ckpt, workdir)
    assert len(moved["moved"]) == moved["n"]  # full fine-tuning moves every tensor


@pytest.mark.timeout(900)
def test_a_llama3_checkpoint_trains_lora_adapters_and_exports_them_merged(tmp_path):
    ckpt, workdir, s = _run(tmp_path, "llama3", lora_rank=4)
    _check_run(s, trajectory_len_at_least=128)
    store = PolicyStore(str(workdir / "policy-store"))
    last = s.learner.policy_versions_published[-1]
    meta = store.read_metadata(last)["metadata"]
    assert meta["lora"]["rank"] == 4
    published = sum(f.stat().st_size for f in Path(store.version_path(last)).rglob("*") if f.is_file())
    assert published < 0.5 * (ckpt / "model.safetensors").stat().st_size  # the adapter, not the model
    moved = _export_and_compare(tmp_path, ckpt, workdir)
    # Only adapted projections move; embeddings and norms are the base's.
    assert moved["moved"] and all("proj" in k for k in moved["moved"]), sorted(moved["moved"])
