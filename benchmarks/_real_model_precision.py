"""Two small measurements of benchmarks/real_model.py, each in a process of its own:

    python benchmarks/_real_model_precision.py --matmul_peak
        this core's float32 matmul GFLOP/s (the best of 1,024^3 and 2,048^3 products, jitted)
    python benchmarks/_real_model_precision.py --model DIR
        bfloat16 against float32 on a calculator oracle transcript in the model's chat format:
        each token's log-prob from a forward pass (mean and max |difference|), and the
        seconds of a forward+backward pass at 1 x 256 in each dtype

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def matmul_peak() -> dict:
    import jax
    import jax.numpy as jnp

    import core.policy  # noqa: F401  (the CPU backend's flags)

    best = 0.0
    for n in (1024, 2048):
        a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
        f = jax.jit(lambda x, y: x @ y)
        f(a, a).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(5):
            f(a, a).block_until_ready()
        best = max(best, 2 * n**3 * 5 / (time.perf_counter() - t0) / 1e9)
    return {"gflops": best}


def precision(model: str) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import environments
    from core.policy.formats.hf_weights import load_checkpoint
    from core.policy.model.logprobs import token_logprobs_and_entropy
    from core.policy.model.transformer import split_params
    from core.policy.sources import policy_spec
    from core.policy.text.chat_format import chat_format_for
    from trainer.learning.warmstart import oracle_transcript

    environments.load_entry_points()
    spec = policy_spec(model)
    task = environments.make_tasks("calculator", 1, 1, "test")[0]
    tokens = asyncio.run(oracle_transcript("calculator", task, fmt=chat_format_for(spec.tokenizer))).tokens
    t = len(tokens)
    ids = jnp.asarray([tokens], jnp.int32)
    seg, pos = jnp.ones_like(ids), jnp.arange(t)[None]
    out, times = {}, {}
    for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        _, m = load_checkpoint(model, dtype=dtype)
        graphdef, params = split_params(m)

        def logp(p, ids=ids, graphdef=graphdef):
            model_ = nnx.merge(graphdef, p)
            h = model_.hidden(ids, seg, pos)
            return token_logprobs_and_entropy(model_.head, h, ids)[0]

        out[name] = np.asarray(jax.jit(logp)(params))[0, 1:]
        batch = jnp.asarray(np.random.default_rng(0).integers(0, spec.cfg.vocab_size, (1, 256)), jnp.int32)
        grad = jax.jit(jax.grad(lambda p, graphdef=graphdef, batch=batch: _sum_logp(graphdef, p, batch)))
        jax.block_until_ready(grad(params))
        t0 = time.perf_counter()
        for _ in range(2):
            jax.block_until_ready(grad(params))
        times[name] = (time.perf_counter() - t0) / 2
    d = np.abs(out["bfloat16"] - out["float32"])
    return {"tokens": t, "mean_abs_logp_diff": float(d.mean()), "max_abs_logp_diff": float(d.max()), "fwd_bwd_s": times}


def _sum_logp(graphdef, params, batch):
    import jax.numpy as jnp
    from flax import nnx

    from core.policy.model.logprobs import token_logprobs_and_entropy

    model = nnx.merge(graphdef, params)
    seg, pos = jnp.ones_like(batch), jnp.arange(batch.shape[1])[None]
    return token_logprobs_and_entropy(model.head, model.hidden(batch, seg, pos), batch)[0].sum()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--matmul_peak", action="store_true")
    p.add_argument("--model")
    args = p.parse_args()
    print(json.dumps(matmul_peak() if args.matmul_peak else precision(args.model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
