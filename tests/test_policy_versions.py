"""Reading a published version as a sampler's params (core/policy/versions.py): whole
models as they are, LoRA adapters merged into the base loaded once, and a version of
another model refused by name."""

import sys

import jax
import numpy as np
import pytest
from flax import nnx

from core.contracts.store import PolicyStore, StoreError
from core.policy import versions
from core.policy.formats.hf_weights import load_checkpoint
from core.policy.model.config import model_config
from core.policy.model.lora import LoraConfig
from core.policy.model.transformer import abstract_model, split_params
from core.policy.sources import policy_metadata
from core.policy.versions import VersionLoader, base_params
from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint
from trainer.learning.persistence.publisher import PolicyPublisher
from trainer.learning.step.learner import Learner, LearnerConfig


def _template(cfg):
    return split_params(abstract_model(cfg))[1]


def _assert_same(state, expected: dict):
    got = nnx.to_pure_dict(state)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_a_whole_model_version_loads_and_another_models_is_refused_by_name(tmp_path):
    tiny = model_config("tiny")
    learner = Learner(tiny, LearnerConfig(batch_records=1))
    store = PolicyStore(str(tmp_path / "store"))
    store.publish(0, learner.params_dict(), policy_metadata(tiny))
    state, meta = VersionLoader(store, tiny, _template(tiny)).load(0)
    _assert_same(state, learner.params_dict())
    assert meta["metadata"]["tokenizer"] == "byte"
    # On the device, not numpy: numpy leaves are copied into every jitted call that takes them.
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
    small = model_config("small")
    with pytest.raises(StoreError, match=r"another model config.*d_model: version 64 vs here 256"):
        VersionLoader(store, small, _template(small)).load(0)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen2", "qwen2")


def test_an_adapter_version_is_merged_into_the_base_read_once(tmp_path, qwen2):
    cfg, model = load_checkpoint(qwen2)
    learner = Learner(
        cfg, LearnerConfig(batch_records=1, lora=LoraConfig(rank=4)), model=model, tokenizer_source=str(qwen2)
    )
    rng = np.random.default_rng(0)  # a trained-looking adapter: B away from its zero init
    learner.params = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(x.dtype), learner.params)
    store = PolicyStore(str(tmp_path / "store"))
    PolicyPublisher(store, learner, None, version=-1).publish()
    reads = []

    def base():
        reads.append(1)
        return base_params(str(qwen2))()

    loader = VersionLoader(store, cfg, _template(cfg), base)
    for _ in range(2):
        state, meta = loader.load(0)
        _assert_same(state, learner.full_params_dict())
    assert meta["metadata"]["lora"]["rank"] == 4 and len(reads) == 1  # the base is read once
    with pytest.raises(StoreError, match="LoRA adapter: serving it needs the base checkpoint"):
        VersionLoader(store, cfg, _template(cfg)).load(0)


def test_a_load_hands_the_gil_back_promptly_and_restores_the_interval_however_it_ends(tmp_path, monkeypatch):
    """Beside a thread that keeps the GIL, a load's thousand C calls each wait out the switch
    interval (benchmarks/delta_reload.py: deltas 8-11 s at Python's 5 ms, 1.1-1.2 s at 0.1 ms)."""
    default = sys.getswitchinterval()
    seen = []
    store = PolicyStore(str(tmp_path / "store"))
    monkeypatch.setattr(store, "read_metadata", lambda v: seen.append(sys.getswitchinterval()) or {})
    monkeypatch.setattr(store, "load", lambda v, target: seen.append(sys.getswitchinterval()) or {})
    tiny = model_config("tiny")
    loader = VersionLoader(store, tiny, split_params(abstract_model(tiny))[1])
    with versions._prompt_gil_handoffs():  # another load running: the interval stays short until both end
        loader.load(0)
        assert sys.getswitchinterval() == pytest.approx(versions._LOAD_SWITCH_INTERVAL_S)
    assert seen and all(s == pytest.approx(versions._LOAD_SWITCH_INTERVAL_S) for s in seen)
    assert sys.getswitchinterval() == default

    def corrupt(v, target):
        raise StoreError("corrupt")

    monkeypatch.setattr(store, "load", corrupt)
    with pytest.raises(StoreError):
        loader.load(0)
    assert sys.getswitchinterval() == default
