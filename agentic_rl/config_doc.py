"""docs/CONFIG.md, generated from the config trees: `python -m agentic_rl.config_doc`
writes it; tests/test_cli.py checks that the file in the repository is current."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from core import config_table

# subcommand -> "module:ConfigClass", in the order the document lists them
CONFIGS = {
    "demo": "localstack.launch.demo_config:DemoConfig",
    "learner": "trainer.config:LearnerJobConfig",
    "rollout": "pipelines.config:RolloutJobConfig",
    "evaluate": "rollout.evaluator:EvaluatorConfig",
    "plan": "localstack.launch.plan:PlanConfig",
    "vertex": "trainer.cloud.vertex:VertexJobConfig",
    "generate": "agentic_rl.generate:GenerateConfig",
    "export": "agentic_rl.export:ExportConfig",
    "tiny-checkpoint": "agentic_rl.tiny_checkpoint:TinyCheckpointConfig",
    "import-gguf": "agentic_rl.import_gguf:ImportGGUFConfig",
    "real-model": "agentic_rl.real_model:RealModelConfig",
}
PATH = Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md"

HEADER = """# Configuration

Generated from the config trees by `python -m agentic_rl.config_doc`; do not edit by hand
(`tests/test_cli.py` fails when this file is not current). Each process has one typed
config tree of dataclasses (`core/config.py`): a field's type, default and doc are written
once, and its flag, `--help` and this table come from it. Settings a process refuses at
start-up are in [CONFIG_REFUSALS.md](CONFIG_REFUSALS.md).

`agentic-rl SUBCOMMAND --help` prints the same list. In the demo, the learner's, the
rollout job's and the evaluator's own fields are flags under `--learner.`, `--rollout.` and
`--eval_`. Not there: the settings every process shares (model, environment, layout, LoRA,
warm start), which are the demo's own flags and reach each process that holds them; where
a process connects (topics, stores, paths), which the demo sets from its workdir; and the
run-wide settings above them.
"""


def config_class(subcommand: str):
    module, name = CONFIGS[subcommand].split(":")
    return getattr(importlib.import_module(module), name)


def render() -> str:
    parts = [HEADER]
    for sub in CONFIGS:
        cls = config_class(sub)
        parts.append(
            config_table.markdown_table(cls, f"`agentic-rl {sub}`: {cls.__name__}", f"agentic-rl {sub} --help")
        )
    return "\n".join(parts)


def main(argv=None) -> int:
    PATH.write_text(render())
    print(f"wrote {PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
