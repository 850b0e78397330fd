"""`agentic-rl generate` and `agentic-rl export` against HF transformers, per family.

A tiny random checkpoint of each family (tests/_hf_tiny.py) with that family's tokenizer
files and chat template (tests/_hf_tokenizers.py) goes in; `generate` must print the prompt
ids, greedy ids and log-probs that transformers gives on the same directory, and a policy
store made from it must `export` to a directory that transformers loads with equal logits.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from agentic_rl import cli
from core.contracts.store import PolicyStore
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sources import load_policy, policy_metadata
from tests import _chat_templates as chats
from tests import _hf_tiny as tiny
from tests import _hf_tokenizers as toks

# model family -> tokenizer family
FAMILIES = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama3", "gemma3_text": "gemma3"}


def checkpoint(tmp_path, family: str):
    path = tmp_path / family
    tok, *_ = toks.build(FAMILIES[family])
    vocab = tok.get_vocab_size(with_added_tokens=True)
    model = tiny.hf_model(family, overrides={"vocab_size": vocab, "max_position_embeddings": 1024})  # the tools block
    tiny.save(model, path)
    toks.write(path, FAMILIES[family], layout="jinja")  # its generation_config.json: the eos ids
    return path


def conversation(family: str) -> dict:
    if family == "gemma3_text":  # Gemma's template refuses tool turns, as HF's does
        return {"messages": chats.chat("Be brief.", "Hi", "Hello!", "What is 2+3?")}
    return {"messages": chats.tool_chat(), "tools": chats.TOOLS}


def run_cli(capsys, *argv) -> dict:
    assert cli.main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def hf_logprobs(model, ids: list[int], n_prompt: int) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return np.array([logp[t - 1, ids[t]].item() for t in range(n_prompt, len(ids))])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_prints_what_transformers_computes(family, tmp_path, capsys):
    path = checkpoint(tmp_path, family)
    chat_file = tmp_path / "chat.json"
    chat_file.write_text(json.dumps(conversation(family)))
    got = run_cli(capsys, "generate", f"--model={path}", f"--messages={chat_file}", "--greedy", "--json",
                  "--max_new_tokens=12")  # fmt: skip

    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    c = conversation(family)
    want_prompt = hf_tok.apply_chat_template(
        c["messages"], tools=c.get("tools"), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert got["prompt_ids"] == list(want_prompt)

    model = tiny.load_hf(path)
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    out = model.generate(
        torch.tensor([want_prompt]), max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos[0]
    )
    want_ids = out[0, len(want_prompt) :].tolist()
    assert got["ids"] == want_ids
    assert got["stopped_by"] == ("eos" if want_ids[-1] in eos else "length")
    np.testing.assert_allclose(got["logprobs"], hf_logprobs(model, want_prompt + want_ids, len(want_prompt)), atol=2e-3)
    assert got["text"] == hf_tok.decode(want_ids, skip_special_tokens=True)


def test_raw_prompt_is_encoded_without_special_tokens_and_sampling_is_seeded(tmp_path, capsys):
    path = checkpoint(tmp_path, "llama")  # the one whose tokenizer adds a bos when asked
    text = "What is 2+3? Answer:"
    args = ("generate", f"--model={path}", f"--prompt={text}", "--json", "--max_new_tokens=6", "--temperature=0.7")
    a, b = run_cli(capsys, *args, "--seed=3"), run_cli(capsys, *args, "--seed=3")
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    assert a["prompt_ids"] == hf_tok(text, add_special_tokens=False)["input_ids"]
    assert a["ids"] == b["ids"] and len(a["ids"]) >= 1
    # Sampled at 0.7, reported at temperature 1: the learner's number for the same tokens.
    model = tiny.load_hf(path)
    np.testing.assert_allclose(a["logprobs"], hf_logprobs(model, a["prompt_ids"] + a["ids"], len(a["prompt_ids"])),
                               atol=2e-3)  # fmt: skip


def test_messages_need_a_chat_template(tmp_path, capsys):
    path = checkpoint(tmp_path, "qwen2")
    (path / "chat_template.jinja").unlink()
    chat_file = tmp_path / "chat.json"
    chat_file.write_text(json.dumps({"messages": chats.chat(None, "Hi")}))
    assert cli.main(["generate", f"--model={path}", f"--messages={chat_file}"]) == 2
    assert "has no chat template" in capsys.readouterr().err


def test_a_vocabulary_larger_than_the_embedding_is_refused_naming_both_files(tmp_path, capsys):
    path = tmp_path / "small-embedding"
    tiny.save(tiny.hf_model("qwen2"), path)  # vocab 300 < the tokenizer's
    toks.write(path, "qwen2", layout="jinja")
    assert cli.main(["generate", f"--model={path}", "--prompt=hi"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json" in err and "config.json" in err and "vocab_size" in err


def store_from(policy, root) -> PolicyStore:
    store = PolicyStore(str(root))
    params = nnx.to_pure_dict(split_params(policy.model)[1])
    store.publish(0, params, policy_metadata(policy.cfg, policy.tokenizer_source))
    return store


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_of_a_store_made_from_a_checkpoint_loads_in_transformers(family, tmp_path, capsys):
    path = checkpoint(tmp_path, family)
    policy = load_policy(path)
    store_from(policy, tmp_path / "store")
    out = tmp_path / "exported"
    assert cli.main(["export", f"--store={tmp_path / 'store'}", f"--out={out}"]) == 0, capsys.readouterr().err
    assert "exported version 0" in capsys.readouterr().out

    hf = tiny.load_hf(out)  # transformers loads it: no missing or unexpected keys
    ids = [5, 17, 42, 9, 100, 3, 77, 8, 250, 11]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    ours = policy.model(np.array([ids]), np.ones((1, len(ids)), np.int32), np.arange(len(ids))[None])
    np.testing.assert_allclose(np.asarray(ours[0]), want, atol=1e-4)
    # The tokenizer files came along: transformers' tokenizer from the export encodes as ours does.
    text = "Hello, 2+3 = 5!"
    assert transformers.AutoTokenizer.from_pretrained(out).encode(text, add_special_tokens=False) == (
        policy.tokenizer.encode(text)
    )
    # And the exported directory is a checkpoint this project loads back the same: its
    # config, tokenizer and every weight (the store's side: tests/test_store_readers_read_only.py).
    back = load_policy(out)
    assert back.cfg == policy.cfg and back.tokenizer.encode(text) == policy.tokenizer.encode(text)
    got, want = (nnx.to_pure_dict(split_params(p.model)[1]) for p in (back, policy))
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_the_built_in_byte_policy_exports_and_loads_in_transformers(tmp_path, capsys):
    cfg = ModelConfig()
    model = init_model(cfg, seed=3)
    store = PolicyStore(str(tmp_path / "store"))
    store.publish(0, nnx.to_pure_dict(split_params(model)[1]), policy_metadata(cfg))
    out = tmp_path / "exported"
    assert cli.main(["export", f"--store={tmp_path / 'store'}", "--version=0", f"--out={out}"]) == 0
    assert "tokenizer files: none (byte tokenizer)" in capsys.readouterr().out
    hf = tiny.load_hf(out)
    ids = list(b"What is 2+3?")
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    ours = model(np.array([ids]), np.ones((1, len(ids)), np.int32), np.arange(len(ids))[None])
    np.testing.assert_allclose(np.asarray(ours[0]), want, atol=1e-4)
