"""`agentic-rl import-gguf`: a llama.cpp GGUF file as a Hugging Face checkpoint directory.

    agentic-rl import-gguf FILE.gguf --out DIR [--dtype float32|bfloat16] [--overwrite]
    agentic-rl import-gguf --file FILE.gguf --out DIR ...      (the same)

Writes config.json, model.safetensors (dequantised), tokenizer.json, tokenizer_config.json
(with the chat template) and generation_config.json, which `--model DIR` and transformers'
`from_pretrained(DIR)` load. Architectures: llama, qwen2, qwen3, gemma3 (text); weights in
F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K or Q6_K. Anything else is refused by name, before
DIR is created (core/policy/formats/gguf_import.py).
"""

from __future__ import annotations

import sys

from core import config
from core.config import configclass, knob


@configclass(kw_only=True)
class ImportGGUFConfig:
    file: str = knob(help="the GGUF file to read")
    out: str = knob(help="the checkpoint directory to write (an existing, non-empty one needs --overwrite)")
    dtype: str = knob("float32", "the weights' dtype in model.safetensors", choices=("float32", "bfloat16"))
    overwrite: bool = knob(False, "replace an existing --out directory (once the new one is complete)")


def run(cfg: ImportGGUFConfig) -> dict:
    from core.policy.formats.gguf_import import import_gguf
    from core.policy.formats.hf_config import read_hf_config

    out = import_gguf(cfg.file, cfg.out, dtype=cfg.dtype, overwrite=cfg.overwrite)
    model = read_hf_config(out)  # the written config reads back as the loaders will read it
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    return {"out": str(out), "layers": model.n_layers, "vocab_size": model.vocab_size, "files": files}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-"):  # `import-gguf FILE ...`: FILE is --file
        argv = [f"--file={argv[0]}", *argv[1:]]
    cfg = config.parse(ImportGGUFConfig, argv, description=__doc__, prog="agentic-rl import-gguf")
    try:
        result = run(cfg)
    except (ValueError, OSError) as e:
        print(f"agentic-rl import-gguf: {e}", file=sys.stderr)
        return 2
    print(
        f"imported {cfg.file} to {result['out']} ({cfg.dtype}, {result['layers']} layers, "
        f"vocab_size {result['vocab_size']}): {', '.join(result['files'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
