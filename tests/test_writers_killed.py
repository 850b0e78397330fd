"""Every writer of a checkpoint directory, SIGKILLed midway, leaves nothing a reader takes
for a checkpoint (issue 39): `import-gguf` and `export` write a hidden sibling that is
renamed into place at the end (core/staged_dir.py); a policy version is an Orbax tmp dir
until its commit marker, and LATEST moves last (core/contracts/store.py). The next run of
the same writer succeeds and removes what the killed one left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from agentic_rl import export
from core.contracts.store import PolicyStore
from core.policy.formats import gguf_import
from core.policy.model.transformer import split_params
from core.policy.sources import load_policy, policy_metadata
from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint
from tests import _gguf_tiny as tiny

pytestmark = pytest.mark.e2e  # each test kills a writer in a child process

ROOT = Path(__file__).resolve().parents[1]
PAUSE = """
import pathlib, time
def pause_after(fn, mark):
    def paused(*a, **k):
        out = fn(*a, **k)
        pathlib.Path(mark).write_text("paused")  # the parent SIGKILLs us here
        time.sleep(300)
        return out
    return paused
"""


def _killed_midway(script: str, ready, timeout_s: float = 120.0) -> None:
    """Runs `script` in a child and SIGKILLs it once `ready()` is true."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PAUSE) + textwrap.dedent(script)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert proc.poll() is None, f"the writer exited ({proc.returncode}) before it was killed"
            assert time.monotonic() < deadline, "the writer never reached the point to kill it at"
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _hidden(parent: Path, verb: str) -> list[Path]:
    return sorted(parent.glob(f".*.{verb}-*"))


def test_an_import_killed_midway_leaves_no_checkpoint_and_the_next_import_cleans_up(tmp_path):
    made = tiny.write(tmp_path / "model.gguf", "qwen2")
    out, mark = tmp_path / "models" / "out", tmp_path / "mark"
    _killed_midway(
        f"""
        from core.policy.formats import gguf_import
        gguf_import._write_json = pause_after(gguf_import._write_json, {str(mark)!r})  # weights written
        gguf_import.import_gguf({str(made.path)!r}, {str(out)!r})
        """,
        mark.exists,
    )
    assert not out.exists() and len(_hidden(out.parent, "importing")) == 1
    assert (_hidden(out.parent, "importing")[0] / "model.safetensors").is_file()  # killed mid-write
    with pytest.raises((FileNotFoundError, ValueError)):
        load_policy(str(out))
    gguf_import.import_gguf(made.path, out)
    assert gguf_import.is_complete(out) and _hidden(out.parent, "importing") == []


def test_an_overwriting_import_killed_midway_leaves_the_old_checkpoint_whole(tmp_path):
    made = tiny.write(tmp_path / "model.gguf", "qwen2")
    out, mark = tmp_path / "out", tmp_path / "mark"
    gguf_import.import_gguf(made.path, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _killed_midway(
        f"""
        from core.policy.formats import gguf_import
        gguf_import._write_json = pause_after(gguf_import._write_json, {str(mark)!r})
        gguf_import.import_gguf({str(made.path)!r}, {str(out)!r}, dtype="bfloat16", overwrite=True)
        """,
        mark.exists,
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_export_killed_midway_leaves_no_checkpoint_and_the_next_export_cleans_up(tmp_path):
    policy = load_policy(str(write_tiny_checkpoint(tmp_path / "ckpt", "qwen2")))
    store = PolicyStore(str(tmp_path / "store"))
    store.publish(
        0, nnx.to_pure_dict(split_params(policy.model)[1]), policy_metadata(policy.cfg, policy.tokenizer_source)
    )
    out, mark = tmp_path / "exported", tmp_path / "mark"
    _killed_midway(
        f"""
        import shutil
        from agentic_rl import export
        shutil.copy2 = pause_after(shutil.copy2, {str(mark)!r})  # weights and config written, tokenizer copying
        export.run(export.ExportConfig(store={str(tmp_path / "store")!r}, out={str(out)!r}))
        """,
        mark.exists,
    )
    assert not out.exists() and (_hidden(tmp_path, "exporting")[0] / "model.safetensors").is_file()
    with pytest.raises((FileNotFoundError, ValueError)):
        load_policy(str(out))
    done = export.run(export.ExportConfig(store=str(tmp_path / "store"), out=str(out)))
    assert done["version"] == 0 and load_policy(str(out)).cfg == policy.cfg
    assert _hidden(tmp_path, "exporting") == []
    with pytest.raises(ValueError, match="exists and is not empty"):  # nothing is overwritten unasked
        export.run(export.ExportConfig(store=str(tmp_path / "store"), out=str(out)))


def test_a_real_size_publish_killed_midway_is_never_read_and_is_republished(tmp_path):
    """SmolLM2-135M's size (135 M float32 parameters, 540 MB): Orbax writes for seconds, and
    the kill lands while its tmp dir is being filled."""
    root = tmp_path / "store"
    small = {"w": np.arange(8, dtype=np.float32)}
    PolicyStore(str(root)).publish(0, small)
    _killed_midway(
        f"""
        import numpy as np
        from core.contracts.store import PolicyStore
        params = {{f"layer{{i}}": np.full((4_500_000,), i, np.float32) for i in range(30)}}
        PolicyStore({str(root)!r}).publish(1, params)
        """,
        lambda: any(p.name.startswith("00000001") for p in (root / "policies").glob("*")),
    )
    store = PolicyStore(str(root))
    assert store.latest_version() == 0 and store.versions() == [0]
    version, params = store.load_latest({"w": np.zeros(8, np.float32)})
    assert version == 0 and np.array_equal(params["w"], small["w"])
    store.publish(1, {"w": small["w"] + 1})  # the restarted learner's publish replaces the leftover
    assert store.latest_version() == 1 and np.array_equal(store.load_latest(small)[1]["w"], small["w"] + 1)
