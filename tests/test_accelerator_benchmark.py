"""benchmarks/accelerator.py's CPU case (what CI can run of it): every section produces its
rows with the project's own Learner and Sampler, and the result names the device it measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import accelerator


def test_the_tiny_case_measures_every_section_and_names_its_device(tmp_path, capsys):
    out = tmp_path / "accelerator.json"
    assert accelerator.main(["--tiny", "--steps", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu (cpu)" and result["peak"]["matmul_flops"] > 0
    learner = {r["label"]: r for r in result["learner"]}
    assert all("error" not in r and "refused" not in r for r in learner.values()), learner
    for r in learner.values():
        assert r["tokens_per_s"] > 0 and r["model_flops"] > 0 and r["layout"].startswith("remat off")
    assert learner["tiny 2 x 256, 2 segments"]["dtype"] == "bfloat16"  # the modes it was asked for
    assert learner["tiny 2 x 256, 2 segments"]["attention"] == "splash"
    (engine,) = result["engine"]
    assert "error" not in engine, engine
    # Every view decoded, and the bound is the shapes' (weights + the whole cache a step).
    assert engine["loop_tokens_per_s"] > 0 and engine["call_tokens_per_s"] > 0 and engine["engine_tokens_per_s"] > 0
    assert engine["engine_stats"]["generated_tokens"] == 4 * 16
    assert engine["bound_full_tokens_per_s"] < engine["bound_filled_tokens_per_s"]
    assert "2. Learner on cpu" in capsys.readouterr().out
