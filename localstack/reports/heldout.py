"""Turns the evaluator's rows (one per policy version and mode) into what a run proved:
held-out success of the first and the last version, and how long RL took to get there."""

from __future__ import annotations

from localstack.reports.pass_at import SWEEP


def curve(rows: list[dict], mode: str = "sampled") -> list[dict]:
    """(version, step, seconds since v0 was published, success) per evaluated version."""
    rows = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["version"])
    if not rows:
        return []
    t0 = rows[0]["published_at"]
    return [
        {"version": r["version"], "step": r["step"], "rl_s": round(r["published_at"] - t0, 1), "success": r["success"]}
        for r in rows
    ]


def held_out_summary(rows: list[dict], target: float = 0.9) -> dict:
    """First and last evaluated version per mode, and the first version at `target`."""
    out = {}
    for mode in sorted({r["mode"] for r in rows} - {SWEEP}):  # v0's temperature sweep: pass_at.py
        c = curve(rows, mode)
        reached = next((p for p in c if p["success"] >= target), None)
        out[mode] = {
            "first": c[0],
            "last": c[-1],
            "versions_evaluated": len(c),
            "target": target,
            "first_at_target": reached,
        }
    return out


def format_held_out(summary: dict, n: int | None = None) -> list[str]:
    lines = []
    for mode, s in summary.items():
        first, last, hit = s["first"], s["last"], s["first_at_target"]
        reach = (
            f"first >= {s['target']:.2f} at v{hit['version']} after {hit['rl_s']} s of RL"
            if hit
            else f"never >= {s['target']:.2f}"
        )
        tasks = f", {n} test tasks" if n else ""
        lines.append(
            f"held-out success ({mode}{tasks}): v{first['version']} {first['success']:.3f} -> "
            f"v{last['version']} {last['success']:.3f} in {last['rl_s']} s of RL; {reach}"
        )
    return lines


FINAL_SCORING_MIN_S = 900.0


def final_scoring_budget_s(rows: list[dict]) -> float:
    """How long the demo waits for the evaluator once the learner is done: the evaluation it
    may be in the middle of, then the final version's modes (sampled, greedy), with room to
    spare: four times the longest evaluation so far, and never under 15 minutes. A real
    model's evaluation takes 5-7 minutes on two cores: a fixed 900 s failed SmolLM2 run 15
    in its final greedy evaluation, after all ten steps had trained."""
    longest = max((float(r.get("eval_s", 0.0)) for r in rows), default=0.0)
    return max(FINAL_SCORING_MIN_S, 4 * longest)
