"""Which model every process of a run loads: a built-in size or a checkpoint directory."""

from __future__ import annotations

from core.config import configclass, knob
from core.policy.model.config import MODEL_CONFIGS

# The one help text of every process's --model flag (learner, rollout job, evaluator, demo).
MODEL_HELP = (
    "a Hugging Face checkpoint directory to train or serve (config.json, *.safetensors, tokenizer.json with "
    "a chat template); every process of a run loads the same one. Unset: the built-in --model_config"
)


@configclass
class ModelChoice:
    """The policy model: the learner trains it, the rollout workers and the evaluator serve it."""

    builtin: str = knob(
        "tiny", "the built-in policy size (when --model is unset)", choices=sorted(MODEL_CONFIGS), flag="model_config"
    )
    checkpoint: str | None = knob(None, MODEL_HELP, flag="model")
