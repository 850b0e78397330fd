"""`agentic-rl tiny-checkpoint`: a tiny random Hugging Face checkpoint of one family.

    agentic-rl tiny-checkpoint --out DIR [--family qwen2|qwen3|llama3|gemma3] [--seed 0]
    agentic-rl tiny-checkpoint DIR ...            (the same: the first argument is --out)

Writes config.json, model.safetensors, generation_config.json and the family's tokenizer
files (a BPE of ~800 tokens trained here, the family's chat template), with no download
and no torch/transformers: a model of the family's architecture small enough to train on
a CPU (d_model 64, 2 layers). `make demo ARGS="--model DIR"`, `agentic-rl generate
--model DIR` and transformers' `from_pretrained(DIR)` load it. Same flags, same files.
"""

from __future__ import annotations

import sys

from core import config
from core.config import configclass, knob
from localstack.fixtures.tiny_tokenizers import FAMILIES


@configclass(kw_only=True)
class TinyCheckpointConfig:
    out: str = knob(help="the checkpoint directory to write (created; existing files are overwritten)")
    family: str = knob("qwen2", "the architecture, tokenizer and chat template of this family", choices=FAMILIES)
    seed: int = knob(0, "seed of the random weights (the tokenizer is the same for every seed)")
    d_model: int = knob(64, "the model width (heads: 4 query, 2 key/value)")
    n_layers: int = knob(2, "the number of transformer layers", ge=1)

    def __post_init__(self):
        if self.d_model < 8 or self.d_model % 8:
            raise ValueError(f"d_model must be a positive multiple of 8, got {self.d_model}")


def run(cfg: TinyCheckpointConfig) -> dict:
    from core.policy.formats.hf_config import read_hf_config
    from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint

    out = write_tiny_checkpoint(cfg.out, cfg.family, seed=cfg.seed, d_model=cfg.d_model, n_layers=cfg.n_layers)
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    return {"out": str(out), "family": cfg.family, "vocab_size": read_hf_config(out).vocab_size, "files": files}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-"):  # `tiny-checkpoint DIR`: DIR is --out
        argv = [f"--out={argv[0]}", *argv[1:]]
    cfg = config.parse(TinyCheckpointConfig, argv, description=__doc__, prog="agentic-rl tiny-checkpoint")
    try:
        result = run(cfg)
    except (ValueError, OSError) as e:
        print(f"agentic-rl tiny-checkpoint: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote a tiny random {result['family']} checkpoint to {result['out']} "
        f"(vocab_size {result['vocab_size']}): {', '.join(result['files'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
