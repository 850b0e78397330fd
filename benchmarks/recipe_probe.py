"""A recipe's warm start alone, in one process: behaviour cloning on oracle episodes, then
held-out evaluation (sampled and greedy) with the failure classes, no Beam or Pub/Sub.

    .venv/bin/python benchmarks/recipe_probe.py --env code --env_config '{"max_turns": 3}' \\
        --steps 800 --tasks 2000 --turn_tokens 96

What v0 of a main job with the same warm start would score, in a few minutes: the quick
loop for choosing a recipe's warm start (docs/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # before benchmarks/rollout.py

from flax import nnx

import environments
from core.contracts.store import PolicyStore
from core.policy.formats.hf_weights import load_checkpoint
from core.policy.model.config import MODEL_CONFIGS
from core.policy.model.lora import LoraConfig, add_lora, merge_params, split_lora
from core.policy.model.transformer import init_model, split_params
from core.policy.sampling.sampler import Sampler
from core.policy.sources import BYTE, policy_metadata
from core.policy.text.chat_format import chat_format_for
from core.policy.text.tokenizer import BYTE_TOKENIZER, load_tokenizer
from rollout.episodes import EpisodeLimits
from rollout.scoring import evaluate
from trainer.learning.warmstart import WarmStartConfig, warm_start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="calculator")
    p.add_argument("--env_config", type=json.loads, default={})
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--direct_frac", type=float, default=0.0)
    p.add_argument("--turn_tokens", type=int, default=32)
    p.add_argument("--max_tokens", type=int, default=256)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--model_config", default="tiny")
    p.add_argument("--model", default=None, help="a checkpoint directory (its weights, tokenizer and format)")
    p.add_argument("--lora_rank", type=int, default=0)
    p.add_argument("--eval_slots", type=int, default=64)
    p.add_argument("--schedule", default="cosine", choices=("cosine", "constant"))
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--modes", default="sampled,greedy", help="evaluations to run, in order")
    p.add_argument("--oracle", default="default", help="the demonstrations' style (environments.oracle)")
    p.add_argument("--save", default=None, help="publish the warm-started params to this policy store as v0")
    a = p.parse_args(argv)
    env_config = {"tool_latency": "none", **a.env_config}
    fmt, frozen, lora = chat_format_for(BYTE_TOKENIZER), None, None
    if a.model:
        cfg, model = load_checkpoint(a.model)
        fmt = chat_format_for(load_tokenizer(a.model))
    else:
        cfg = MODEL_CONFIGS[a.model_config]
        model = init_model(cfg, 0)
    if a.lora_rank:
        lora = LoraConfig(rank=a.lora_rank)
        base_params = split_params(model)[1]
        graphdef, params, frozen = split_lora(add_lora(model, lora))
    else:
        graphdef, params = split_params(model)
    demos = environments.make_tasks(a.env, 1, a.tasks, "train", env_config)
    ws = WarmStartConfig(
        steps=a.steps,
        batch_rows=a.batch,
        learning_rate=a.lr,
        direct_frac=a.direct_frac,
        tasks=a.tasks,
        schedule=a.schedule,
        warmup_steps=a.warmup,
        oracle=a.oracle,
    )
    t0 = time.monotonic()
    params, losses = (
        warm_start(graphdef, params, a.env, demos, ws, fmt, frozen, env_config=env_config, seq_len=a.max_tokens)
        if a.steps
        else (params, [float("nan")])
    )
    print(f"warm start {a.steps} steps: {time.monotonic() - t0:.1f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print("losses: " + " ".join(f"{x:.3f}" for x in losses), flush=True)
    if lora is not None:
        params = merge_params(base_params, nnx.to_pure_dict(params), lora)
    if a.save:  # v0 of a store: the warm-started policy, for export_check.py or --init_policy
        PolicyStore(a.save).publish(0, nnx.to_pure_dict(params), policy_metadata(cfg, a.model or BYTE))
        print(f"published the warm-started params as version 0 of {a.save}", flush=True)
    tasks = environments.make_tasks(a.env, 0, a.n, "test", env_config)
    limits = EpisodeLimits(max_new_tokens_per_turn=a.turn_tokens, max_tokens=a.max_tokens, episode_timeout_s=900)
    for greedy in [m == "greedy" for m in a.modes.split(",")]:
        slots = min(a.eval_slots, a.n)
        sampler = Sampler(cfg, slots, a.max_tokens, 32, greedy=greedy, prefill_slots=min(8, slots))
        r = evaluate(params, sampler, a.env, tasks, limits, env_config, fmt)
        mode = "greedy" if greedy else "sampled"
        print(
            f"{mode}: success {r['success']:.3f} reward {r['mean_reward']:.3f} turns {r['mean_turns']:.2f} "
            f"calls {r['tool_calls_per_episode']:.2f} outcomes {r['outcomes']} ({r['eval_s']} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
