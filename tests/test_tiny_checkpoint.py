"""`agentic-rl tiny-checkpoint` (localstack/fixtures/tiny_checkpoint.py): a tiny random
checkpoint of each family, written without torch/transformers, loads here and in
transformers with the same logits; its tokenizer handles what the agent loop renders."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from agentic_rl import cli
from core.policy.formats.hf_config import hf_family, read_hf_config
from core.policy.model.config import FULL, SLIDING
from core.policy.sources import load_policy
from core.policy.text.tokenizer import load_tokenizer
from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint
from localstack.fixtures.tiny_tokenizers import AGENT_TOOLS, FAMILIES
from tests import _chat_templates as chats
from tests import _hf_tiny as tiny

CALC_PROMPT = "Compute 12*(3+4)."
# family -> what its config.json must say
FEATURES = {
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, head_dim=16),
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=True, head_dim=32),
    "llama3": dict(model_type="llama", tie_word_embeddings=False, rope_scaling={"rope_type": "llama3"}),
    "gemma3": dict(model_type="gemma3_text", tie_word_embeddings=True, layer_types=[SLIDING, FULL]),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {family: write_tiny_checkpoint(root / family, family) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tiny_checkpoint_loads_here_and_in_transformers_with_the_same_logits(checkpoints, family):
    path = checkpoints[family]
    policy = load_policy(path)  # checks the tokenizer's vocabulary against the embedding
    cfg, tok = policy.cfg, policy.tokenizer
    assert tok.chat_template and tok.eos_ids
    assert cfg.vocab_size % 8 == 0 and tok.vocab_size <= cfg.vocab_size < tok.vocab_size + 8
    assert cfg.max_seq_len >= 2048 and cfg.n_kv_heads < cfg.n_heads and (cfg.d_model, cfg.n_layers) == (64, 2)
    config = json.loads((path / "config.json").read_text())
    for key, want in FEATURES[family].items():
        got = config[key]
        assert (got | want if isinstance(want, dict) else want) == got, key  # a dict: the keys it names
    assert hf_family(cfg) == config["model_type"] and read_hf_config(path) == cfg
    assert cfg.qkv_bias == (family == "qwen2") and cfg.qk_norm == (family in ("qwen3", "gemma3"))

    ids = tok.encode_chat(chats.chat("Be brief.", CALC_PROMPT), add_generation_prompt=True)
    tokens = jnp.asarray([ids])
    ours = np.asarray(policy.model(tokens, jnp.ones_like(tokens), jnp.arange(len(ids))[None]))
    with torch.no_grad():
        theirs = tiny.load_hf(path)(torch.tensor([ids])).logits.numpy()
    assert ours.shape == theirs.shape == (1, len(ids), cfg.vocab_size)
    assert np.abs(theirs).max() > 0.1  # random weights, not zeros
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_weights(tmp_path):
    a, b, c = (write_tiny_checkpoint(tmp_path / n, "qwen2", seed=s) for n, s in (("a", 0), ("b", 0), ("c", 1)))
    files = sorted(p.name for p in a.iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files
    assert files == sorted(p.name for p in b.iterdir()) == sorted(p.name for p in c.iterdir())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
        same = (a / name).read_bytes() == (c / name).read_bytes()
        assert same == (name != "model.safetensors"), name  # the tokenizer does not depend on the seed


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_round_trips_what_the_agent_loop_writes(checkpoints, family):
    tok = load_tokenizer(checkpoints[family])
    call = json.dumps({"name": "calc", "arguments": {"expression": "12*(3+4)"}})
    code = "def f(s): return s[::-1]\nprint(f('abc'))"
    for text in (CALC_PROMPT, call, code, "Guess my number in 1..100. ", "naïve 数学 ∑ \x00 \U0001f600"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text, (family, text)
    assert len(tok.encode(CALC_PROMPT)) <= 10  # learned pieces, not bytes


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama3"])  # gemma3's template has no tools block
def test_a_chat_with_a_tools_block_is_a_few_hundred_tokens(checkpoints, family):
    tok = load_tokenizer(checkpoints[family])
    one_tool = tok.encode_chat(chats.chat(None, CALC_PROMPT), tools=AGENT_TOOLS[:1], add_generation_prompt=True)
    print(f"{family}: {CALC_PROMPT!r} with a one-tool (calc) tools block: {len(one_tool)} tokens")
    assert 50 < len(one_tool) <= 250
    tests_tools = tok.encode_chat(chats.tool_chat(), tools=chats.TOOLS, add_generation_prompt=True)
    assert len(tests_tools) <= 500
    text = tok.render_chat(chats.chat(None, CALC_PROMPT), tools=AGENT_TOOLS[:1], add_generation_prompt=True)
    assert len(text) / len(one_tool) > 3  # characters per token: the tools block's text was learned


def test_the_cli_writes_a_checkpoint_at_a_positional_or_flag_path(tmp_path, capsys):
    assert cli.main(["tiny-checkpoint", str(tmp_path / "pos"), "--family=qwen3", "--seed=3"]) == 0
    assert "qwen3" in capsys.readouterr().out
    assert cli.main(["tiny-checkpoint", f"--out={tmp_path / 'flag'}", "--family=qwen3", "--seed=3"]) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (tmp_path / "pos" / name).read_bytes() == (tmp_path / "flag" / name).read_bytes(), name
    assert read_hf_config(tmp_path / "pos").qk_norm
    with pytest.raises(SystemExit):
        cli.main(["tiny-checkpoint", str(tmp_path / "bad"), "--family=gpt2"])
    assert "invalid choice" in capsys.readouterr().err
