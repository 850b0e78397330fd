"""Record shapes for a checkpoint follow from its chat prompts, or are refused with the
numbers: the demo's layout (localstack/launch/model_layout.py) and the learner's start-up
check (trainer.learning.builder.check_prompt_fits)."""

import pytest

from core import config
from core.policy.sources import policy_spec
from core.policy.text.chat_format import chat_format_for
from environments import make, make_tasks
from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint
from localstack.launch.model_layout import layout_for_model
from trainer.config import LearnerJobConfig
from trainer.learning.builder import check_prompt_fits


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {
        "qwen2": write_tiny_checkpoint(root / "qwen2", "qwen2"),
        "short": write_tiny_checkpoint(root / "short", "qwen2", max_seq_len=256),
    }


def test_the_layout_holds_the_longest_oracle_episode_in_the_models_format(ckpts):
    found = layout_for_model(str(ckpts["qwen2"]), "calculator", max_new_tokens_per_turn=32, rows=4)
    lay = found.layout.layout
    spec = policy_spec(str(ckpts["qwen2"]))
    env = make("calculator")
    prompt = max(
        len(chat_format_for(spec.tokenizer).prompt_ids(t.prompt, env.tools()))
        for t in make_tasks("calculator", 1, 32, "train")
    )
    assert found.prompt_tokens == prompt > 100  # the tools block: far longer than the byte policy's prompt
    assert lay.trajectory_len >= found.oracle_tokens + 64 and lay.trajectory_len % 64 == 0
    assert lay.max_seq_len >= lay.trajectory_len and lay.rows == 4
    assert 1 <= lay.max_segments_per_row <= lay.max_seq_len // found.median_tokens
    assert str(lay.trajectory_len) in found.describe()


def test_a_checkpoint_whose_context_cannot_hold_an_episode_is_refused_with_the_numbers(ckpts):
    with pytest.raises(ValueError, match=r"needs about \d+ tokens .* context \(max_position_embeddings\) is 256"):
        layout_for_model(str(ckpts["short"]), "guess", max_new_tokens_per_turn=32, rows=4)


def test_the_learner_refuses_a_layout_with_no_room_after_the_chat_prompt(ckpts):
    flags = dict(requests_topic="t", records_subscription="s", policy_root="p", model=str(ckpts["qwen2"]))
    with pytest.raises(ValueError, match=r"prompt in its chat format is \d+ tokens .* at most 128 tokens"):
        check_prompt_fits(config.build(LearnerJobConfig, seq_len=128, **flags))
    check_prompt_fits(config.build(LearnerJobConfig, seq_len=512, max_trajectory_len=512, **flags))  # fits


def test_rows_hold_one_group_and_the_episodes_are_the_warm_starts_oracles(ckpts):
    """A real model's groups reach the packer minutes apart, one record each: rows beyond a
    group's are padding. The episodes measured are the style the warm start demonstrates."""
    calc = {"max_ops_per_call": 2}
    default = layout_for_model(str(ckpts["qwen2"]), "calculator", 32, group_size=8, env_config=calc)
    whole = layout_for_model(str(ckpts["qwen2"]), "calculator", 32, group_size=8, env_config=calc, oracle_style="whole")
    for found in (default, whole):
        lay = found.layout.layout
        assert lay.rows * lay.max_segments_per_row >= 8 > (lay.rows - 1) * lay.max_segments_per_row
    assert whole.oracle_tokens < default.oracle_tokens  # one call with the whole expression, not one per op
    with pytest.raises(KeyError, match="no oracle style 'nope'"):
        layout_for_model(str(ckpts["qwen2"]), "calculator", 32, env_config=calc, oracle_style="nope")
