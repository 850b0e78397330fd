"""`agentic-rl export`: a published policy version as a Hugging Face checkpoint directory.

    agentic-rl export --store STORE [--version V] --out DIR

Writes config.json, model.safetensors, generation_config.json and the tokenizer files
(copied from the checkpoint the policy was trained from; the byte tokenizer has none), so
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from core import config
from core.config import configclass, knob
from core.contracts.store import StoreError
from core.staged_dir import refuse_non_empty, staged_dir


@configclass(kw_only=True)
class ExportConfig:
    store: str = knob(help="policy store root: a directory or gs://…")
    version: int | None = knob(None, "the version to export (unset: LATEST)", ge=0)
    out: str = knob(help="the checkpoint directory to write (written whole, then moved into place)")
    overwrite: bool = knob(False, "replace an existing non-empty --out")


def run(cfg: ExportConfig) -> dict:
    from core.policy.hf_export import export_checkpoint
    from core.policy.sources import STORE_PREFIX, load_policy

    refuse_non_empty(Path(cfg.out), cfg.overwrite, "export --overwrite")
    spec = f"{STORE_PREFIX}{cfg.store}" + ("" if cfg.version is None else f"@{cfg.version}")
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
    files = ", ".join(result["tokenizer_files"]) or "none (byte tokenizer)"
    print(f"exported version {result['version']} to {result['out']}; tokenizer files: {files}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
