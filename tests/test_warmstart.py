"""The warm start: oracle demonstrations through the real environment, and behaviour cloning on them."""

import jax
import numpy as np
import pytest

import environments
from core.policy.model.config import ModelConfig
from core.policy.model.transformer import init_model, split_params
from core.policy.text import tokenizer
from trainer.learning.warmstart import WarmStartConfig, oracle_rows, sft_batches, warm_start

TASKS = environments.make_tasks("calculator", 5, 40, "train")


def _texts(rows) -> list[str]:
    return [tokenizer.decode([int(t) for t in row[seg > 0]]) for row, seg in zip(rows["tokens"], rows["segment_ids"])]


def _actions(rows) -> list[str]:
    return [tokenizer.decode([int(t) for t in row[m > 0]]) for row, m in zip(rows["tokens"], rows["loss_mask"])]


def test_oracle_rows_solve_every_task_and_mask_only_actions():
    rows = oracle_rows("calculator", TASKS, max_seq_len=256)
    for task, text, actions in zip(TASKS, _texts(rows), _actions(rows), strict=True):
        assert text.endswith(f"<answer>{task.target}</answer>")
        assert "<call calc>" in text
        assert "<result>" in text and "<result>" not in actions  # tool output is never a target
    assert (rows["positions"][rows["segment_ids"] > 0] >= 0).all()
    assert rows["tokens"].shape[1] % 16 == 0


def test_a_batch_keeps_each_demonstrations_tokens_mask_and_positions_together():
    """Every field of a batch row comes from the same transcript. A draw per field (the
    warm start from d53cabd until its fix) put one transcript's loss mask and positions on
    another's tokens, and the calculator demo's v0 fell from 0.50 to 0.22-0.24."""
    tasks = environments.make_tasks("calculator", 0, 64, "train")
    data = oracle_rows("calculator", tasks, 256, direct_frac=0.5, seed=0)
    for batch in sft_batches(data, 8, 20, np.random.default_rng(0)):
        for r in range(8):
            same = np.flatnonzero((data["tokens"] == batch["tokens"][r]).all(axis=1))
            assert len(same) >= 1
            assert any(all((data[k][j] == batch[k][r]).all() for k in data) for j in same), r
    draws = [b["tokens"] for b in sft_batches(data, 8, 3, np.random.default_rng(0))]
    again = [b["tokens"] for b in sft_batches(data, 8, 3, np.random.default_rng(0))]
    assert all((a == b).all() for a, b in zip(draws, again, strict=True))  # one seed, one stream


def test_the_whole_expression_style_demonstrates_one_call_per_task():
    """`--warmstart_oracle=whole` (the checkpoint recipe's): every demonstration calls once
    with the task's whole expression and answers its result, and still wins."""
    settings = {"max_ops_per_call": 2}
    rows = oracle_rows("calculator", TASKS, max_seq_len=256, env_config=settings, style="whole")
    for task, text, actions in zip(TASKS, _texts(rows), _actions(rows), strict=True):
        assert actions == f"<call calc>{task.meta['expression']}</call><answer>{task.target}</answer>"
        assert f"<result>{task.target}</result>" in text


def test_direct_answers_at_the_first_turn_make_one_decision():
    rows = oracle_rows("calculator", TASKS, max_seq_len=256, direct_frac=1.0, direct_at="first_turn")
    for task, actions in zip(TASKS, _actions(rows), strict=True):
        assert actions == f"<answer>{task.target}</answer>"  # no call at all


def test_direct_answers_at_any_turn_stop_part_way():
    rows = oracle_rows("calculator", TASKS, max_seq_len=256, direct_frac=1.0, direct_at="any_turn")
    calls = [a.count("<call ") for a in _actions(rows)]
    full = [a.count("<call ") for a in _actions(oracle_rows("calculator", TASKS, max_seq_len=256))]
    assert all(c < f for c, f in zip(calls, full, strict=True))  # always fewer calls than the oracle
    assert any(c > 0 for c in calls)  # and sometimes some


def test_direct_frac_sets_the_share_of_direct_demonstrations():
    tasks = environments.make_tasks("calculator", 6, 400, "train")
    rows = oracle_rows("calculator", tasks, max_seq_len=256, direct_frac=0.6, seed=1)
    direct = np.mean(["<call " not in a for a in _actions(rows)])
    assert 0.53 < direct < 0.67


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(steps=-1), "steps"),
        (dict(batch_rows=0), "batch"),  # its flag: --warmstart_batch
        (dict(learning_rate=0.0), "lr"),  # --warmstart_lr
        (dict(schedule="linear"), "schedule"),
        (dict(direct_frac=1.5), "direct_frac"),
        (dict(direct_at="middle"), "direct_at"),
    ],
)
def test_config_refuses_bad_settings_by_name(bad, field):
    with pytest.raises(ValueError, match=field):
        WarmStartConfig(**bad)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_behaviour_cloning_lowers_the_loss(schedule):
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, mlp_dim=64)
    graphdef, params = split_params(init_model(cfg, 0))
    ws = WarmStartConfig(steps=40, batch_rows=8, learning_rate=3e-3, schedule=schedule, warmup_steps=5)
    new, losses = warm_start(graphdef, jax.tree.map(np.array, params), "calculator", TASKS, ws)  # donated
    assert len(losses) == 40
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new), strict=True))
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


def test_a_warm_start_shorter_than_its_warmup_still_runs():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, mlp_dim=64)
    graphdef, params = split_params(init_model(cfg, 0))
    ws = WarmStartConfig(steps=3, batch_rows=4, warmup_steps=50)
    _, losses = warm_start(graphdef, params, "calculator", TASKS[:8], ws)
    assert len(losses) == 3 and all(np.isfinite(losses))


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    from core.policy.sources import load_policy
    from localstack.fixtures.tiny_checkpoint import write_tiny_checkpoint

    return load_policy(write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen2", "qwen2"))


def test_demonstrations_in_a_checkpoints_format_put_the_loss_on_its_assistant_turns_only(qwen2):
    from core.policy.text.chat_format import chat_format_for

    tok = qwen2.tokenizer
    rows = oracle_rows("calculator", TASKS[:6], 1024, fmt=chat_format_for(tok))
    for row, seg, mask in zip(rows["tokens"], rows["segment_ids"], rows["loss_mask"]):
        ids, m = row[seg > 0].tolist(), mask[seg > 0].tolist()
        spans, cur = [], []  # maximal runs of loss tokens: one per assistant turn
        for t, on in zip(ids, m):
            if on:
                cur.append(t)
            elif cur:
                spans, cur = spans + [cur], []
        spans += [cur] if cur else []
        assert len(spans) >= 2  # at least one tool call, then the answer
        end = tok.token_to_id("<|im_end|>")
        for span in spans:  # the model's own turn: its text, then its end-of-turn token
            text = tok.decode(span, skip_special_tokens=False)
            assert span[-1] == end and "<|im_start|>" not in text and "<tool_response>" not in text, text
        assert "<tool_call>" in tok.decode(spans[0], skip_special_tokens=False)
        prompt = tok.decode(ids[: m.index(1)], skip_special_tokens=False)
        assert prompt.endswith("<|im_start|>assistant\n") and "<tools>" in prompt  # the template's tools block


def test_behaviour_cloning_through_lora_adapters_in_the_checkpoints_format(qwen2):
    from core.policy.model.lora import LoraConfig
    from core.policy.text.chat_format import chat_format_for
    from trainer.learning.step.learner import Learner, LearnerConfig

    learner = Learner(qwen2.cfg, LearnerConfig(batch_records=1, lora=LoraConfig(rank=4)), model=qwen2.model)
    base = jax.tree.map(np.array, learner.frozen)
    ws = WarmStartConfig(steps=30, batch_rows=4, learning_rate=1e-2, warmup_steps=5)
    fmt = chat_format_for(qwen2.tokenizer)
    new, losses = warm_start(
        learner.graphdef, learner.params, "calculator", TASKS[:16], ws, fmt, learner.frozen, seq_len=512
    )
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    assert jax.tree.structure(new) == jax.tree.structure(learner.params)  # the adapter is what trained
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(learner.frozen), strict=True):
        np.testing.assert_array_equal(a, b)
