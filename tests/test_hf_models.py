"""Hugging Face checkpoints in and out, equal to transformers (PyTorch, CPU) on tiny random
configs of each family: logits, packed rows, cached decode, greedy tokens, both config
layouts, sharded files, bf16, export, and every refusal naming its file and key."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from core.policy.formats.hf_config import config_from_hf, read_hf_config
from core.policy.formats.hf_export import export_checkpoint, flat_params
from core.policy.formats.hf_weights import load_checkpoint
from core.policy.model.config import ModelConfig, check_vocab, model_config
from core.policy.model.rope import inverse_frequencies
from core.policy.model.transformer import init_model, split_params
from core.policy.text import tokenizer
from tests import _hf_tiny as tiny
from trainer.learning.step.sharding import make_mesh, param_shardings

FAMILIES = sorted(tiny.FAMILIES)
CACHE = 24  # one KV-cache length and batch 2 throughout: two compiled decode shapes per family
ATOL = 1e-4  # f32 logits against transformers


class Ours:
    """A loaded checkpoint with its jitted forward and decode (fixed shapes)."""

    def __init__(self, path, dtype=jnp.float32):
        self.cfg, model = load_checkpoint(path, dtype=dtype)
        self.graphdef, self.params = split_params(model)
        self.model = model
        self.forward = jax.jit(lambda p, t, s, q: nnx.merge(self.graphdef, p)(t, s, q))
        self.decode = jax.jit(lambda p, c, t, s: nnx.merge(self.graphdef, p).decode(t, s, c))

    def logits(self, tokens, segments=None, positions=None):
        tokens = np.asarray(tokens, np.int32)
        segments = np.ones_like(tokens) if segments is None else segments
        positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape) if positions is None else positions
        return np.asarray(self.forward(self.params, tokens, segments, positions.astype(np.int32)))

    def greedy(self, prompts, n_new: int, chunk: int = 8):
        """Prefill in chunks of `chunk`, then one token per step, as the sampler feeds the cache."""
        cache = self.model.init_cache(len(prompts), CACHE)
        seqs, fed = np.asarray(prompts), 0
        while seqs.shape[1] < len(prompts[0]) + n_new:
            width = chunk if seqs.shape[1] - fed >= chunk else 1
            start = np.full(len(seqs), fed, np.int32)
            logits, cache = self.decode(self.params, cache, seqs[:, fed : fed + width], start)
            fed += width
            if fed == seqs.shape[1]:
                seqs = np.concatenate([seqs, np.argmax(np.asarray(logits)[:, -1:], axis=-1)], axis=1)
        return seqs[:, len(prompts[0]) :]


def _hf_logits(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()


def _close(family, ours, ref, atol=ATOL):
    diff = float(np.abs(ours - ref).max())
    assert diff < atol, f"{family}: max |ours - HF| = {diff}"


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(family name, checkpoint dir, HF model as loaded back, ours)."""
    name = request.param
    path = tiny.save(tiny.hf_model(name), tmp_path_factory.mktemp(name))
    return name, path, tiny.load_hf(path), Ours(path)


def _ids(n, seed=0, batch=1):
    return np.random.default_rng(seed).integers(3, tiny.VOCAB, (batch, n))


def test_logits_match_hf(family):
    name, _, hf, ours = family
    ids = _ids(20, batch=2)
    _close(name, ours.logits(ids), _hf_logits(hf, ids))


def test_packed_row_matches_each_segment_alone(family):
    """Two trajectories packed in one row (plus padding) score as each does alone in HF."""
    name, _, hf, ours = family
    a, b = _ids(13, seed=1)[0], _ids(11, seed=2)[0]
    tokens, seg, pos = (np.zeros((1, 32), np.int32) for _ in range(3))
    tokens[0, :13], tokens[0, 13:24] = a, b
    seg[0, :13], seg[0, 13:24] = 1, 2
    pos[0, :13], pos[0, 13:24] = np.arange(13), np.arange(11)
    packed = ours.logits(tokens, seg, pos)[0]
    _close(name, packed[:13], _hf_logits(hf, a[None])[0])
    _close(name, packed[13:24], _hf_logits(hf, b[None])[0])


def test_cached_decode_matches_full_forward(family):
    """A prefill chunk, then one-token steps, through the KV cache: the full forward's logits,
    with two compiled shapes only."""
    name, _, _, ours = family
    ids = _ids(20, seed=3, batch=2)
    full = ours.logits(ids)
    cache = ours.model.init_cache(2, CACHE)
    got, cache = ours.decode(ours.params, cache, ids[:, :8], np.zeros(2, np.int32))
    steps = [np.asarray(got)]
    for t in range(8, 20):
        got, cache = ours.decode(ours.params, cache, ids[:, t : t + 1], np.full(2, t, np.int32))
        steps.append(np.asarray(got))
    _close(name, np.concatenate(steps, axis=1), full)
    assert ours.decode._cache_size() == 2


def test_greedy_tokens_match_hf_generate(family):
    _, _, hf, ours = family
    prompts = _ids(10, seed=4, batch=2)
    with torch.no_grad():
        out = hf.generate(torch.tensor(prompts), do_sample=False, max_new_tokens=8, pad_token_id=0)
    assert ours.greedy(prompts, 8).tolist() == out[:, 10:].tolist()
    assert ours.decode._cache_size() == 2


def test_config_layouts_read_the_same(family):
    """transformers 5's rope_parameters and the top-level rope_theta + rope_scaling layout of
    real checkpoints read to one ModelConfig."""
    _, path, _, ours = family
    d = json.loads((path / "config.json").read_text())
    assert "rope_parameters" in d
    legacy = tiny.legacy_layout(d)
    assert "rope_parameters" not in legacy and "rope_theta" in legacy
    assert config_from_hf(legacy) == config_from_hf(d) == read_hf_config(path) == ours.cfg
    # A policy store's manifest holds the config as JSON (ModelConfig.to_dict) and reads it back.
    assert ModelConfig.from_dict(json.loads(json.dumps(ours.cfg.to_dict()))) == ours.cfg


@pytest.mark.parametrize("name", sorted(tiny.REAL_CONFIGS))
def test_real_checkpoint_configs_read_as_transformers_reads_them(name):
    """Real checkpoints' config.json: the shapes, layer types and windows transformers sees,
    and per layer the same RoPE frequencies (llama3 and linear scaling included) to 2 ulp:
    torch's float32 pow is itself 1-2 ulp off the correctly rounded value in a few places,
    by the CPU's vector unit (2 on an AVX-512 machine, 2026-12-05)."""
    d = tiny.REAL_CONFIGS[name]
    cfg, hf = config_from_hf(d), transformers.AutoConfig.for_model(**d)
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.mlp_dim, cfg.vocab_size) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.hidden_size,
        hf.intermediate_size, hf.vocab_size,
    )  # fmt: skip
    assert cfg.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert (cfg.norm_eps, cfg.tie_embeddings) == (hf.rms_norm_eps, hf.tie_word_embeddings)
    hf_types = getattr(hf, "layer_types", None) if getattr(hf, "sliding_window", None) else None
    assert [cfg.layer_type(i) for i in range(cfg.n_layers)] == (hf_types or ["full_attention"] * cfg.n_layers)
    assert cfg.sliding_window == (hf.sliding_window if hf_types and "sliding_attention" in hf_types else 0)
    inv = tiny.hf_inverse_frequencies(d)
    for i in range(cfg.n_layers):
        np.testing.assert_array_max_ulp(
            inverse_frequencies(cfg.layer_rope(i), cfg.head_dim), inv[cfg.layer_type(i)].numpy(), maxulp=2
        )


def test_export_loads_in_transformers_with_equal_logits(family, tmp_path):
    name, _, _, ours = family
    export_checkpoint(tmp_path, ours.cfg, ours.params, bos_token_id=1, eos_token_id=2)
    hf, _ = _from_pretrained(tmp_path)
    assert read_hf_config(tmp_path) == ours.cfg
    ids = _ids(20, seed=5, batch=2)
    _close(name, ours.logits(ids), _hf_logits(hf, ids))


def test_params_carry_logical_axes(family):
    """Every parameter is annotated for the learner's sharding rules, which place them."""
    _, _, _, ours = family
    values = dict(nnx.to_flat_state(ours.params))
    for path, spec in nnx.to_flat_state(nnx.get_partition_spec(ours.params)):
        assert len(spec.get_value()) == values[path].get_value().ndim, path
    shardings = param_shardings(ours.params, make_mesh(1, 1))
    placed = jax.device_put(ours.params, shardings)
    assert jax.tree.leaves(placed)[0].sharding == jax.tree.leaves(shardings)[0]


@nnx.jit
def _jit_logits(model, ids):
    return model(ids, jnp.ones_like(ids), jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))


def _model_logits(model, ids) -> np.ndarray:
    """One contiguous segment per row, through a whole (unsplit) model."""
    return np.asarray(_jit_logits(model, jnp.asarray(ids, jnp.int32)))


def _from_pretrained(path, dtype=torch.float32):
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=dtype, output_loading_info=True
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    return hf.eval(), info


def test_builtin_config_exports_as_llama(tmp_path):
    """The byte-level policy's config is Llama with tied embeddings, eps 1e-6 and base 10,000:
    transformers loads its export and computes the same logits."""
    cfg = model_config("tiny")
    model = init_model(cfg, seed=3)
    export_checkpoint(tmp_path, cfg, split_params(model)[1], tokenizer.BOS, tokenizer.EOS)
    hf, _ = _from_pretrained(tmp_path)
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert read_hf_config(tmp_path) == cfg
    ids = np.random.default_rng(0).integers(0, 256, (2, 40))
    got = _model_logits(model, ids)
    _close("builtin", got, _hf_logits(hf, ids))
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == tokenizer.EOS


def test_qwen_sliding_window_layers_match_hf(tmp_path):
    """Qwen2's use_sliding_window (layers from max_window_layers on) runs the same window code."""
    overrides = dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    path = tiny.save(tiny.hf_model("qwen2", overrides=overrides), tmp_path)
    cfg, model = load_checkpoint(path)
    assert cfg.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    ids = _ids(16, seed=8)
    _close("qwen2", _model_logits(model, ids), _hf_logits(tiny.load_hf(path), ids))


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return tiny.save(tiny.hf_model("qwen2", seed=1), tmp_path_factory.mktemp("qwen2_src"))


def _rewrite_weights(src, dst, edit):
    """A copy of checkpoint src in dst with edit(tensors) applied to its weights."""
    dst.mkdir(exist_ok=True)
    for f in ("config.json", "generation_config.json"):
        (dst / f).write_bytes((src / f).read_bytes())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


KEY = "model.layers.1.self_attn.k_proj.bias"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.pop(KEY), f"{KEY}: missing tensor"),
        (lambda t: t.update(extra=np.zeros(3, np.float32)), "extra: extra tensor"),
        (lambda t: t.update({KEY: np.zeros(7, np.float32)}), f"{KEY}: shape [7], config.json implies [16]"),
        (lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}), "lm_head.weight: differs"),
    ],
    ids=["missing", "extra", "misshaped", "untied-head"],
)
def test_bad_tensors_are_refused_by_file_and_key(qwen2_dir, tmp_path, edit, message):
    bad = _rewrite_weights(qwen2_dir, tmp_path / "bad", edit)
    with pytest.raises(ValueError) as e:
        load_checkpoint(bad)
    assert str(e.value).startswith(f"{bad / 'model.safetensors'}: {message}"), str(e.value)


def test_a_tied_checkpoint_may_keep_an_equal_lm_head(qwen2_dir, tmp_path):
    copy = _rewrite_weights(
        qwen2_dir, tmp_path / "c", lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]})
    )
    assert load_checkpoint(copy)[0].tie_embeddings


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda d: d.update(model_type="mistral"), "model_type"),
        (lambda d: d.update(model_type="gemma3"), "model_type"),
        (lambda d: d["rope_parameters"].update(rope_type="yarn", factor=4.0), "rope_parameters.rope_type"),
        (lambda d: d["rope_parameters"].update(mrope_section=[2, 2]), "rope_parameters.mrope_section"),
        (lambda d: d.update(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}),
         "rope_scaling.rope_type"),
        (lambda d: d.update(hidden_act="gelu"), "hidden_act"),
        (lambda d: d.update(model_type="llama", attention_bias=True), "attention_bias"),
        (lambda d: d.update(model_type="gemma3_text", final_logit_softcapping=30.0), "final_logit_softcapping"),
        (lambda d: d.update(model_type="gemma3_text", attn_logit_softcapping=50.0), "attn_logit_softcapping"),
        (lambda d: d.pop("hidden_size"), "hidden_size"),
        (lambda d: d.update(quantization_config={"quant_method": "gptq"}), "quantization_config"),
    ],
    ids=["model_type", "gemma3-multimodal", "yarn", "mrope", "dynamic", "act", "llama-bias", "final-softcap",
         "attn-softcap", "missing-size", "quantized"],
)  # fmt: skip
def test_unsupported_configs_are_refused_by_file_and_key(qwen2_dir, tmp_path, edit, key):
    bad = _rewrite_weights(qwen2_dir, tmp_path / "bad", lambda t: None)
    tiny.rewrite_config(bad, edit)
    with pytest.raises(ValueError) as e:
        load_checkpoint(bad)
    assert str(e.value).startswith(f"{bad / 'config.json'}: {key}:"), str(e.value)


def _shard(src, dst, index_edit=None):
    """src's weights split over two shard files with an index.json written by hand."""
    dst.mkdir()
    (dst / "config.json").write_bytes((src / "config.json").read_bytes())
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, dst / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    if index_edit:
        index_edit(index)
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_sharded_checkpoint_loads_the_same(qwen2_dir, tmp_path):
    one = flat_params(load_checkpoint(qwen2_dir)[1])
    two = flat_params(load_checkpoint(_shard(qwen2_dir, tmp_path / "sharded"))[1])
    assert one.keys() == two.keys()
    for path in one:
        np.testing.assert_array_equal(one[path], two[path])


def test_sharded_index_that_disagrees_is_refused(qwen2_dir, tmp_path):
    def drop(index):  # a key in a shard that the index does not list
        del index["weight_map"][KEY]

    bad = _shard(qwen2_dir, tmp_path / "sharded", drop)
    with pytest.raises(ValueError) as e:
        load_checkpoint(bad)
    shard = f"model-0000{1 + sorted(load_file(qwen2_dir / 'model.safetensors')).index(KEY) % 2}-of-00002.safetensors"
    assert str(e.value).startswith(f"{bad / shard}: {KEY}: extra tensor"), str(e.value)


def test_bf16_load_gives_bf16_params_and_reads_bf16_files(tmp_path):
    model = tiny.hf_model("gemma3_text", seed=2)
    f32 = tiny.save(model, tmp_path / "f32")
    bf16 = tiny.save(model, tmp_path / "bf16", dtype=torch.bfloat16)
    cfg, ours = load_checkpoint(f32, dtype=jnp.bfloat16)
    assert {x.dtype for x in flat_params(ours).values()} == {np.dtype(ml_dtypes.bfloat16)}
    # A bf16 file reads exactly: its values are the bf16 rounding of the f32 ones.
    _, from_bf16 = load_checkpoint(bf16, dtype="float32")
    for path, x in flat_params(from_bf16).items():
        assert x.dtype == np.float32
        np.testing.assert_array_equal(x, flat_params(ours)[path].astype(np.float32), err_msg=str(path))
    # bf16 computes what f32 does, to bf16's precision (logits here reach ~20).
    ids = _ids(12, seed=6, batch=2)
    logits = _model_logits(ours, ids)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, _model_logits(load_checkpoint(f32)[1], ids), atol=0.25)
    # Exported in bf16, transformers loads it as written.
    export_checkpoint(tmp_path / "out", cfg, ours)
    hf, _ = _from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    embed = hf.model.embed_tokens.weight.detach()
    assert embed.dtype == torch.bfloat16
    np.testing.assert_array_equal(embed.float().numpy(), flat_params(ours)[("embed", "embedding")].astype(np.float32))


def test_vocab_check_takes_the_tokenizer():
    check_vocab(model_config("tiny"), tokenizer.VOCAB_SIZE)
    check_vocab(ModelConfig(vocab_size=100), 100)  # an HF config is not held to the byte vocabulary
    with pytest.raises(ValueError, match="larger than the model's embedding"):
        check_vocab(ModelConfig(vocab_size=100), tokenizer.VOCAB_SIZE)
