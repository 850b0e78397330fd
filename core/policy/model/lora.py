"""LoRA adapters on the policy's Linear layers: trained alone, published alone, merged for use.

`add_lora` wraps each targeted `nnx.Linear` (Attention's `q`, `kv`, `out`; MLP's `gate`,
`up`, `down`; optionally `lm_head`) in flax's own `nnx.LoRA` with the Linear as its
base module, so y = base(x) + (alpha / rank) * x @ A @ B. B starts at zero: the adapted
model computes exactly the base model at init. A and B are `nnx.LoRAParam`s, so the
adapter is exactly the state that filter selects (`split_lora`), and the optimizer and
the policy store see only it.

Why nnx.LoRA and not qwix: it ships with flax (no extra dependency), it is a plain NNX
module (the learner's split / merge / jit code stays as it is), and its params carry
their own Variable type, which is all the learner needs to train only them. Its one gap,
no alpha / rank scale, is filled by a subclass (a scale folded into B's init would be
lost, since B starts at zero).

Readers never run LoRA modules: `merge` (a whole model, for export) and `merge_params`
(a rollout worker: the base it loaded once plus each published adapter) give the plain
model with W' = W + scale * A @ B.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from core.config import configclass, knob
from core.policy.formats.hf_weights import nest
from core.policy.model.transformer import Transformer, abstract_model

ATTENTION, MLP, HEAD = ("q", "kv", "out"), ("gate", "up", "down"), ("lm_head",)
TARGETS = ATTENTION + MLP + HEAD
BASE = "base_module"  # nnx.LoRA's attribute for the wrapped Linear (a path element)
# Hugging Face's (PEFT's) names for the same layers; k and v share one fused projection here.
HF_NAMES = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "o_proj": "out"} | {
    f"{n}_proj": n for n in ("gate", "up", "down")
}


@configclass
class LoraConfig:
    rank: int = knob(0, "LoRA rank (0: off, every weight is trained)", ge=0)
    alpha: float = knob(16.0, "LoRA alpha: the update is scaled by alpha / rank", gt=0)
    targets: tuple[str, ...] = knob(ATTENTION + MLP, f"the Linear layers to adapt, of {', '.join(TARGETS)}")

    @property
    def layers(self) -> tuple[str, ...]:
        """The model's Linear layers the targets name: PEFT's names are accepted (k_proj and
        v_proj both mean the fused kv)."""
        named = [HF_NAMES.get(t, t) for t in self.targets]
        if "k_proj" in self.targets and "v_proj" in self.targets:
            named.remove("kv")
        return tuple(named)

    def __post_init__(self):
        unknown = [t for t in self.layers if t not in TARGETS]
        if unknown:
            raise ValueError(
                f"lora targets {unknown} are not Linear layers of the model; valid: {', '.join(TARGETS)} "
                f"(or PEFT's {', '.join(HF_NAMES)})"
            )
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"lora targets {list(self.targets)} name a layer twice")
        if self.rank and not self.targets:
            raise ValueError("lora rank > 0 needs at least one target")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_dict(cls, d: dict) -> LoraConfig:
        """The inverse of adapter_metadata (JSON: the targets come back as a list)."""
        return cls(rank=int(d["rank"]), alpha=float(d["alpha"]), targets=tuple(d["targets"]))


def adapter_metadata(cfg: LoraConfig) -> dict:
    """What a store version carries to say it holds an adapter, not a whole model."""
    return {"rank": cfg.rank, "alpha": cfg.alpha, "targets": list(cfg.targets)}


class ScaledLoRA(nnx.LoRA):
    """nnx.LoRA plus the alpha / rank scale. The base runs on the input as given (nnx.LoRA
    would promote it to the adapter's float32 first), so a bfloat16 base computes as the
    plain model does; the adapter's term is cast to the base output's dtype."""

    def __init__(self, *args, scale: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = scale

    def __call__(self, x):
        y = self.base_module(x)
        delta = (x @ self.lora_a[...]) @ self.lora_b[...]
        return y + (self.scale * delta).astype(y.dtype)


def add_lora(model: Transformer, cfg: LoraConfig, seed: int = 0) -> Transformer:
    """Wraps each targeted Linear in place (the model's base arrays are reused, not copied)
    and returns the model. Refuses a target that names no Linear of this model (lm_head
    with tied embeddings), which would otherwise silently train nothing there."""
    if cfg.rank == 0:
        raise ValueError("add_lora needs lora rank > 0 (rank 0 is full fine-tuning)")
    rngs = nnx.Rngs(seed)
    found = {t: 0 for t in cfg.layers}
    for _, parent in list(nnx.iter_modules(model)):  # a list: the loop edits the graph
        for name in cfg.layers:
            linear = getattr(parent, name, None)
            if isinstance(linear, nnx.Linear):
                lora = ScaledLoRA(
                    linear.in_features,
                    cfg.rank,
                    linear.out_features,
                    base_module=linear,
                    lora_param_type=nnx.LoRAParam,
                    scale=cfg.scale,
                    rngs=rngs,
                )
                setattr(parent, name, lora)
                found[name] += 1
    missing = [t for t, n in found.items() if not n]
    if missing:
        raise ValueError(f"lora targets {missing} name no Linear layer of this model")
    return model


def split_lora(model: Transformer):
    """(graphdef, adapter State (the LoRAParams), frozen State (everything else, the base))."""
    return nnx.split(model, nnx.LoRAParam, ...)


def adapter_state(model: Transformer) -> nnx.State:
    return nnx.state(model, nnx.LoRAParam)


def _key(k):
    return int(k) if isinstance(k, str) and k.isdigit() else k


def _flat(tree: dict) -> dict[tuple, jax.Array]:
    """path -> array of a pure dict (list indices may come back from a store as strings)."""
    out = {}

    def walk(node, path):
        if isinstance(node, dict):
            for k, child in node.items():
                walk(child, (*path, _key(k)))
        else:
            out[path] = node

    walk(tree, ())
    return out


@jax.jit
def _merged_kernels(kernels, a, b, scales):
    # HIGHEST: W + scale * A @ B must not round A @ B to bfloat16 passes (the TPU default).
    return [
        (w.astype(jnp.float32) + s * jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)).astype(w.dtype)
        for w, x, y, s in zip(kernels, a, b, scales)
    ]


def _merge_state(base: nnx.State, adapter: dict, scales: dict[tuple, float]) -> nnx.State:
    """A new State of base (arrays shared) whose adapted kernels are W + scale * A @ B.
    adapter: module path -> {"lora_a", "lora_b"}; scales: module path -> scale."""
    flat = dict(nnx.to_flat_state(base))
    modules = sorted(adapter, key=str)
    for path in modules:
        if path + ("kernel",) not in flat:
            raise ValueError(f"adapter module {'.'.join(map(str, path))} has no kernel in the base params")
    new = _merged_kernels(
        [flat[p + ("kernel",)].get_value() for p in modules],
        [adapter[p]["lora_a"] for p in modules],
        [adapter[p]["lora_b"] for p in modules],
        [jnp.float32(scales[p]) for p in modules],
    )
    for path, value in zip(modules, new):
        flat[path + ("kernel",)] = flat[path + ("kernel",)].replace(value)
    return nnx.from_flat_state(list(flat.items()))


def _by_module(flat_adapter: dict[tuple, jax.Array]) -> dict[tuple, dict]:
    """path -> array of LoRA params -> module path -> {"lora_a": A, "lora_b": B}."""
    out: dict[tuple, dict] = {}
    for path, value in flat_adapter.items():
        if path[-1] not in ("lora_a", "lora_b"):
            raise ValueError(f"{'.'.join(map(str, path))} is not a LoRA parameter (lora_a / lora_b)")
        out.setdefault(path[:-1], {})[path[-1]] = value
    for path, pair in out.items():
        if len(pair) != 2:
            raise ValueError(f"adapter module {'.'.join(map(str, path))} lacks lora_a or lora_b")
    return out


def merge_params(base_params: nnx.State, adapter: dict, cfg: LoraConfig) -> nnx.State:
    """The plain model's params State with the adapter (nnx.to_pure_dict of its State, as a
    policy store returns it) merged in: what a rollout worker does with each published
    adapter on top of the base it loaded once. base_params is left as it is."""
    modules = _by_module(_flat(adapter))
    return _merge_state(base_params, modules, dict.fromkeys(modules, cfg.scale))


def merge(model: Transformer) -> Transformer:
    """A plain Transformer (no LoRA modules) computing what the adapted `model` computes,
    for export and for the rollout workers. `model` is left as it is."""
    _, adapter, frozen = split_lora(model)
    modules = _by_module({p: v.get_value() for p, v in nnx.to_flat_state(adapter)})
    scales = {path: _module_at(model, path).scale for path in modules}
    plain_graphdef, plain = nnx.split(abstract_model(model.cfg))
    base = {tuple(k for k in p if k != BASE): v.get_value() for p, v in nnx.to_flat_state(frozen)}
    want = {p for p, _ in nnx.to_flat_state(plain)}
    if set(base) != want:
        raise ValueError(f"the model's base params differ from its config's: {sorted(set(base) ^ want, key=str)}")
    nnx.replace_by_pure_dict(plain, nest(base))
    return nnx.merge(plain_graphdef, _merge_state(plain, modules, scales))


def _module_at(model, path: tuple):
    node = model
    for k in path:
        node = node[k] if isinstance(k, int) else getattr(node, k)
    return node
