"""Long packed rows at the cost of short ones: the learner's step on the same tokens in
256-token rows and in 1024-token rows, with dense and with banded attention.

Two comparisons, each at equal tokens per step: 16x256 against 4x1024 rows (4 records of
4,096 tokens, the issue's case), and 4x256 (the old default layout) against 1x1024 (the
default now) at 4 records of 1,024 tokens.

    .venv/bin/python benchmarks/attention.py [--env calculator] [--steps 5] [--cpus 1]

Records are packed by the real packer from the environment's oracle episode lengths in the
policy's chat format (localstack.launch.plan, as the planner measures), and the learner
steps on them as the job's does (trainer.learning.step.learner.Learner; banded: span = the
layout's trajectory length, as builder.make_learner passes). Trained trajectories/s =
trajectories per record x records per step / step time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import machine_info, print_table

from core import config
from core.config import configclass, knob
from core.contracts.record_shape import RecordLayout
from core.policy.sources import policy_spec
from core.policy.text.chat_format import chat_format_for
from localstack.launch.plan import measure_environment, measure_learner
from trainer.learning.step.learner import LearnerConfig

# (rows, seq_len, segments per row, banded); every step is --batch_records records.
LAYOUTS = [
    (16, 256, 4, False),
    (4, 1024, 16, False),
    (4, 1024, 16, True),
    (4, 256, 4, False),
    (1, 1024, 16, False),
    (1, 1024, 16, True),
]


@configclass
class AttentionBenchConfig:
    env: str = knob("calculator", "the environment whose oracle lengths are packed")
    episodes: int = knob(256, "oracle episodes measured for lengths")
    steps: int = knob(5, "timed learner steps per layout (after one compile step)")
    batch_records: int = knob(LearnerConfig.batch_records, "records per learner step (the learner's)")
    trajectory_len: int = knob(256, "the longest trajectory (the span of banded attention)")
    cpus: str = knob("1", "the cores this benchmark is pinned to")
    out: str | None = knob(None, "write the results here as JSON")


def main(argv=None) -> int:
    cfg = config.parse(AttentionBenchConfig, argv, description=__doc__, prog="benchmarks/attention.py")
    os.sched_setaffinity(0, {int(c) for c in cfg.cpus.split(",")})
    spec = policy_spec(None, "tiny")
    lengths = measure_environment(cfg.env, "none", cfg.episodes, chat_format_for(spec.tokenizer))["lengths"]
    rows, results = [], []
    for r, seq_len, segments, banded in LAYOUTS:
        layout = RecordLayout((seq_len,), r, segments, cfg.trajectory_len)
        m = measure_learner(layout, cfg.batch_records, lengths, cfg.steps, spec.cfg, banded=banded)
        traj_s = m["trajectories_per_record"] * cfg.batch_records / m["step_s"]
        tokens_s = m["tokens_per_record"] * cfg.batch_records / m["step_s"]
        name = f"{r}x{seq_len}, {segments} segments, {'banded' if banded else 'dense'}"
        rows.append([name, m["step_s"], m["fill"], m["trajectories_per_record"], traj_s, tokens_s])
        results.append({"layout": name, **m, "trajectories_per_s": traj_s, "trained_tokens_per_s": tokens_s})
    print_table(
        f"Learner step ({cfg.env} oracle lengths, batch {cfg.batch_records} records, core {cfg.cpus})",
        ["layout", "step s", "fill", "trajectories / record", "trajectories/s", "trained tokens/s"],
        rows,
    )
    if cfg.out:
        Path(cfg.out).write_text(json.dumps({"machine": machine_info(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
