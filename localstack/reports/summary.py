"""The demo's closing summary, as printed to the terminal (the same numbers as summary.json)."""

from __future__ import annotations

import sys
from pathlib import Path

from localstack.reports import reconcile
from localstack.reports.heldout import format_held_out
from trainer.learning.accounting import format_accounting


def print_summary(s: dict) -> None:
    print("\n=== agentic RL demo: summary ===")
    print(f"learner steps            {s['steps']}")
    print(f"policy versions          {s['policy_versions_published']}")
    print(
        f"records consumed         {s['records_consumed']}  (shapes {s['declared_record_shapes']}; "
        f"rejected {s['records_rejected']}, duplicates {s['records_duplicate']})"
    )
    print(f"tokens consumed          {s['tokens_consumed']}  ({s['loss_tokens_consumed']} policy tokens)")
    print(f"trajectories             {s['trajectories']}  {s['episode_status']}")
    print(f"mean reward              {s['mean_reward']}")
    print(f"records by policy ver.   {s['records_by_max_policy_version']}")
    print(f"wall time                {s['wall_s']} s, learner duty cycle {s['learner_duty_cycle']}")
    print(f"whole demo               {s['demo_wall_s']} s (warm start {s['warmstart_s']} s)")
    if s.get("plan"):
        p, a = s["plan"]["settings"], s["plan"]["predicted"]["sync" if s.get("schedule") == "sync" else "async"]
        print(
            f"capacity plan            {p['max_in_flight']} trajectories in flight, staleness bound "
            f"{p['max_staleness']}: predicted duty cycle {a['duty_cycle']:.2f} (bound by {a['binds']})"
        )
    for line in format_held_out(s.get("held_out", {}), s.get("eval_n")):
        print(line)
    if s.get("accounting"):
        for i, line in enumerate(format_accounting(s["accounting"])):
            print(
                f"{'trajectories' if i == 0 else '':25}{line}",
                file=sys.stdout if s["accounting"]["balanced"] else sys.stderr,
            )
    if s.get("reconciliation"):
        ok = s["reconciliation"]["reconciled"]
        for i, line in enumerate(reconcile.format_reconciliation(s["reconciliation"], s["accounting"])):
            print(f"{'rollout side' if i == 0 else '':25}{line}", file=sys.stdout if ok else sys.stderr)
    print(f"logs and policy store    {s['workdir']}")
    print(f"report                   {s['report']}")
    if (Path(s["workdir"]) / "trace.json").exists():
        print(f"timeline                 {Path(s['workdir']) / 'trace.json'}  (open in https://ui.perfetto.dev)")
    print(f"TensorBoard              tensorboard --logdir {Path(s['workdir']) / 'logs'}")
