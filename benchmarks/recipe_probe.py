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

import environments
from core.policy.chat_format import chat_format_for
from core.policy.config import MODEL_CONFIGS
from core.policy.model import init_model, split_params
from core.policy.sampling import Sampler
from core.policy.tokenizer import BYTE_TOKENIZER
from rollout.episodes import EpisodeLimits
from rollout.evaluation import evaluate
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
    a = p.parse_args(argv)
    env_config = {"tool_latency": "none", **a.env_config}
    cfg = MODEL_CONFIGS[a.model_config]
    graphdef, params = split_params(init_model(cfg, 0))
    demos = environments.make_tasks(a.env, 1, a.tasks, "train", env_config)
    ws = WarmStartConfig(
        steps=a.steps,
        batch_rows=a.batch,
        learning_rate=a.lr,
        direct_frac=a.direct_frac,
        tasks=a.tasks,
        max_seq_len=a.max_tokens,
    )
    t0 = time.monotonic()
    params, losses = warm_start(
        graphdef, params, a.env, demos, ws, chat_format_for(BYTE_TOKENIZER), env_config=env_config
    )
    print(f"warm start {a.steps} steps: {time.monotonic() - t0:.1f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    tasks = environments.make_tasks(a.env, 0, a.n, "test", env_config)
    limits = EpisodeLimits(max_new_tokens_per_turn=a.turn_tokens, max_tokens=a.max_tokens)
    for greedy in (False, True):
        sampler = Sampler(cfg, 64, a.max_tokens, greedy=greedy)
        r = evaluate(params, sampler, a.env, tasks, limits, env_config)
        mode = "greedy" if greedy else "sampled"
        print(
            f"{mode}: success {r['success']:.3f} reward {r['mean_reward']:.3f} turns {r['mean_turns']:.2f} "
            f"calls {r['tool_calls_per_episode']:.2f} outcomes {r['outcomes']} ({r['eval_s']} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
