"""One engine measurement of benchmarks/real_model.py, in a process of its own: this
project's inference engine or transformers' `generate` on the same prompts.

    python benchmarks/_real_model_engine.py --impl jax|torch --model DIR --slots 64
        [--prompt_len 64] [--new_tokens 64] [--dtype float32|bfloat16] [--groups G]
        [--decode_steps K]

Every slot busy: `slots` sequences of `prompt_len` random prompt tokens each, each sampling
exactly `new_tokens` tokens at temperature 1 over the whole vocabulary (no eos stop).
JAX: rollout.engine.InferenceEngine on a core.policy.sampling.sampler.Sampler of `slots` slots and
a cache of prompt_len + new_tokens, after its warm-up compile; `--groups G`: the sequences
come in G groups that share their prompt (a GRPO group), as the rollout side runs them;
`--decode_steps K`: decode steps per device call (the rollout's --engine_decode_steps; 0: auto).
PyTorch: LlamaForCausalLM.generate(do_sample=True, top_k=0) at batch `slots`, one thread.
Prints one JSON line: wall seconds for all of it (prefill included), generated tokens/s,
sequences/s, peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)


def prompts(n: int, length: int, vocab: int, groups: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    distinct = rng.integers(100, vocab, (groups or n, length))
    return np.repeat(distinct, n // (groups or n), axis=0) if groups else distinct


def run_jax(args, ids: np.ndarray) -> float:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax.numpy as jnp

    from core.policy.formats.hf_weights import load_checkpoint
    from core.policy.model.transformer import split_params
    from core.policy.sampling.sampler import Sampler
    from rollout.engine import InferenceEngine

    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    cfg, model = load_checkpoint(args.model, dtype=dtype)
    _, params = split_params(model)
    length = args.prompt_len + args.new_tokens
    sampler = Sampler(
        cfg,
        slots=args.slots,
        length=length,
        prefill=args.prefill,
        prefill_slots=args.prefill_slots,
        dtype=dtype,
        decode_steps=args.decode_steps,
    )
    sampler.warmup(params)
    args.decode_steps = sampler.decode_steps  # reported as resolved (0: auto)
    return generate_all(InferenceEngine(sampler, lambda: (params, 0)), ids, args.new_tokens)


def generate_all(engine, prompts, new_tokens: int) -> float:
    """Seconds for the engine to sample exactly `new_tokens` after each prompt, all of them
    concurrent (one sequence per row of `prompts`, no stop)."""
    from rollout.engine import Sequence

    async def one(row):
        seq = Sequence.start([int(t) for t in row])
        await engine.generate(seq, new_tokens, lambda _g: False)
        engine.release(seq)

    async def all_of_them():
        await asyncio.gather(*(one(row) for row in prompts))

    t0 = time.perf_counter()
    asyncio.run(all_of_them())
    return time.perf_counter() - t0


def run_torch(args, ids: np.ndarray) -> float:
    import torch
    import transformers

    torch.set_num_threads(1)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = transformers.LlamaForCausalLM.from_pretrained(args.model, dtype=dtype)
    model.eval()
    x = torch.from_numpy(ids).long()
    kwargs = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=args.new_tokens)
    kwargs.update(min_new_tokens=args.new_tokens, pad_token_id=0)
    with torch.no_grad():
        model.generate(x[:1, :8], **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        t0 = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), **kwargs)
        wall = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + args.new_tokens, out.shape
    return wall


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=("jax", "torch"), required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--prompt_len", type=int, default=64)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--groups", type=int, default=0, help="sequences share their prompt in this many groups")
    p.add_argument("--prefill", type=int, default=64)
    p.add_argument("--prefill_slots", type=int, default=8)
    p.add_argument("--decode_steps", type=int, default=0, help="0: auto (1 on a CPU), as the rollout worker")
    args = p.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ids = prompts(args.slots, args.prompt_len, vocab, args.groups)
    wall = (run_jax if args.impl == "jax" else run_torch)(args, ids)
    generated = args.slots * args.new_tokens
    print(
        json.dumps(
            {
                "impl": args.impl,
                "slots": args.slots,
                "dtype": args.dtype,
                "groups": args.groups,
                "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens,
                "decode_steps": args.decode_steps,
                "wall_s": wall,
                "tokens_per_s": generated / wall,
                "sequences_per_s": args.slots / wall,
                "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
