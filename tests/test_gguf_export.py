"""`agentic-rl export --format gguf` (core/policy/formats/gguf_export.py) against the project's own
import and against transformers' GGUF loading.

A tiny random Llama checkpoint (tests/_hf_tiny.py, default RoPE) with the Llama 3 tiny
tokenizer and chat template (tests/_hf_tokenizers.py) is published to a policy store and
exported as F32, F16 and Q8_0:
  - round trip: `agentic-rl import-gguf` of the F32 file gives back every weight bit-equal,
    the same config, the tokenizer's ids on a corpus, bos/eos ids and the chat template;
  - oracle: transformers' `from_pretrained(dir, gguf_file=...)` computes the project
    model's logits (F32: atol 1e-4; F16: atol 3e-2) and the same greedy ids;
  - Q8_0: the imported file's log-probs of a sequence's tokens are within 0.1 nats of the
    F32 model's (0.25 over the whole vocabulary), and transformers reads the same
    dequantised weights (atol 1e-4 on logits).
qwen2 and qwen3 (F32) and the built-in byte policy are checked the same way, more briefly;
then the refusals (types, architectures, features, tokenizers, files).
"""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from agentic_rl import cli
from core.contracts.store import PolicyStore
from core.policy.formats import gguf_export
from core.policy.formats.gguf_reader import permute_rows, read_gguf
from core.policy.formats.hf_config import read_hf_config
from core.policy.model.config import ModelConfig, RopeConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.sources import load_policy, policy_metadata
from core.policy.text.hf_tokenizer import HFTokenizer
from core.policy.text.tokenizer import BYTE_TOKENIZER
from localstack.fixtures.tiny_tokenizers import CORPUS
from tests import _hf_tiny as tiny
from tests import _hf_tokenizers as toks

TOKENIZERS = {"llama": "llama3", "qwen2": "qwen2", "qwen3": "qwen3"}
# transformers' GGUF config has no key_length for qwen3 (it assumes 128): given here.
HF_OVERRIDES = {"qwen3": {"head_dim": 16}}
IDS = [5, 17, 42, 9, 100, 3, 77, 8, 250, 11]
# Max abs logit difference against transformers (measured 2026-12-07 on the tiny Llama:
# F32 2.5e-6, F16 3.2e-3; qwen2/qwen3 F32 4.8e-6/2.6e-6).
TOL = {"f32": 1e-4, "f16": 3e-2}
# Q8_0 against F32, max abs log-prob difference (nats): of the sequence's tokens (measured
# 0.049), of every vocabulary entry at every position (measured 0.104). Q8_0's error is
# about 30 times F16's here, as on SmolLM2 (slow tier: 0.35 nats at worst on a chat).
Q8_LOGP_TOL, Q8_LOGP_TOL_ALL = 0.1, 0.25


def checkpoint(root, family: str):
    """A tiny random checkpoint of `family` with its tokenizer files (default RoPE)."""
    tok, *_ = toks.build(TOKENIZERS[family])
    overrides = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "max_position_embeddings": 1024}
    if family == "llama":  # _hf_tiny's llama has llama3 RoPE of 16 original positions: refused (below)
        overrides["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    path = root / family
    tiny.save(tiny.hf_model(family, overrides=overrides), path)
    toks.write(path, TOKENIZERS[family], layout="jinja")
    return path


def publish(policy_or_cfg, root, params=None, tokenizer_source="byte"):
    store = PolicyStore(str(root))
    if params is None:
        policy = policy_or_cfg
        params = nnx.to_pure_dict(split_params(policy.model)[1])
        store.publish(0, params, policy_metadata(policy.cfg, policy.tokenizer_source))
    else:
        store.publish(0, params, policy_metadata(policy_or_cfg, tokenizer_source))
    return root


def export(*argv) -> None:
    assert cli.main(["export", "--format=gguf", *argv]) == 0


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids, jnp.ones_like(ids), jnp.arange(ids.shape[1])[None])


def logits(model, ids) -> np.ndarray:
    """The project model's logits [T, vocab] (one compile per config and length)."""
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, np.array([ids], np.int32))[0], np.float64)


def hf_gguf(path, family="llama"):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, **HF_OVERRIDES.get(family, {})
    )
    return model.eval()


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(hf_logits(model, ids)[-1])))
    return ids[len(prompt) :]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def texts(tok) -> list[str]:
    return list(CORPUS) + [f"{s}hi {s}\n{s}" for s in tok.special_tokens]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(policy, {type: exported file}) of the tiny Llama, exported from a store (f32,
    q8_0) and from the checkpoint directory (f16)."""
    root = tmp_path_factory.mktemp("llama")
    path = checkpoint(root, "llama")
    policy = load_policy(path)
    store = publish(policy, root / "store")
    files = {t: root / "gguf" / f"tiny-{t}.gguf" for t in ("f32", "f16", "q8_0")}
    export(f"--store={store}", "--gguf_type=f32", f"--out={files['f32']}")
    export(f"--store={store}", "--version=0", "--gguf_type=q8_0", f"--out={files['q8_0']}")
    export(f"--model={path}", f"--out={files['f16']}")  # f16: the default type
    return policy, files


def test_f32_export_imports_back_bit_equal(llama, tmp_path):
    policy, files = llama
    out = tmp_path / "back"
    assert cli.main(["import-gguf", str(files["f32"]), f"--out={out}"]) == 0
    assert read_hf_config(out) == policy.cfg
    original = load_file(Path(policy.source) / "model.safetensors")
    back = load_file(out / "model.safetensors")
    assert set(back) == set(original)
    for key, x in original.items():
        assert np.array_equal(back[key].view(np.uint32), x.view(np.uint32)), key
    got, want = (nnx.to_pure_dict(split_params(p.model)[1]) for p in (load_policy(out), policy))
    jax.tree.map(np.testing.assert_array_equal, got, want)

    tok = HFTokenizer(out)
    for text in texts(policy.tokenizer):
        assert tok.encode(text) == policy.tokenizer.encode(text), repr(text)
        assert tok.encode(text, add_special_tokens=True) == policy.tokenizer.encode(text, add_special_tokens=True)
    assert tok.bos_id == policy.tokenizer.bos_id and tok.eos_ids == policy.tokenizer.eos_ids
    assert tok.chat_templates == policy.tokenizer.chat_templates
    chat = [{"role": "user", "content": "What is 2+3?"}]
    assert tok.encode_chat(chat, add_generation_prompt=True) == policy.tokenizer.encode_chat(
        chat, add_generation_prompt=True
    )

    # transformers reads the same tokenizer out of the file (its own GGUF conversion).
    hf_tok = transformers.AutoTokenizer.from_pretrained(files["f32"].parent, gguf_file=files["f32"].name)
    for text in texts(policy.tokenizer):
        assert hf_tok(text, add_special_tokens=False).input_ids == policy.tokenizer.encode(text), repr(text)

    # In the file: llama.cpp's names and types, Q/K rows in ggml's interleaved order.
    model = read_gguf(files["f32"])
    raw = {t.name: t for t in gguf.GGUFReader(files["f32"]).tensors}
    assert model.metadata["general.architecture"] == "llama"
    assert {t.tensor_type for t in raw.values()} == {gguf.GGMLQuantizationType.F32}
    q = original["model.layers.0.self_attn.q_proj.weight"]
    k = original["model.layers.0.self_attn.k_proj.weight"]
    assert np.array_equal(np.asarray(raw["blk.0.attn_q.weight"].data), permute_rows(q, policy.cfg.n_heads))
    assert np.array_equal(np.asarray(raw["blk.0.attn_k.weight"].data), permute_rows(k, policy.cfg.n_kv_heads))
    assert not np.array_equal(np.asarray(raw["blk.0.attn_q.weight"].data), q)


@pytest.mark.parametrize("gguf_type", ["f32", "f16"])
def test_transformers_loads_the_export_with_our_logits_and_greedy_ids(llama, gguf_type):
    policy, files = llama
    hf = hf_gguf(files[gguf_type])
    assert hf.config.model_type == "llama" and hf.config.tie_word_embeddings is False
    ours = logits(policy.model, IDS)
    diff = np.abs(hf_logits(hf, IDS) - ours).max()
    assert diff < TOL[gguf_type], diff
    # Greedy: transformers' 8 greedy ids are, at each step, our model's argmax after the
    # same prefix, which is what our greedy decoding would pick (one forward, teacher-forced).
    prompt = IDS[:6]
    want = hf_greedy(hf, prompt, 8)
    ours = logits(policy.model, prompt + want)[len(prompt) - 1 : -1].argmax(-1)
    assert ours.tolist() == want


def test_q8_0_log_probs_are_close_to_f32(llama, tmp_path):
    policy, files = llama
    reader = gguf.GGUFReader(files["q8_0"])
    Q = gguf.GGMLQuantizationType
    assert {t.tensor_type for t in reader.tensors if len(t.shape) == 2} == {Q.Q8_0}
    assert {t.tensor_type for t in reader.tensors if len(t.shape) == 1} == {Q.F32}  # norms
    assert files["q8_0"].stat().st_size < files["f16"].stat().st_size < files["f32"].stat().st_size

    assert cli.main(["import-gguf", str(files["q8_0"]), f"--out={tmp_path / 'q8'}"]) == 0
    q8 = load_policy(tmp_path / "q8")
    ids = policy.tokenizer.encode("What is 37 * 41? The answer is 1517, said the calculator.")
    want = log_softmax(logits(policy.model, ids))
    got = log_softmax(logits(q8.model, ids))
    picked = np.arange(len(ids) - 1), np.array(ids[1:])
    diff = np.abs(got[picked] - want[picked]).max()
    assert 0 < diff < Q8_LOGP_TOL, diff
    assert np.abs(got - want).max() < Q8_LOGP_TOL_ALL
    # transformers dequantises the same bytes: its logits are our model's on the import.
    assert np.abs(hf_logits(hf_gguf(files["q8_0"]), ids) - logits(q8.model, ids)).max() < 1e-4


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_families_export_to_transformers_and_back(family, tmp_path):
    path = checkpoint(tmp_path, family)
    policy = load_policy(path)
    out = tmp_path / f"{family}.gguf"
    export(f"--model={path}", "--gguf_type=f32", f"--out={out}")
    assert read_gguf(out).metadata["general.architecture"] == family
    diff = np.abs(hf_logits(hf_gguf(out, family), IDS) - logits(policy.model, IDS)).max()
    assert diff < TOL["f32"], diff
    assert cli.main(["import-gguf", str(out), f"--out={tmp_path / 'back'}"]) == 0
    assert read_hf_config(tmp_path / "back") == policy.cfg
    tok = HFTokenizer(tmp_path / "back")
    assert all(tok.encode(t) == policy.tokenizer.encode(t) for t in texts(policy.tokenizer))
    assert tok.eos_ids == policy.tokenizer.eos_ids and tok.pad_id == policy.tokenizer.pad_id


def test_the_built_in_byte_policy_exports(tmp_path, capsys):
    cfg = ModelConfig()
    model = init_model(cfg, seed=3)
    store = publish(cfg, tmp_path / "store", params=nnx.to_pure_dict(split_params(model)[1]))
    out = tmp_path / "byte.gguf"
    assert cli.main(["export", f"--store={store}", "--format=gguf", "--gguf_type=f32", f"--out={out}"]) == 0
    assert f"exported version 0 to {out} (GGUF llama, f32)" in capsys.readouterr().out
    ids = list("What is 2+3? ½".encode())
    diff = np.abs(hf_logits(hf_gguf(out), ids) - logits(model, ids)).max()
    assert diff < TOL["f32"], diff
    assert cli.main(["import-gguf", str(out), f"--out={tmp_path / 'back'}"]) == 0
    back = load_policy(tmp_path / "back")  # the byte tokenizer as a byte-level BPE
    assert back.cfg == cfg
    for text in CORPUS + ["Größe 数学 🤖 \x00\x7f"]:
        assert back.tokenizer.encode(text) == list(text.encode()), repr(text)
        assert back.tokenizer.encode(text, add_special_tokens=True) == [256, *text.encode()]
        assert back.tokenizer.decode(list(text.encode())) == text
    assert back.tokenizer.bos_id == 256 and back.tokenizer.eos_ids == (257,) and back.tokenizer.pad_id == 258


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gguf_type", "says"),
    [
        ("q4_k", "gguf.quants can dequantise K-quants but not write them"),
        ("q3", "gguf_type 'q3' is not supported; supported: f32, f16, q8_0"),
    ],
)
def test_an_unsupported_type_is_refused_before_anything_is_read(gguf_type, says, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    argv = ["export", f"--store={tmp_path / 'no-store'}", "--format=gguf", f"--gguf_type={gguf_type}", f"--out={out}"]
    assert cli.main(argv) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_q4_k_cannot_be_written_by_the_gguf_package():
    # Why Q4_K is refused: the gguf package dequantises K-quants but has no quantiser for
    # them. Should a release add one, this fails, and Q4_K can join gguf_export.TYPES.
    with pytest.raises(NotImplementedError):
        gguf.quants.quantize(np.zeros((1, 256), np.float32), gguf.GGMLQuantizationType.Q4_K)


def test_an_unsupported_architecture_is_refused(tmp_path, capsys):
    gemma = ModelConfig(
        vocab_size=264, head_size=16, qk_norm=True, activation="gelu_pytorch_tanh", norm_offset=True,
        sandwich_norms=True, embed_scale=True, query_pre_attn_scalar=16.0,
    )  # fmt: skip
    store = publish(gemma, tmp_path / "store", params=nnx.to_pure_dict(split_params(init_model(gemma))[1]))
    out = tmp_path / "g.gguf"
    assert cli.main(["export", f"--store={store}", "--format=gguf", f"--out={out}"]) == 2
    err = capsys.readouterr().err
    assert "architecture gemma3_text: GGUF export is not supported; supported: llama, qwen2, qwen3" in err
    assert not out.exists() and not list(tmp_path.glob(".g.gguf.*"))


@pytest.mark.parametrize(
    ("cfg", "says"),
    [
        (
            ModelConfig(rope=RopeConfig(base=500000.0, kind="llama3", factor=8.0, original_max_position=16)),
            "16 original positions: a GGUF file stores only the divisors",
        ),
        (
            ModelConfig(qkv_bias=True, layer_types=("full_attention", "sliding_attention"), sliding_window=8),
            "qwen2 with sliding-window layers",
        ),
        (ModelConfig(qk_norm=True, rope=RopeConfig(kind="llama3", factor=8.0)), "which only llama reads"),
    ],
)
def test_features_a_gguf_file_cannot_state_are_refused(cfg, says):
    with pytest.raises(ValueError, match=says):
        gguf_export.check_arch(cfg)


def test_llama3_rope_with_meta_constants_reads_back(tmp_path):
    cfg = ModelConfig(rope=RopeConfig(base=500000.0, kind="llama3", factor=8.0))
    gguf_export.export_gguf(tmp_path / "m.gguf", cfg, init_model(cfg), BYTE_TOKENIZER, "f32")
    assert read_gguf(tmp_path / "m.gguf").cfg == cfg  # as rope_freqs.weight


def test_rows_that_are_not_whole_q8_0_blocks_stay_f16(tmp_path):
    cfg = ModelConfig(d_model=48, n_heads=4, n_kv_heads=2, mlp_dim=64)  # rows of 48: not 32s
    done = gguf_export.export_gguf(tmp_path / "m.gguf", cfg, init_model(cfg), BYTE_TOKENIZER, "q8_0")
    assert done.tensor_types["blk.0.ffn_down.weight"] == "Q8_0"  # rows of 64
    assert done.tensor_types["blk.0.attn_q.weight"] == done.tensor_types["token_embd.weight"] == "F16"
    assert set(done.f16_fallback) == {n for n, t in done.tensor_types.items() if t == "F16"}
    assert "blk.1.attn_output.weight" in done.f16_fallback and read_gguf(done.path).cfg == cfg


def test_an_export_that_fails_midway_leaves_no_file(tmp_path, monkeypatch):
    cfg = ModelConfig()
    written = []

    def data(self):
        if len(written) == 3:
            raise ValueError("stopped")
        written.append(self.name)
        return real(self)

    real = gguf_export._Tensor.data
    monkeypatch.setattr(gguf_export._Tensor, "data", data)
    with pytest.raises(ValueError, match="stopped"):
        gguf_export.export_gguf(tmp_path / "m.gguf", cfg, init_model(cfg), BYTE_TOKENIZER, "f32")
    assert len(written) == 3 and list(tmp_path.iterdir()) == []


def test_a_sentencepiece_tokenizer_is_refused(tmp_path):
    toks.write(tmp_path, "gemma3")
    tok = HFTokenizer(tmp_path)
    with pytest.raises(ValueError, match=r"SentencePiece-style BPE .* is not supported"):
        gguf_export.tokenizer_metadata(tok, tok.vocab_size)


def test_file_handling_and_flag_refusals(llama, tmp_path, capsys):
    policy, files = llama
    src = f"--model={Path(policy.source)}"
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    assert cli.main(["export", src, "--format=gguf", f"--out={out}"]) == 2
    assert "exists; remove it (export --overwrite replaces it)" in capsys.readouterr().err
    assert out.read_bytes() == b"old"
    assert cli.main(["export", src, "--format=gguf", "--gguf_type=q8_0", "--overwrite", f"--out={out}"]) == 0
    same = zip(gguf.GGUFReader(out).tensors, gguf.GGUFReader(files["q8_0"]).tensors)
    assert all(np.array_equal(a.data, b.data) for a, b in same)  # from the directory as from the store
    assert read_gguf(out).metadata["general.name"] == "agentic-rl policy llama"
    assert read_gguf(files["q8_0"]).metadata["general.name"] == "agentic-rl policy store v0"
    assert not list(tmp_path.glob(".m.gguf.*"))
    for argv, says in [
        ([src, "--gguf_type=f16", f"--out={tmp_path / 'hf'}"], "--gguf_type applies to --format gguf only"),
        ([f"--out={tmp_path / 'x'}"], "give one of --store"),
        ([src, f"--store={tmp_path}", f"--out={tmp_path / 'x'}"], "give one of --store"),
        ([src, "--version=1", f"--out={tmp_path / 'x'}"], "a --model directory has none"),
    ]:
        assert cli.main(["export", *argv]) == 2
        assert says in capsys.readouterr().err


# -- the real model (slow tier) ------------------------------------------------------------


@pytest.mark.slow
def test_real_smollm2_exports_to_what_transformers_computes(tmp_path):
    """SmolLM2-135M-Instruct as `agentic-rl real-model` leaves it (imported from its Q4_1
    GGUF), exported F16 and Q8_0 (2026-12-07: F32 max abs logit difference 1.3e-4; log-prob
    of the chat's tokens off by at most 0.016 in F16, 0.35 in Q8_0; greedy ids equal)."""
    from agentic_rl import real_model

    source = Path(real_model.OUT).expanduser()
    if not (source / "model.safetensors").is_file():
        pytest.skip(f"{source} is not there: run `agentic-rl real-model` first")
    policy = load_policy(source)
    chat = [{"role": "user", "content": "What is 37 * 41?"}]
    ids = policy.tokenizer.encode_chat(chat, add_generation_prompt=True)
    ours = log_softmax(logits(policy.model, ids))
    picked = np.arange(len(ids) - 1), np.array(ids[1:])
    for gguf_type, tol in (("f16", 0.05), ("q8_0", 0.75)):
        out = tmp_path / f"smol-{gguf_type}.gguf"
        export(f"--model={source}", f"--gguf_type={gguf_type}", f"--out={out}")
        hf = hf_gguf(out)
        diff = np.abs(log_softmax(hf_logits(hf, ids))[picked] - ours[picked]).max()
        assert diff < tol, (gguf_type, diff)
        want = hf_greedy(hf, ids, 8)
        assert logits(policy.model, ids + want)[len(ids) - 1 : -1].argmax(-1).tolist() == want, gguf_type
        del hf
        out.unlink()
