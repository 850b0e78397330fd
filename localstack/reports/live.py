"""Live progress of a local run, from the files its processes write (nothing is asked of
them): the learner's and rollout workers' metrics.jsonl under WORKDIR/logs and the
evaluator's eval.jsonl. In a terminal, a rich panel redrawn every second; otherwise
(CI, a log file) one plain line every `line_every_s` seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from localstack.reports.pass_at import SWEEP


class Tail:
    """New complete lines of a growing JSONL file, as dicts (a half-written last line waits)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def rows(self) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


class RunState:
    """What the panel shows, folded from the rows seen so far."""

    def __init__(self, workdir: Path, max_steps: int):
        self.workdir, self.max_steps = Path(workdir), max_steps
        self.learner: dict = {}
        self.rollout: dict[str, dict] = {}  # per worker process: its newest row
        self.evals: dict[str, dict] = {}  # per mode: the newest evaluated version's row
        self.waiting: str | None = None  # why the learner gets no records, when it says so
        self._tails: dict[Path, Tail] = {}
        self.phase = "starting"

    def _tail(self, path: Path) -> list[dict]:
        if path not in self._tails:
            self._tails[path] = Tail(path)
        return self._tails[path].rows()

    def refresh(self) -> None:
        logs = self.workdir / "logs"
        for row in self._tail(logs / "learner" / "metrics.jsonl"):
            self.learner = row
        for path in sorted(logs.glob("rollout-*/metrics.jsonl")):
            for row in self._tail(path):
                self.rollout[path.parent.name] = row
        self.waiting = learner_waiting(self.workdir)
        for row in self._tail(self.workdir / "eval.jsonl"):
            if row["mode"] == SWEEP:  # v0 at other temperatures: the summary's, not progress
                continue
            if row["version"] >= self.evals.get(row["mode"], {}).get("version", -1):
                self.evals[row["mode"]] = row

    def _rollout_sum(self, key: str) -> float:
        return sum(r.get(key, 0) or 0 for r in self.rollout.values())

    def fields(self) -> list[tuple[str, str]]:
        L, now = self.learner, time.time()
        rows = [("phase", self.phase)]
        if self.waiting:
            rows.append(("learner waiting", self.waiting))
        if L:
            age = now - L["wall_time"]
            rows += [
                (
                    "learner step",
                    f"{L['step']} / {self.max_steps}   policy v{L['policy/version']}   (last {age:.0f} s ago)",
                ),
                (
                    "trained tokens/s",
                    f"{L['perf/trained_tokens_per_s_recent']:.0f} recent   "
                    f"{L['perf/trained_tokens_per_s']:.0f} whole run",
                ),
                (
                    "learner duty cycle",
                    f"{L['perf/duty_cycle_recent']:.2f} recent   {L['perf/duty_cycle']:.2f} whole run",
                ),
                ("staleness", f"mean {L['staleness/mean']:.2f}   max {L['staleness/max']}{_by_staleness(L)}"),
                *_lag_control(L),
                # Acked once the checkpoint that holds them lands; a crash redelivers these.
                ("records held, not acked", f"{L.get('data/records_held_unacked', 0)}"),
            ]
        if self.evals:
            parts = [f"{m} {r['success']:.3f} (v{r['version']})" for m, r in sorted(self.evals.items())]
            rows.append(("held-out success", "   ".join(parts)))
            if passes := self.evals.get("sampled", {}).get("pass_at"):  # pass@1 and pass@n
                n, v = max(passes, key=int), self.evals["sampled"]["version"]
                rows.append(("held-out pass@k", f"pass@1 {passes['1']:.3f}   pass@{n} {passes[n]:.3f} (v{v})"))
        if self.rollout:
            packed = self._rollout_sum("rollout/records")
            backlog = packed - L.get("data/records_received", 0) if L else packed
            rows += [
                (
                    "records waiting",
                    f"{max(backlog, 0):.0f}   ({packed:.0f} packed, {L.get('data/records_received', 0)} received)",
                ),
                (
                    "episodes in flight",
                    f"{self._rollout_sum('rollout/episodes_in_flight'):.0f} running"
                    + (f"   {L['feeder/in_flight']} requested and not back" if L else ""),
                ),
                (
                    "groups",
                    f"{self._rollout_sum('rollout/groups'):.0f} ended   "
                    f"{self._rollout_sum('rollout/groups_zero_signal'):.0f} with equal rewards (no signal)",
                ),
                (
                    "rollouts",
                    f"{self._rollout_sum('rollout/episodes_per_s'):.1f} episodes/s   env latency "
                    f"p50 {_p(self.rollout, 'rollout/env_latency_ms_p50')}   "
                    f"p95 {_p(self.rollout, 'rollout/env_latency_ms_p95')}",
                ),
            ]
        dead = self._rollout_sum("rollout/dead_letters") + self._rollout_sum("rollout/bad_requests")
        dead += L.get("data/records_dead_lettered", 0) if L else 0
        rows.append(("dead letters", f"{dead:.0f}"))
        return rows

    def line(self) -> str:
        return "progress: " + "; ".join(f"{k} {v}" for k, v in self.fields()[:9])


def learner_waiting(workdir: Path) -> str | None:
    """What the learner last said it waits for (trainer/learning/data/starvation.py), or None."""
    try:
        return json.loads((Path(workdir) / "logs" / "learner" / "status.json").read_text()).get("waiting")
    except (OSError, ValueError, AttributeError):
        return None


def _lag_control(L: dict) -> list[tuple[str, str]]:
    """The closed loop's line: its target, the lag it last measured and the window it set."""
    if "lag/target" not in L:
        return []
    measured = f"{L['lag/measured']:.2f}" if "lag/measured" in L else "not yet"
    return [
        (
            "lag control",
            f"target {L['lag/target']:g}   measured {measured}   window {L.get('feeder/window', '?')}"
            f"   {L.get('lag/changes', 0)} changes",
        )
    ]


def _by_staleness(row: dict) -> str:
    """The run's admitted records by versions behind, "   records by versions behind 0: 5  1: 9"."""
    hist = sorted((int(k.rsplit("_", 1)[1]), n) for k, n in row.items() if k.startswith("staleness/records_"))
    return ("   records by versions behind " + "  ".join(f"{k}: {n}" for k, n in hist)) if hist else ""


def _p(rollout: dict, key: str) -> str:
    vals = [r[key] for r in rollout.values() if key in r]
    return f"{max(vals):.0f} ms" if vals else "-"


def table(state: RunState) -> Table:
    t = Table(title=f"agentic RL: {state.workdir}", show_header=False, title_justify="left", expand=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    for k, v in state.fields():
        t.add_row(k, v)
    return t


class Progress:
    """`with Progress(workdir, max_steps, mode) as p: ... p.update(phase)` in the wait loop."""

    def __init__(self, workdir: Path, max_steps: int, mode: str = "auto", line_every_s: float = 15.0):
        if mode == "auto":
            mode = "panel" if sys.stdout.isatty() else "lines"
        self.mode, self.line_every_s = mode, line_every_s
        self.state = RunState(workdir, max_steps)
        self._live: Live | None = None
        self._last = 0.0

    def __enter__(self) -> Progress:
        if self.mode == "panel":
            self._live = Live(table(self.state), console=Console(), auto_refresh=False, transient=False)
            self._live.__enter__()
        return self

    def update(self, phase: str | None = None) -> None:
        if self.mode == "off":
            return
        now = time.monotonic()
        if phase:
            self.state.phase = phase
        every = 1.0 if self.mode == "panel" else self.line_every_s
        if now - self._last < every:
            return
        self._last = now
        self.state.refresh()
        if self._live:
            self._live.update(table(self.state), refresh=True)
        else:
            print(self.state.line(), flush=True)

    def __exit__(self, *exc) -> None:
        if self._live:
            self._live.__exit__(*exc)
