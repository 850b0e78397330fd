"""`agentic-rl export`: a published policy version as a Hugging Face checkpoint directory,
or as one llama.cpp GGUF file.

    agentic-rl export --store STORE [--version V] --out DIR
    agentic-rl export --store STORE [--version V] --format gguf [--gguf_type f32|f16|q8_0] --out FILE.gguf
    agentic-rl export --model CHECKPOINT_DIR ...            (a checkpoint directory instead of a store)

--format hf (the default) writes config.json, model.safetensors, generation_config.json and
the tokenizer files (copied from the checkpoint the policy was trained from; the byte
tokenizer has none), so `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads it.
--format gguf writes FILE.gguf for llama.cpp, Ollama and LM Studio (core/policy/formats/gguf_export.py):
architectures llama, qwen2, qwen3; 2-D weights in F32, F16 (the default) or Q8_0, norms in
F32; the tokenizer and chat template as tokenizer.ggml.* metadata. `agentic-rl import-gguf`
reads it back.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from core import config
from core.config import configclass, knob
from core.contracts.store import StoreError
from core.staged_dir import refuse_non_empty, staged_dir

FORMATS = ("hf", "gguf")


@configclass(kw_only=True)
class ExportConfig:
    store: str | None = knob(None, "policy store root: a directory or gs://… (or --model)")
    version: int | None = knob(None, "the version to export (unset: LATEST)", ge=0)
    model: str | None = knob(None, "a checkpoint directory to export instead of a store version")
    out: str = knob(help="the checkpoint directory (hf) or .gguf file (gguf): written whole, then moved into place")
    format: str = knob("hf", "hf: a Hugging Face checkpoint directory; gguf: one llama.cpp GGUF file", choices=FORMATS)
    gguf_type: str | None = knob(None, "--format gguf: the 2-D weights' type, f32, f16 or q8_0 (unset: f16)")
    overwrite: bool = knob(False, "replace an existing non-empty --out")


def _spec(cfg: ExportConfig) -> str:
    from core.policy.sources import STORE_PREFIX

    if (cfg.store is None) == (cfg.model is None):
        raise ValueError("give one of --store (a policy store) and --model (a checkpoint directory)")
    if cfg.model is not None:
        if cfg.version is not None:
            raise ValueError("--version names a store version; a --model directory has none")
        return cfg.model
    return f"{STORE_PREFIX}{cfg.store}" + ("" if cfg.version is None else f"@{cfg.version}")


def run(cfg: ExportConfig) -> dict:
    from core.policy.formats.hf_export import export_checkpoint
    from core.policy.sources import load_policy

    spec = _spec(cfg)
    if cfg.format == "gguf":
        return _run_gguf(cfg, spec)
    if cfg.gguf_type is not None:
        raise ValueError("--gguf_type applies to --format gguf only")
    refuse_non_empty(Path(cfg.out), cfg.overwrite, "export --overwrite")
    policy = load_policy(spec)
    tok = policy.tokenizer
    copied = []
    # A kill midway leaves no --out, only a hidden sibling: never a half checkpoint.
    with staged_dir(cfg.out, "exporting") as tmp:
        export_checkpoint(tmp, policy.cfg, policy.model, bos_token_id=tok.bos_id, eos_token_id=_eos(tok))
        for src in map(Path, tok.files()):  # at the same place in the new directory as in the old
            rel = src.relative_to(policy.tokenizer_source)
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tmp / rel)
            copied.append(str(rel))
    return {"out": cfg.out, "version": policy.version, "tokenizer_files": copied}


def _run_gguf(cfg: ExportConfig, spec: str) -> dict:
    from core.policy.formats import gguf_export
    from core.policy.sources import load_policy

    gguf_type = cfg.gguf_type or "f16"
    gguf_export.check_type(gguf_type)  # before any weight is read
    out = Path(cfg.out)
    if out.is_dir() or (out.exists() and not cfg.overwrite):
        what = "is a directory" if out.is_dir() else "exists; remove it (export --overwrite replaces it)"
        raise ValueError(f"{out}: {what}")
    policy = load_policy(spec)
    name = f"agentic-rl policy {Path(cfg.store or cfg.model).name}"
    name += f" v{policy.version}" if policy.version is not None else ""
    done = gguf_export.export_gguf(out, policy.cfg, policy.model, policy.tokenizer, gguf_type, name, cfg.overwrite)
    return {
        "out": cfg.out,
        "version": policy.version,
        "source": policy.source,
        "format": "gguf",
        "arch": done.arch,
        "gguf_type": done.gguf_type,
        "f16_fallback": list(done.f16_fallback),
        "dropped_eos_ids": list(done.dropped_eos_ids),
    }


def _eos(tok):
    ids = list(tok.eos_ids)
    return None if not ids else ids[0] if len(ids) == 1 else ids


def main(argv=None) -> int:
    cfg = config.parse(ExportConfig, argv, description=__doc__, prog="agentic-rl export")
    try:
        result = run(cfg)
    except (ValueError, OSError, StoreError) as e:
        print(f"agentic-rl export: {e}", file=sys.stderr)
        return 2
    what = f"version {result['version']}" if result["version"] is not None else cfg.model
    if result.get("format") == "gguf":
        notes = ""
        if result["f16_fallback"]:
            notes += f"; F16, rows not whole Q8_0 blocks: {', '.join(result['f16_fallback'])}"
        if result["dropped_eos_ids"]:
            notes += f"; eos ids beyond GGUF's eos/eot/eom, not written: {result['dropped_eos_ids']}"
        print(f"exported {what} to {result['out']} (GGUF {result['arch']}, {result['gguf_type']}){notes}")
        return 0
    files = ", ".join(result["tokenizer_files"]) or "none (byte tokenizer)"
    print(f"exported {what} to {result['out']}; tokenizer files: {files}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
