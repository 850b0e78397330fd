"""`agentic-rl generate`: sample from a Hugging Face checkpoint or a published policy version.

    agentic-rl generate --model M (--prompt TEXT | --messages FILE.json) [--max_new_tokens N]
                        [--greedy] [--temperature T] [--json]

M is a checkpoint directory or `store:PATH[@VERSION]`. FILE.json holds
{"messages": [...], "tools": [...]} in the HF chat format, rendered with the checkpoint's
chat template and the generation prompt; --prompt is raw text, encoded without added
special tokens. Generation stops at the checkpoint's eos ids or after N tokens. --json
prints one object: prompt_ids, ids (generated), logprobs (each generated token's natural
log-probability at temperature 1), text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from core import config
from core.config import configclass, knob
from core.contracts.store import StoreError


@configclass(kw_only=True)
class GenerateConfig:
    model: str = knob(help="a Hugging Face checkpoint directory, or store:PATH[@VERSION] (a policy store)")
    prompt: str | None = knob(None, "raw text, encoded without added special tokens")
    messages: str | None = knob(None, 'a JSON file {"messages": [...], "tools": [...]} for the chat template')
    max_new_tokens: int = knob(64, "stop after this many generated tokens (or at an eos id)", ge=1)
    greedy: bool = knob(False, "take the most likely token at each step instead of sampling")
    temperature: float = knob(1.0, "sampling temperature (the reported log-probs are at temperature 1)")
    seed: int = knob(0, "sampling seed")
    dtype: str = knob("float32", "weights of a checkpoint directory in this dtype", choices=("float32", "bfloat16"))
    as_json: bool = knob(False, "print one JSON object (prompt_ids, ids, logprobs, text)", flag="json")

    def __post_init__(self):
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (or --greedy), got {self.temperature}")


def read_messages(path: str) -> tuple[list, list | None]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--messages {path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError(f'--messages {path}: expected a JSON object {{"messages": [...], "tools": [...]}}')
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ValueError(f"--messages {path}: 'tools' must be a list")
    return data["messages"], tools


def prompt_ids(cfg: GenerateConfig, tokenizer) -> list[int]:
    if cfg.prompt is not None:
        return tokenizer.encode(cfg.prompt)
    messages, tools = read_messages(cfg.messages)
    return tokenizer.encode_chat(messages, tools=tools, add_generation_prompt=True)


def run(cfg: GenerateConfig) -> dict:
    # Here, not in __post_init__: the tree with neither set is the one its defaults build.
    if (cfg.prompt is None) == (cfg.messages is None):
        raise ValueError("give exactly one of --prompt and --messages")
    import jax.numpy as jnp

    from core.policy.sampling.generate import generate
    from core.policy.sources import load_policy

    policy = load_policy(cfg.model, dtype=jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32)
    ids = prompt_ids(cfg, policy.tokenizer)
    out = generate(
        policy.model,
        ids,
        max_new_tokens=cfg.max_new_tokens,
        eos_ids=tuple(policy.tokenizer.eos_ids),
        greedy=cfg.greedy,
        temperature=cfg.temperature,
        seed=cfg.seed,
    )
    text = policy.tokenizer.decode(out.ids)
    return {
        "prompt_ids": out.prompt_ids,
        "ids": out.ids,
        "logprobs": out.logprobs,
        "text": text,
        "stopped_by": out.stopped_by,
        "model": policy.source,
    }


def main(argv=None) -> int:
    cfg = config.parse(GenerateConfig, argv, description=__doc__, prog="agentic-rl generate")
    try:
        result = run(cfg)
    except (ValueError, OSError, StoreError) as e:
        print(f"agentic-rl generate: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if cfg.as_json else result["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
