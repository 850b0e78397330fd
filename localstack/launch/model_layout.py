"""Record shapes for a checkpoint: how long an episode of an environment is in the model's
own chat format, and the layout that holds it, or a refusal that says why none does.

The built-in byte policy's defaults (one row of 1024, up to 16 trajectories) fit its
terse transcripts. A checkpoint's chat template adds a system turn with the tools block (often
hundreds of tokens) and its own markup around every turn, so the same episode is several
times longer: the layout must follow from the checkpoint and the environment, measured on
the environment's oracle episodes rendered exactly as the rollout side renders them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics

import environments
from core.contracts.record_shape import LayoutConfig
from core.policy.sources import policy_spec
from core.policy.text.chat_format import chat_format_for
from environments.registry import DEFAULT_STYLE
from trainer.learning.warmstart import oracle_transcript

ALIGN = 64  # trajectory and row lengths are multiples of this (XLA-friendly, few shapes)
MAX_SEGMENTS = 4  # trajectories per row at most
PER_ROW = 3  # typical episodes per row


@dataclasses.dataclass(frozen=True)
class ModelLayout:
    layout: LayoutConfig
    prompt_tokens: int  # the longest first turn: system, tools block, user prompt, generation prompt
    oracle_tokens: int  # the longest oracle episode
    median_tokens: int
    max_seq_len: int  # the checkpoint's context

    def describe(self) -> str:
        lay = self.layout.layout
        return (
            f"record layout for the checkpoint: episodes up to {lay.trajectory_len} tokens (prompt with the "
            f"tools block {self.prompt_tokens}, longest oracle episode {self.oracle_tokens}, median "
            f"{self.median_tokens}), rows of {lay.max_seq_len} x {lay.rows}, up to {lay.max_segments_per_row} "
            f"trajectories per row; the checkpoint's context is {self.max_seq_len}"
        )


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def layout_for_model(
    model: str,
    env: str,
    max_new_tokens_per_turn: int,
    group_size: int = 8,
    rows: int | None = None,
    episodes: int = 32,
    env_config: dict | None = None,
    oracle_style: str = DEFAULT_STYLE,
) -> ModelLayout:
    """The layout an `env` episode of checkpoint `model` needs: the longest episode of the
    oracle the warm start demonstrates (`oracle_style`) plus two turns' worth of generation
    as headroom (a policy writes more than the oracle), aligned; refused when that exceeds
    the checkpoint's context. Rows (unless given): as few as hold one group of `group_size`
    typical episodes, since a real model's groups reach the packer minutes apart and each
    becomes a record of its own (a run with room for 12 trained 8 a record: fill 0.53)."""
    spec = policy_spec(model)
    fmt = chat_format_for(spec.tokenizer)
    environments.load_entry_points()
    tasks = environments.make_tasks(env, 1, episodes, "train", env_config)

    async def transcripts():
        return [await oracle_transcript(env, t, fmt=fmt, env_config=env_config, style=oracle_style) for t in tasks]

    lengths = [len(t.tokens) for t in asyncio.run(transcripts())]
    env0 = environments.make(env, **(env_config or {}))
    prompt = max(len(fmt.prompt_ids(t.prompt, env0.tools())) for t in tasks)
    need = max(lengths) + 2 * max_new_tokens_per_turn
    trajectory_len = _round_up(need, ALIGN)
    if trajectory_len > spec.cfg.max_seq_len:
        raise ValueError(
            f"--model {model}: a {env} episode needs about {need} tokens (the prompt with the tools block is "
            f"{prompt}, the longest oracle episode {max(lengths)}, plus {2 * max_new_tokens_per_turn} of headroom) "
            f"but the checkpoint's context (max_position_embeddings) is {spec.cfg.max_seq_len}"
        )
    median = int(statistics.median(lengths))
    # Rows of about three typical episodes: well filled by first-fit, while the learner's
    # dense attention (quadratic in the row) stays a small multiple of one episode's.
    seq_len = max(trajectory_len, _round_up(PER_ROW * median, ALIGN))
    segments = max(1, min(MAX_SEGMENTS, seq_len // max(median, 1)))
    rows = rows or -(-group_size // segments)
    layout = LayoutConfig(rows=rows, seq_len=seq_len, max_segments_per_row=segments, max_trajectory_len=trajectory_len)
    return ModelLayout(layout, prompt, max(lengths), median, spec.cfg.max_seq_len)
