"""Deterministic packed records for learner tests (several segments per row)."""

import numpy as np

from core.contracts.records import PackedRecord, TrajectoryInfo, empty_record_arrays


def random_record(seed: int, rows: int = 4, seq_len: int = 64, vocab: int = 256) -> PackedRecord:
    rng = np.random.default_rng(seed)
    a = empty_record_arrays(rows, seq_len)
    infos = []
    for r in range(rows):
        start, seg = 0, 0
        while start < seq_len - 8 and seg < 3:
            length = int(rng.integers(8, max(9, (seq_len - start) // 2 + 1)))
            end, seg = start + length, seg + 1
            gen = np.arange(length) >= 4  # a 4-token prompt, then generated tokens
            a["tokens"][r, start:end] = rng.integers(0, vocab, length)
            a["segment_ids"][r, start:end] = seg
            a["positions"][r, start:end] = np.arange(length)
            a["loss_mask"][r, start:end] = gen
            a["behaviour_logprobs"][r, start:end] = np.where(gen, rng.uniform(-7, -4, length), 0)
            a["advantages"][r, start:end] = np.where(gen, rng.normal(), 0)
            a["policy_versions"][r, start:end] = np.where(gen, 0, -1)
            infos.append(TrajectoryInfo(f"s{seed}-r{r}-{seg}", r, seg, length, 0.0, "finished"))
            start = end
    return PackedRecord(record_id=f"rec-{seed}", trajectories=infos, **a).validate()
