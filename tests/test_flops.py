"""The model FLOPs the learner's MFU divides by (core/policy/model/flops.py): 6 N a trained token
plus causal attention within each segment, checked against XLA's own count of a step whose
loops run once (XLA counts a loop's body once, so the scanned step cannot be counted)."""

from __future__ import annotations

import numpy as np
import pytest

from core.contracts.records import PackedRecord, empty_record_arrays
from core.policy.model import transformer as model
from core.policy.model.config import ModelConfig
from core.policy.model.flops import causal_pairs, matmul_params, segment_lengths, train_flops
from core.policy.model.lora import LoraConfig
from trainer.learning.step.gradients import ComputeConfig
from trainer.learning.step.learner import Learner, LearnerConfig
from trainer.learning.step.losses import LossConfig

CFG = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=384, max_seq_len=64, vocab_size=300)
ROWS, T = 4, 64
WIDTH = CFG.n_heads * CFG.head_dim


def _full_rows() -> PackedRecord:
    """One segment filling each row: no padding."""
    a = empty_record_arrays(ROWS, T)
    a["segment_ids"][:], a["positions"][:] = 1, np.arange(T)
    a["loss_mask"][:, 1:] = 1
    return PackedRecord(record_id="full", trajectories=[], **a)


def test_segment_lengths_and_causal_pairs():
    seg = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    assert segment_lengths(seg).tolist() == [3, 2, 6]
    assert causal_pairs([3, 2]) == 6 + 3
    assert causal_pairs([6], window=2) == 1 + 2 * 5  # the first query sees itself, the rest two keys


def test_model_flops_match_xlas_count_of_a_step_whose_loops_run_once(monkeypatch):
    monkeypatch.setattr(model, "_uniform", lambda blocks: False)  # the layers unrolled, not scanned
    compute = ComputeConfig(remat="off", micro_batches=1, logit_chunk=ROWS * T, dtype="float32", attention="xla")
    learner = Learner(CFG, LearnerConfig(batch_records=1, compute=compute, loss=LossConfig()))
    learner.compile_for(ROWS, T)
    cost = learner._compiled[(ROWS, T)].cost_analysis()
    xla = float((cost[0] if isinstance(cost, list) else cost)["flops"])
    # The dense path computes every (query, key) pair of a row and masks half: the model needs
    # the causal half, which is what the learner counts.
    computed = 6 * matmul_params(CFG) * ROWS * T + 12 * WIDTH * CFG.n_layers * ROWS * T * T
    assert xla == pytest.approx(computed, rel=0.1)
    needed = 6 * matmul_params(CFG) * ROWS * T + 12 * WIDTH * CFG.n_layers * ROWS * T * (T + 1) / 2
    assert learner.step_flops([_full_rows()]) == pytest.approx(needed)


def test_lora_and_the_kl_reference_change_the_count():
    lengths = np.array([64, 32])
    full = train_flops(CFG, lengths)
    n, tokens = matmul_params(CFG), 96
    attention = 12 * WIDTH * CFG.n_layers * causal_pairs(lengths)
    assert full == pytest.approx(6 * n * tokens + attention)
    assert train_flops(CFG, lengths, "adapter") == pytest.approx(full - 2 * n * tokens)  # no weight gradients
    assert train_flops(CFG, lengths, reference=True) == pytest.approx(full + 2 * n * tokens + attention / 3)
    lcfg = LearnerConfig(batch_records=1, lora=LoraConfig(rank=4), loss=LossConfig())
    assert Learner(CFG, lcfg).step_flops([_full_rows()]) == pytest.approx(train_flops(CFG, np.full(ROWS, T), "adapter"))
