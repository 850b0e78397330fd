"""A Hugging Face family against the built-in policy of the same size: engine decode
tokens/s and learner step time, side by side in one run.

    .venv/bin/python benchmarks/models.py [--rounds 3] [--slots 32] [--new_tokens 32]

The tiny Qwen2 config is read through core/policy/formats/hf_config.py from a config.json of the
built-in's dimensions (d 64, 2 layers, 4 heads / 2 KV heads, MLP 256, vocab 264), so the
only differences are Qwen2's own: q/k/v biases and its RoPE base. Rounds alternate the two
models (A B A B ...) so machine noise hits both alike; the table gives the medians and the
ratio.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
from _learner_common import make_records
from _report import print_table
from _rollout_decode import engine_throughput

from core import config
from core.config import configclass, knob
from core.policy.formats.hf_config import config_from_hf
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sampling.sampler import Sampler
from trainer.learning.step.learner import Learner, LearnerConfig

ROWS, SEQ = 4, 256  # the demo's record shape


def tiny_qwen2() -> ModelConfig:
    built_in = ModelConfig()
    return config_from_hf(
        {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "vocab_size": built_in.vocab_size,
            "hidden_size": built_in.d_model,
            "num_hidden_layers": built_in.n_layers,
            "num_attention_heads": built_in.n_heads,
            "num_key_value_heads": built_in.n_kv_heads,
            "intermediate_size": built_in.mlp_dim,
            "max_position_embeddings": built_in.max_seq_len,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": True,
        },
        "benchmarks/models.py",
    )


class Subject:
    """One model: its compiled sampler and learner, built once."""

    def __init__(self, name: str, cfg: ModelConfig, slots: int, records):
        self.name, self.cfg, self.records = name, cfg, records
        self.params = split_params(init_model(cfg))[1]
        self.n_params = sum(x.size for x in jax.tree.leaves(self.params))
        self.sampler = Sampler(cfg, slots=slots, length=SEQ)
        self.sampler.warmup(self.params)
        self.learner = Learner(cfg, LearnerConfig(batch_records=2))
        self.learner.train_step(records[:2])  # compile
        self.tok_s, self.step_ms = [], []

    def round(self, new_tokens: int, steps: int) -> None:
        r = engine_throughput(self.sampler, self.params, new_tokens)
        self.tok_s.append(r["tokens"] / r["wall"])
        for i in range(steps):
            batch = self.records[(2 * i) % len(self.records) :][:2]
            t0 = time.perf_counter()
            self.learner.train_step(batch)
            self.step_ms.append((time.perf_counter() - t0) * 1000)


@configclass
class ModelsBenchConfig:
    rounds: int = knob(3, "alternating rounds per model")
    slots: int = knob(32, "engine slots, all busy")
    new_tokens: int = knob(32, "tokens each slot generates per round")
    steps: int = knob(10, "learner steps per round")


def main(argv=None) -> int:
    args = config.parse(ModelsBenchConfig, argv, description=__doc__)
    records = make_records(0, 8, ROWS, SEQ)
    subjects = [Subject("built-in (byte)", ModelConfig(), args.slots, records)]
    subjects.append(Subject("Qwen2 (hf_config)", tiny_qwen2(), args.slots, records))
    for _ in range(args.rounds):
        for s in subjects:
            s.round(args.new_tokens, args.steps)
    base = subjects[0]
    rows = []
    for s in subjects:
        tok_s, step = statistics.median(s.tok_s), statistics.median(s.step_ms)
        rows.append(
            [s.name, s.n_params, tok_s, tok_s / statistics.median(base.tok_s), step,
             step / statistics.median(base.step_ms)]
        )  # fmt: skip
    print_table(
        f"Model families: engine decode ({args.slots} slots busy) and learner step (2 records of {ROWS}x{SEQ})",
        ["model", "params", "engine tok/s", "vs built-in", "learner step ms (p50)", "vs built-in"],
        rows,
        f"medians of {args.rounds} alternating rounds; {args.steps} learner steps per round",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
