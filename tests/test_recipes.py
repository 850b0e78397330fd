"""Each environment's recipe (localstack/launch/recipes.py): selected by --env, overridden
by flags, handed to every process, and able to succeed at all: the oracle's episodes
fit the recipe's turn and token limits and win every task under its settings."""

import asyncio
from pathlib import Path

import pytest

import environments
from core import config
from core.policy.text.chat_format import chat_format_for
from core.policy.text.tokenizer import BYTE_TOKENIZER
from localstack.launch import demo
from localstack.launch.demo_config import DemoConfig, parse_args
from localstack.launch.recipes import RECIPES, env_of
from trainer.learning.warmstart import oracle_transcript


def test_env_selects_its_recipe_and_flags_override_it():
    code = parse_args(["--env", "code"])
    assert code.turn.max_new_tokens_per_turn == 96 and code.env.config == {"max_turns": 2}
    assert (code.warmstart.steps, code.batch_records, code.learner.learner.lr_warmup_steps) == (400, 8, 10)
    assert (code.warmstart.direct_frac, code.learner.learner.lr_decay, code.learner.learner.learning_rate) == (
        0.5,
        0.9,
        6e-4,
    )
    mine = parse_args(["--env=code", "--warmstart_steps=7", "--max_new_tokens_per_turn", "80", "--batch_records=6"])
    assert (mine.warmstart.steps, mine.turn.max_new_tokens_per_turn, mine.env.config) == (7, 80, {"max_turns": 2})
    assert mine.batch_records == 6 and mine.learner.learner.loss.aggregation == "seq-mean-token-mean"
    assert parse_args([]) == config.build(DemoConfig)  # the calculator's recipe is the defaults
    assert parse_args(["--env", "guess"]).env.config == {"high": 31, "max_turns": 5, "reply_window": True}


def test_an_environment_without_a_recipe_gets_the_defaults():
    cfg = parse_args(["--env", "no-such-plugin"])
    assert cfg.env.name == "no-such-plugin" and cfg.warmstart == config.build(DemoConfig).warmstart
    assert env_of(["--max_steps", "3"]) is None and env_of(["--env", "guess", "--x"]) == "guess"


@pytest.mark.parametrize("env", sorted(RECIPES))
def test_every_process_gets_the_recipes_settings(env, tmp_path):
    cfg = parse_args(["--env", env])
    topics = subs = {"requests": "t/r", "records": "t/p", "dead": "t/d"}
    learner = demo.learner_config(cfg, tmp_path, topics, subs, tmp_path / "store", None)
    assert learner.env == cfg.env and learner.env.settings == {**cfg.env.config, "tool_latency": "fixed:0.5"}
    assert learner.warmstart.steps == cfg.warmstart.steps
    rollout = demo.rollout_config(cfg, tmp_path, topics, subs, tmp_path / "store", None)
    assert rollout.engine.turn == cfg.turn
    evaluator = demo.evaluator_config(cfg, tmp_path, tmp_path / "store")
    assert evaluator.env.config == cfg.env.config  # the held-out tasks of the recipe, no latency
    assert "--tool_latency" not in " ".join(config.to_argv(evaluator))
    assert evaluator.turn == cfg.turn


def _longest_action(mask: list[int]) -> int:
    run = best = 0
    for m in mask:
        run = run + 1 if m else 0
        best = max(best, run)
    return best


@pytest.mark.parametrize("env", sorted(RECIPES))
def test_the_oracle_wins_every_task_within_the_recipes_limits(env):
    """What made code and guess unlearnable: code's tool calls were longer than a turn
    (so every one was cut into a malformed call) and guess's games longer than an episode."""
    cfg = parse_args(["--env", env])
    settings = {**cfg.env.config, "tool_latency": "none"}
    room = cfg.layout.layout.trajectory_len
    fmt = chat_format_for(BYTE_TOKENIZER)
    for task in environments.make_tasks(env, 3, 24, "test", settings):
        t = asyncio.run(oracle_transcript(env, task, fmt=fmt, env_config=cfg.env.config))
        assert _longest_action(t.loss_mask) <= cfg.turn.max_new_tokens_per_turn, (env, task.prompt)
        assert len(t.tokens) <= room, (env, task.prompt, len(t.tokens))
        assert t.reward == 1.0, (env, task.prompt)


def test_the_recipes_are_documented():
    results = (Path(__file__).parents[1] / "docs" / "RESULTS.md").read_text()
    for env in RECIPES:
        assert f"--env {env}" in results or env == "calculator", env


def test_a_checkpoint_gets_the_checkpoint_recipe_on_top_of_the_environments_and_flags_override_it():
    from localstack.launch.checkpoint_recipes import COMMON

    real = parse_args(["--model", "/ckpt/SmolLM2"])
    byte = parse_args([])
    assert real.model.checkpoint == "/ckpt/SmolLM2" and byte.model.checkpoint is None
    assert (real.warmstart.steps, real.warmstart.batch_rows, real.learner.warmstart.learning_rate) == (12, 4, 3e-4)
    assert (real.turn.max_new_tokens_per_turn, real.batch_records, real.publish_every, real.plan) == (48, 2, 1, "off")
    assert real.learner.learner.learning_rate == 2e-5 != byte.learner.learner.learning_rate  # 5e-5: entropy 0.03
    assert real.learner.learner.lr_decay == 0.9  # the late collapse of constant-rate runs 6 and 9
    assert real.learner.learner.loss.kl_coef == 0  # runs 13-14: skipped calls came back, past the hour
    assert byte == config.build(DemoConfig)  # no --model: the byte recipe alone
    mine = parse_args(["--model=/ckpt/SmolLM2", "--warmstart_steps=3", "--learner.learning_rate=0", "--plan", "auto"])
    assert (mine.warmstart.steps, mine.learner.learner.learning_rate, mine.plan) == (3, 0.0, "auto")
    assert mine.warmstart.batch_rows == 4  # the rest of the recipe stays
    # The environment's own settings stay under the checkpoint's: guess keeps its game.
    guess = parse_args(["--env", "guess", "--model", "/ckpt/SmolLM2"])
    assert guess.env.config == RECIPES_ENV_CONFIG_GUESS and guess.warmstart.steps == 12
    assert all(flag.startswith("--") for flag in COMMON)


RECIPES_ENV_CONFIG_GUESS = {"high": 31, "max_turns": 5, "reply_window": True}


def test_the_evaluator_reads_the_learners_dataset_with_the_learners_seed(tmp_path):
    """They share the run's dataset directory, whose one seed builds both splits: an evaluator
    on another seed refused the directory at start (a real-model run lost its evaluation)."""
    cfg = parse_args(["--learner.task_seed=3"])
    evaluator = demo.evaluator_config(cfg, tmp_path, tmp_path / "store")
    assert evaluator.task_seed == 3 and evaluator.data_dir == str(tmp_path / "datasets")
    with pytest.raises(SystemExit):  # not a flag of the demo: it follows the learner's
        parse_args(["--eval_task_seed=5"])
