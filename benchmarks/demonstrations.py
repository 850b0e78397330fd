"""What the warm start's demonstrations cost to build: oracle transcripts through the real
environment (code: two sandbox runs each), one at a time against `concurrency` at once,
side by side in one run.

    .venv/bin/python benchmarks/demonstrations.py --env code --tasks 300
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _report import loadavg, machine_info, print_table

import environments
from core import config
from core.config import configclass, knob
from trainer.learning import warmstart


@configclass
class DemoBenchConfig:
    env: str = knob("code", "the environment")
    tasks: int = knob(300, "demonstrations built per mode")
    concurrency: tuple[int, ...] = knob((1, 8), "transcripts in flight, one row each")
    env_config: dict = knob({}, "the recipe's environment settings")


def main(argv=None) -> int:
    cfg = config.parse(DemoBenchConfig, argv, description=__doc__)
    print(f"machine: {machine_info()}  load: {loadavg()}", flush=True)
    tasks = environments.make_tasks(cfg.env, 1, cfg.tasks, "train", cfg.env_config)
    jobs = [(t, None) for t in tasks]
    rows, base = [], None
    for c in cfg.concurrency:
        t0 = time.monotonic()
        out = asyncio.run(warmstart.oracle_transcripts(cfg.env, jobs, None, cfg.env_config, concurrency=c))
        s = time.monotonic() - t0
        base = base or s
        assert all(t.reward == 1.0 for t in out)  # every demonstration solves its task
        rows.append([c, cfg.tasks, round(s, 2), round(1000 * s / cfg.tasks, 1), round(base / s, 2)])
    print_table(
        f"{cfg.env} demonstrations (oracle transcripts)",
        ["in flight", "transcripts", "s", "ms each", "speed-up"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
