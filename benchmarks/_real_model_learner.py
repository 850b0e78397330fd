"""One learner measurement of benchmarks/real_model.py, in a process of its own (peak RSS
is per process): this project's learner step or a PyTorch step on the same tokens.

    python benchmarks/_real_model_learner.py --impl jax|torch --model DIR --rows R --seq_len T
        [--segments S] [--lora_rank 8] [--steps 3] [--micro_batches 0]

Prints one JSON line: impl, shape, step seconds (median of --steps after a first, compiling
step), trained tokens/s (non-padding tokens of the batch per step), peak RSS (the process's
whole life: loading, compiling, stepping) and the step's model FLOPs (JAX only: 6 N a token plus causal attention).

The tokens: R rows of T, each row S segments of T // S tokens (S = 1: one sequence per row),
random ids from seed 0, the loss on the last two thirds of each segment, advantages +-1.
PyTorch: transformers' LlamaForCausalLM in float32 with AdamW, one thread, the loss as the
learner's (log-softmax, the chosen token's log-prob, a policy-gradient surrogate); packed
segments get a block-diagonal causal mask and positions restarting per segment; rows go
one at a time with gradients accumulated, as the learner's micro-batches do.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)


def batch(rows: int, seq_len: int, segments: int, vocab: int) -> dict:
    rng = np.random.default_rng(0)
    seg_len = seq_len // segments
    out = {k: np.zeros((rows, seq_len), np.int32) for k in ("tokens", "segment_ids", "positions", "loss_mask")}
    out["tokens"][:] = rng.integers(0, vocab, (rows, seq_len))
    for s in range(segments):
        cols = slice(s * seg_len, (s + 1) * seg_len)
        out["segment_ids"][:, cols] = s + 1
        out["positions"][:, cols] = np.arange(seg_len)
        out["loss_mask"][:, s * seg_len + seg_len // 3 : (s + 1) * seg_len] = 1
    out["advantages"] = np.where(rng.random((rows, seq_len)) < 0.5, -1.0, 1.0).astype(np.float32) * out["loss_mask"]
    out["behaviour_logprobs"] = np.zeros((rows, seq_len), np.float32)
    return out


def packed_record(data: dict):
    """`batch`'s arrays as the one PackedRecord a learner step takes."""
    from core.contracts.records import PackedRecord

    return PackedRecord(
        record_id="bench",
        tokens=data["tokens"],
        segment_ids=data["segment_ids"],
        positions=data["positions"],
        loss_mask=data["loss_mask"].astype(np.uint8),
        behaviour_logprobs=data["behaviour_logprobs"],
        advantages=data["advantages"],
        policy_versions=np.zeros_like(data["tokens"]),
        trajectories=[],
    )


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def timed(step, steps: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return first, float(np.median(times))


def run_jax(args, data) -> dict:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from core.policy.formats.hf_weights import load_checkpoint
    from core.policy.model.lora import LoraConfig
    from trainer.learning.step.gradients import ComputeConfig
    from trainer.learning.step.learner import Learner, LearnerConfig

    cfg, model = load_checkpoint(args.model)
    compute = ComputeConfig(remat=args.remat, micro_batches=args.micro_batches)
    lcfg = LearnerConfig(batch_records=1, learning_rate=1e-5, compute=compute, lora=LoraConfig(rank=args.lora_rank))
    span = args.seq_len // args.segments
    learner = Learner(cfg, lcfg, model=model, span=span)
    del model
    record = packed_record(data)
    first, step_s = timed(lambda: learner.train_step([record]), args.steps)
    layout = learner.layouts[(args.rows, args.seq_len)]
    return {
        "first_step_s": first,
        "step_s": step_s,
        "flops": learner.step_flops([record]),  # model FLOPs (core/policy/model/flops.py)
        "remat": layout.remat,
        "micro_batches": layout.micro_batches,
    }


def run_torch(args, data) -> dict:
    import torch
    import transformers

    torch.set_num_threads(1)
    model = transformers.LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if args.lora_rank:
        params = _torch_lora(model, args.lora_rank)
    else:
        params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in data.items()}
    mask_total = float(t["loss_mask"].sum())

    def step():
        for r in range(args.rows):
            ids = t["tokens"][r : r + 1].long()
            seg, pos = t["segment_ids"][r : r + 1], t["positions"][r : r + 1].long()
            same = seg[:, :, None] == seg[:, None, :]
            causal = torch.ones(args.seq_len, args.seq_len, dtype=torch.bool).tril()
            attn = (same & causal)[:, None]  # [1, 1, T, T] boolean: True = attend
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
            mask = t["loss_mask"][r : r + 1, 1:].float()
            loss = -(logp * t["advantages"][r : r + 1, 1:] * mask).sum() / mask_total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    first, step_s = timed(step, args.steps)
    return {"first_step_s": first, "step_s": step_s, "flops": 0.0}


def _torch_lora(model, rank: int, alpha: float = 16.0):
    """A minimal LoRA on every projection of every layer (q, k, v, o, gate, up, down), as
    the learner's default targets; the base frozen."""
    import torch

    class LoRALinear(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.randn(base.in_features, rank) / base.in_features**0.5)
            self.b = torch.nn.Parameter(torch.zeros(rank, base.out_features))
            self.scale = alpha / rank

        def forward(self, x):
            return self.base(x) + (x @ self.a @ self.b) * self.scale

    for p in model.parameters():
        p.requires_grad_(False)
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in names:
                if hasattr(parent, name):
                    setattr(parent, name, LoRALinear(getattr(parent, name)))
    return [p for p in model.parameters() if p.requires_grad]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=("jax", "torch"), required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--segments", type=int, default=1)
    p.add_argument("--lora_rank", type=int, default=0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--remat", default="auto")
    p.add_argument("--micro_batches", type=int, default=0)
    args = p.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    data = batch(args.rows, args.seq_len, args.segments, vocab)
    out = (run_jax if args.impl == "jax" else run_torch)(args, data)
    tokens = int((data["segment_ids"] > 0).sum())
    out.update(
        impl=args.impl,
        rows=args.rows,
        seq_len=args.seq_len,
        segments=args.segments,
        lora_rank=args.lora_rank,
        tokens=tokens,
        tokens_per_s=tokens / out["step_s"],
        peak_rss_gb=peak_rss_gb(),
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
