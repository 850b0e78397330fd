"""`agentic-rl`: the subcommands, their --help from the config trees, and docs/CONFIG.md."""

from __future__ import annotations

import dataclasses

import pytest

from agentic_rl import cli, config_doc
from core import config


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("demo", "learner", "rollout", "evaluate", "plan", "report", "generate", "export"):
        assert f"  {name} " in out


def test_an_unknown_subcommand_is_refused(capsys):
    assert cli.main(["nope"]) == 2
    assert "unknown subcommand 'nope'" in capsys.readouterr().err


def test_generate_refuses_neither_or_both_inputs_before_loading_anything(capsys, tmp_path):
    missing = str(tmp_path / "no-such-checkpoint")
    assert cli.main(["generate", f"--model={missing}"]) == 2
    assert "exactly one of --prompt and --messages" in capsys.readouterr().err
    assert cli.main(["generate", f"--model={missing}", "--prompt=a", f"--messages={missing}"]) == 2
    assert "exactly one of --prompt and --messages" in capsys.readouterr().err
    assert cli.main(["generate", f"--model={missing}", "--prompt=a"]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err


def test_export_of_an_empty_store_says_so(capsys, tmp_path):
    assert cli.main(["export", f"--store={tmp_path}", f"--out={tmp_path / 'out'}"]) == 2
    assert "has no published version" in capsys.readouterr().err


@pytest.mark.parametrize("sub", list(config_doc.CONFIGS))
def test_subcommand_help_lists_each_field_with_its_doc(sub, capsys):
    try:
        code = cli.main([sub, "--help"])
    except SystemExit as stopped:  # argparse's own --help exits
        code = stopped.code
    assert code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps help lines
    for leaf in config.leaves(config_doc.config_class(sub)):
        assert f"--{leaf.flag}" in text, leaf.flag
        assert leaf.help, f"--{leaf.flag} has no doc"
        assert " ".join(leaf.help.split()[:3]) in text, leaf.flag


REQUIRED = {"region": "us-central1", "base_output_dir": "gs://bucket/out", "image": "gcr.io/p/learner:1"}


def config_doc_default(cls, flag):
    return next(leaf.default for leaf in config.leaves(cls) if leaf.flag == flag)


@pytest.mark.parametrize("sub", list(config_doc.CONFIGS))
def test_each_flag_default_equals_its_config_field(sub):
    """The parser's defaults against the tree the dataclasses build with no flags given:
    a default written a second time (in a parser, a preset, a __post_init__) shows here."""
    cls = config_doc.config_class(sub)
    required = {leaf.flag: REQUIRED.get(leaf.flag, f"x-{leaf.flag}") for leaf in config.leaves(cls)}
    required = {k: v for k, v in required.items() if config_doc_default(cls, k) is dataclasses.MISSING}
    ns = config.make_parser(cls).parse_args([f"--{k}={v}" for k, v in required.items()])
    tree = config.build(cls, **required)
    for leaf in config.leaves(cls):
        assert getattr(ns, leaf.dest) == config.get(tree, leaf.path), leaf.flag


def test_config_doc_is_current():
    assert config_doc.PATH.read_text() == config_doc.render(), "run: python -m agentic_rl.config_doc"
