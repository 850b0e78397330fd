"""LoRA adapters: equal to the base at init, the only thing the learner trains and
publishes, and merged (for export, or by a rollout worker) into a plain model that
computes what the adapted one does, in our code and in transformers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from _learner_data import random_record
from flax import nnx
from safetensors.numpy import load_file

from core import config
from core.contracts.store import PolicyStore
from core.policy.formats.hf_export import export_checkpoint
from core.policy.formats.hf_weights import load_checkpoint
from core.policy.model.config import ModelConfig, model_config
from core.policy.model.lora import (
    LoraConfig,
    ScaledLoRA,
    adapter_metadata,
    adapter_state,
    add_lora,
    merge,
    merge_params,
    split_lora,
)
from core.policy.model.transformer import Transformer, abstract_tree, init_model
from tests import _hf_tiny as tiny
from trainer.learning.persistence.publisher import PolicyPublisher
from trainer.learning.step.learner import Learner, LearnerConfig

CFG = ModelConfig(max_seq_len=64)
LORA = LoraConfig(rank=4, alpha=8.0)


def _rows(vocab: int, batch: int = 2, length: int = 20, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int32)


def _logits(model, ids) -> np.ndarray:
    ids = jnp.asarray(ids)
    return np.asarray(model(ids, jnp.ones_like(ids), jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)))


def _randomise_adapter(model, seed: int = 1, scale: float = 0.1):
    """B non-zero, so the adapter changes what the model computes."""
    keys = iter(jax.random.split(jax.random.key(seed), 1000))
    adapter = jax.tree.map(lambda x: scale * jax.random.normal(next(keys), x.shape, x.dtype), adapter_state(model))
    nnx.update(model, adapter)
    return model


def _leaves(tree) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(tree)]


def test_adapted_model_equals_the_base_at_init():
    model = init_model(CFG, seed=3)
    ids = _rows(CFG.vocab_size)
    before = _logits(model, ids)
    add_lora(model, LORA)
    assert isinstance(model.blocks[0].attn.q, ScaledLoRA) and isinstance(model.blocks[1].mlp.down, ScaledLoRA)
    loras = [m for _, m in nnx.iter_modules(model) if isinstance(m, ScaledLoRA)]
    assert loras and all(not np.any(m.lora_b[...]) and np.any(m.lora_a[...]) for m in loras)
    np.testing.assert_array_equal(_logits(model, ids), before)
    # The adapter is exactly the LoRA params: A and B of 6 Linears per layer.
    _, adapter, frozen = split_lora(model)
    assert len(jax.tree.leaves(adapter)) == 2 * 6 * CFG.n_layers
    assert not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(frozen))


def _on_policy_record(learner: Learner, seed: int):
    """Behaviour log-probs are the learner's own; advantages +1 / -1 by segment."""
    from core.policy.model.transformer import token_logprobs

    rec = random_record(seed, rows=4, seq_len=64, vocab=264)
    logits = learner.model_of(learner.params)(rec.tokens, rec.segment_ids, rec.positions)
    gen = rec.loss_mask == 1
    rec.behaviour_logprobs = np.where(gen, np.asarray(token_logprobs(logits, rec.tokens)), 0).astype(np.float32)
    rec.advantages = np.where(gen, np.where(rec.segment_ids % 2 == 1, 1.0, -1.0), 0).astype(np.float32)
    return rec.validate()


def test_learner_trains_only_the_adapter():
    learner = Learner(CFG, LearnerConfig(batch_records=2, learning_rate=1e-2, lora=LORA))
    records = [_on_policy_record(learner, 5), _on_policy_record(learner, 6)]
    frozen_before, adapter_before = _leaves(learner.frozen), _leaves(learner.params)
    # The optimizer state covers the adapter only: Adam's moments are adapter-sized.
    n_adapter = sum(x.size for x in adapter_before)
    n_opt = sum(x.size for x in jax.tree.leaves(learner.opt_state) if x.ndim)
    assert n_opt == 2 * n_adapter and n_adapter < sum(x.size for x in frozen_before) / 10
    losses = [learner.train_step(records)["losses/policy_loss"] for _ in range(5)]
    assert all(np.array_equal(a, b) for a, b in zip(frozen_before, _leaves(learner.frozen)))
    moved = [not np.array_equal(a, b) for a, b in zip(adapter_before, _leaves(learner.params))]
    assert all(moved)  # after the first step (B moves), A moves too
    assert losses[-1] < losses[0] - 1e-3, losses
    assert learner.compiled_variants() == 1
    # What is published is the adapter alone.
    published = jax.tree.leaves(learner.params_dict())
    assert len(published) == 2 * 6 * CFG.n_layers and sum(x.size for x in published) == n_adapter


def test_lora_on_a_mesh_trains_the_replicated_adapter():
    from trainer.learning.step.sharding import make_mesh

    learner = Learner(CFG, LearnerConfig(batch_records=2, learning_rate=1e-2, lora=LORA), mesh=make_mesh(1, 1))
    frozen_before = _leaves(learner.frozen)
    for seed in range(3):
        learner.train_step([random_record(2 * seed), random_record(2 * seed + 1)])
    assert all(x.sharding.spec == jax.sharding.PartitionSpec() for x in jax.tree.leaves(learner.params))
    assert all(np.array_equal(a, b) for a, b in zip(frozen_before, _leaves(learner.frozen)))
    assert learner.compiled_variants() == 1


def test_kl_reference_is_the_adapter_at_start():
    from trainer.learning.step.losses import LossConfig

    learner = Learner(CFG, LearnerConfig(batch_records=2, learning_rate=1e-2, lora=LORA, loss=LossConfig(kl_coef=0.1)))
    learner.set_reference(learner.params)
    assert jax.tree.structure(learner.ref_params) == jax.tree.structure(learner.params)
    records = [random_record(7), random_record(8)]
    first = learner.train_step(records)
    for _ in range(3):
        last = learner.train_step(records)
    assert first["losses/kl_ref"] == pytest.approx(0.0, abs=1e-6) and last["losses/kl_ref"] > 1e-6


def test_merge_equals_the_adapted_model_and_merge_params_equals_merge():
    model = init_model(CFG, seed=3)
    base = jax.tree.map(jnp.array, nnx.state(model, nnx.Param))  # a copy: add_lora reuses the arrays
    base_before = _leaves(base)
    _randomise_adapter(add_lora(model, LORA))
    ids = _rows(CFG.vocab_size)
    adapted = _logits(model, ids)
    merged = merge(model)
    assert type(merged) is Transformer
    assert not any(isinstance(m, nnx.LoRA) for _, m in nnx.iter_modules(merged))
    assert np.abs(adapted - _logits(init_model(CFG, seed=3), ids)).max() > 1e-2  # the adapter matters
    np.testing.assert_allclose(_logits(merged, ids), adapted, atol=1e-5)
    adapter = jax.tree.map(np.asarray, nnx.to_pure_dict(adapter_state(model)))
    got = merge_params(base, adapter, LORA)
    want = nnx.state(merged, nnx.Param)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(base_before, _leaves(base)))  # the base is untouched
    # A store may hand back list indices as strings.
    strings = {"blocks": {str(i): v for i, v in adapter["blocks"].items()}}
    for a, b in zip(jax.tree.leaves(merge_params(base, strings, LORA)), jax.tree.leaves(got)):
        np.testing.assert_array_equal(a, b)


def test_merged_export_equals_the_adapter_in_transformers(tmp_path):
    src = tiny.save(tiny.hf_model("qwen2"), tmp_path / "src")
    cfg, model = load_checkpoint(src)
    _randomise_adapter(add_lora(model, LORA))
    out = export_checkpoint(tmp_path / "out", cfg, merge(model), bos_token_id=1, eos_token_id=2)
    ids = _rows(tiny.VOCAB, batch=3, length=16, seed=4)
    with torch.no_grad():
        theirs = tiny.load_hf(out)(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(theirs, _logits(model, ids), atol=1e-4)
    before, after = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) <= set(after)
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert "model.layers.0.self_attn.q_proj.weight" in changed and "model.layers.1.mlp.down_proj.weight" in changed
    assert not any("norm" in k or "embed" in k or k.endswith("bias") for k in changed)  # only adapted kernels


def test_publisher_writes_the_adapter_and_says_so(tmp_path):
    learner = Learner(CFG, LearnerConfig(batch_records=2, learning_rate=1e-2, lora=LORA))
    learner.train_step([random_record(1), random_record(2)])
    store = PolicyStore(str(tmp_path / "store"))
    PolicyPublisher(store, learner, None, version=-1).publish()
    meta = store.read_metadata(0)["metadata"]
    assert meta["lora"] == adapter_metadata(LORA) and LoraConfig.from_dict(meta["lora"]) == LORA
    assert meta["step"] == 1 and meta["tokenizer"] == "byte"
    # A rollout worker: the base it loaded once, plus the published adapter.
    adapter = store.load(0, abstract_tree(learner.params_dict()))
    base = nnx.state(init_model(CFG, LearnerConfig().seed), nnx.Param)
    got = nnx.to_pure_dict(merge_params(base, adapter, LoraConfig.from_dict(meta["lora"])))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(learner.full_params_dict())):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_without_lora_nothing_changes(tmp_path):
    learner = Learner(CFG, LearnerConfig(batch_records=1))
    assert learner.frozen is None
    assert not any(isinstance(m, nnx.LoRA) for _, m in nnx.iter_modules(learner.model_of(learner.params)))
    assert jax.tree.structure(learner.full_params_dict()) == jax.tree.structure(learner.params_dict())
    store = PolicyStore(str(tmp_path / "store"))
    PolicyPublisher(store, learner, None, version=-1).publish()
    assert "lora" not in store.read_metadata(0)["metadata"]


def test_initial_model_is_used_and_must_match_the_config():
    model = init_model(CFG, seed=11)
    want = _leaves(nnx.state(model, nnx.Param))
    learner = Learner(CFG, LearnerConfig(batch_records=1, seed=0), model=model)
    assert all(np.array_equal(a, b) for a, b in zip(want, _leaves(learner.params)))
    with pytest.raises(ValueError, match="differs from model_cfg"):
        Learner(ModelConfig(max_seq_len=32), LearnerConfig(batch_records=1), model=init_model(CFG))


def _param_counts(cfg: ModelConfig, lora: LoraConfig) -> tuple[int, int]:
    """(adapter, full) parameter counts, from shapes only (nothing allocated)."""
    with nnx.use_eager_sharding(False):  # as init_model: axis names as metadata only
        model = nnx.eval_shape(lambda: add_lora(Transformer(cfg, nnx.Rngs(0)), lora))
    _, adapter, frozen = split_lora(model)
    return tuple(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(s)) for s in (adapter, frozen))


def test_adapter_is_a_small_fraction_of_the_model():
    adapter, full = _param_counts(model_config("1b"), LoraConfig(rank=8))
    print(f"1b, rank 8: adapter {adapter:,} of {full:,} params ({adapter / full:.3%})")
    # Per layer: r * (d_in + d_out) for q, kv, out, gate, up, down.
    cfg = model_config("1b")
    q, kv = cfg.n_heads * cfg.head_dim, 2 * cfg.n_kv_heads * cfg.head_dim
    dims = [(cfg.d_model, q), (cfg.d_model, kv), (q, cfg.d_model)] + [(cfg.d_model, cfg.mlp_dim)] * 2
    dims.append((cfg.mlp_dim, cfg.d_model))
    assert adapter == cfg.n_layers * 8 * sum(a + b for a, b in dims)
    assert adapter < full / 100, (adapter, full)


def test_config_refusals_and_flags():
    with pytest.raises(ValueError, match="rank must be >= 0"):
        LoraConfig(rank=-1)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        LoraConfig(rank=4, alpha=0.0)
    with pytest.raises(ValueError, match=r"\['w_proj'\].*valid: q, kv, out, gate, up, down, lm_head"):
        LoraConfig(rank=4, targets=("q", "w_proj"))
    with pytest.raises(ValueError, match="twice"):
        LoraConfig(rank=4, targets=("q", "q"))
    with pytest.raises(ValueError, match="at least one target"):
        LoraConfig(rank=4, targets=())
    with pytest.raises(ValueError, match=r"\['lm_head'\] name no Linear"):  # tied embeddings: no lm_head
        add_lora(init_model(CFG), LoraConfig(rank=4, targets=("q", "lm_head")))
    with pytest.raises(ValueError, match="rank > 0"):
        add_lora(init_model(CFG), LoraConfig())
    parsed = config.parse(LearnerConfig, ["--lora_rank=8", "--lora_alpha=32", "--lora_targets=q,kv,lm_head"])
    assert parsed.lora == LoraConfig(rank=8, alpha=32.0, targets=("q", "kv", "lm_head"))
    assert config.parse(LearnerConfig, config.to_argv(parsed)) == parsed
    assert LoraConfig.from_dict(adapter_metadata(parsed.lora)) == parsed.lora
    with pytest.raises(SystemExit):
        config.parse(LearnerConfig, ["--lora_targets=q,nope"])


def test_peft_target_names_map_onto_the_models_layers():
    cfg = LoraConfig(rank=4, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    assert cfg.layers == ("q", "kv", "out", "gate", "up", "down")
    assert LoraConfig(rank=4, targets=("v_proj",)).layers == ("kv",)
    with pytest.raises(ValueError, match="twice"):
        LoraConfig(rank=4, targets=("q", "q_proj"))
    with pytest.raises(ValueError, match="PEFT"):
        LoraConfig(rank=4, targets=("w_proj",))
