"""The demo's summary: the learner's RunSummary plus what the demo itself measured, a
versioned contract written as WORKDIR/run_summary.json (what the report reads), and its
closing printout in the terminal."""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from pathlib import Path

from core.contracts import run_summary
from core.contracts.run_summary import RunSummary
from localstack.reports import reconcile
from localstack.reports.heldout import format_held_out
from localstack.reports.pass_at import format_pass_at
from localstack.reports.reconcile import Reconciliation
from trainer.learning.data.accounting import format_accounting

DEMO_SCHEMA_VERSION = 1


@dataclasses.dataclass
class DemoSummary:
    """One demo run: `learner` is the learner's own summary (its --summary_path)."""

    SCHEMA_VERSION: typing.ClassVar[int] = DEMO_SCHEMA_VERSION

    learner: RunSummary = dataclasses.field(default_factory=RunSummary)
    held_out: dict = dataclasses.field(default_factory=dict)  # localstack.reports.heldout.held_out_summary
    eval_n: int | None = None  # held-out tasks per evaluated version
    pass_at: dict = dataclasses.field(default_factory=dict)  # localstack.reports.pass_at.pass_at_summary
    plan: dict | None = None  # the capacity plan's {"settings", "predicted"}; None: --plan=off
    demo_wall_s: float | None = None
    workdir: str | None = None
    restarts: dict[str, int] = dataclasses.field(default_factory=dict)  # "pipeline", "emulator" -> times
    reconciliation: Reconciliation | None = None  # None: no rollout worker wrote a row
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    report: str | None = None  # report.md's path; None: the report failed
    # Each process group's resident memory, the most seen in the demo's polls (every 0.5 s).
    peak_rss_gb: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "learner"}
        own = json.loads(json.dumps(own, default=dataclasses.asdict))
        return {"schema_version": self.SCHEMA_VERSION, "learner": self.learner.to_dict(), **own}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data) -> DemoSummary:
        run_summary.check_schema(data, cls.SCHEMA_VERSION, "demo summary")
        learner = RunSummary.from_dict(data.get("learner"))
        rest = run_summary.from_dict(cls, {k: v for k, v in data.items() if k != "learner"}, "DemoSummary")
        return dataclasses.replace(rest, learner=learner)

    @classmethod
    def from_json(cls, text: str) -> DemoSummary:
        return cls.from_dict(run_summary.loads(text, "demo summary"))


def read_summary(workdir) -> tuple[DemoSummary | None, str]:
    """The demo's WORKDIR/run_summary.json, else the learner's own summary.json (a run
    started without the demo); (None, why) when neither is there or can be read."""
    for name, read in (("run_summary.json", DemoSummary.from_json), ("summary.json", RunSummary.from_json)):
        path = Path(workdir) / name
        if path.exists():
            try:
                found = read(path.read_text(errors="replace"))
            except (OSError, run_summary.SchemaError) as e:
                return None, f"{name} could not be read: {e}"
            return (found if isinstance(found, DemoSummary) else DemoSummary(learner=found)), ""
    return None, "No run_summary.json or summary.json"


def print_summary(s: DemoSummary) -> None:
    L, out = s.learner, sys.stdout
    print("\n=== agentic RL demo: summary ===")
    print(f"learner steps            {L.steps}")
    print(f"policy versions          {L.policy_versions_published}")
    print(
        f"records consumed         {L.records_consumed}  (shapes {L.declared_record_shapes}; "
        f"rejected {L.records_rejected}, duplicates {L.records_duplicate})"
    )
    print(f"tokens consumed          {L.tokens_consumed}  ({L.loss_tokens_consumed} policy tokens)")
    print(f"trajectories             {L.trajectories}  {L.episode_status}")
    print(f"mean reward              {L.mean_reward}")
    print(f"records by policy ver.   {L.records_by_max_policy_version}")
    print(f"wall time                {L.wall_s} s, learner duty cycle {L.learner_duty_cycle}")
    print(f"whole demo               {s.demo_wall_s} s (warm start {L.warmstart_s} s)")
    if s.plan:
        p, a = s.plan["settings"], s.plan["predicted"]["sync" if L.schedule == "sync" else "async"]
        print(
            f"capacity plan            {p['max_in_flight']} trajectories in flight, staleness bound "
            f"{p['max_staleness']}: predicted duty cycle {a['duty_cycle']:.2f} (bound by {a['binds']})"
        )
    for line in format_held_out(s.held_out, s.eval_n) + format_pass_at(s.pass_at):
        print(line)
    for i, line in enumerate(format_accounting(L.accounting)):
        print(f"{'trajectories' if i == 0 else '':25}{line}", file=out if L.accounting.balanced else sys.stderr)
    if s.reconciliation:
        ok = s.reconciliation.reconciled
        for i, line in enumerate(reconcile.format_reconciliation(s.reconciliation, L.accounting)):
            print(f"{'rollout side' if i == 0 else '':25}{line}", file=out if ok else sys.stderr)
    if s.peak_rss_gb:
        print("peak resident memory     " + ", ".join(f"{k} {v:.2f} GB" for k, v in s.peak_rss_gb.items()))
    print(f"logs and policy store    {s.workdir}")
    print(f"report                   {s.report}")
    workdir = Path(s.workdir or ".")
    if (workdir / "trace.json").exists():
        print(f"timeline                 {workdir / 'trace.json'}  (open in https://ui.perfetto.dev)")
    print(f"TensorBoard              tensorboard --logdir {workdir / 'logs'}")
