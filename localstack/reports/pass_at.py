"""What the evaluator's pass@k rows say about a run: pass@1, pass@n and greedy of the first
and the last version with their standard errors, v0's temperature sweep, what an
evaluation cost, and a figure of the pass@k curves.

The question they answer (Yue et al. 2025): did RL teach the model something, or only
sharpen what it already sampled? Sharpening raises pass@1 towards pass@n and leaves pass@n
(and a lower temperature's pass@1) where they were; learning lifts pass@1 of the last
version above v0's best over temperatures, and pass@n above v0's pass@n.
"""

from __future__ import annotations

from pathlib import Path

from core.rl.pass_at_k import SWEEP_MODE

SWEEP = SWEEP_MODE  # the mode of v0's temperature sweep rows


def _point(row: dict) -> dict:
    keys = ("version", "mode", "temperature", "success", "success_se", "samples", "tasks", "pass_at", "pass_at_se")
    out = {k: row[k] for k in keys if k in row}
    out["eval_s"] = row.get("eval_s")
    return out


def _ends(rows: list[dict], mode: str) -> tuple[dict | None, dict | None]:
    """The first and the last version's rows of `mode`. Where a version has several (the
    final one scored with one sample before it was known to be final, then again with all),
    the one with the most samples, the later on a tie."""
    mine = [r for r in rows if r.get("mode") == mode]
    if not mine:
        return None, None

    def best(version):
        of = [(r.get("samples") or 1, i) for i, r in enumerate(mine) if r["version"] == version]
        return mine[max(of)[1]]

    versions = [r["version"] for r in mine]
    return best(min(versions)), best(max(versions))


def pass_at_summary(rows: list[dict]) -> dict:
    """{"first": {mode: point}, "last": {mode: point}, "sweep": [points by temperature],
    "v0_best_pass1": {temperature, success}}; {} when no row has pass@k or a sweep."""
    modes = sorted({r.get("mode") for r in rows} - {SWEEP, None})
    first, last = {}, {}
    for mode in modes:
        a, b = _ends(rows, mode)
        first[mode], last[mode] = _point(a), _point(b)
    v0 = min((r["version"] for r in rows), default=None)
    sweep = [_point(r) for r in rows if r.get("mode") == SWEEP and r["version"] == v0]
    if not sweep and not any("pass_at" in p for p in (*first.values(), *last.values())):
        return {}
    if "sampled" in first and first["sampled"]["version"] == v0:
        sweep.append(first["sampled"])  # temperature 1 is the sampled mode's own row
    if "greedy" in first and first["greedy"]["version"] == v0:
        sweep.append(first["greedy"])  # temperature 0
    sweep.sort(key=lambda p: p.get("temperature", 1.0))
    out = {"first": first, "last": last, "sweep": sweep}
    sampled = [p for p in sweep if p.get("mode") != "greedy"]
    if sampled:
        best = max(sampled, key=lambda p: p["success"])
        out["v0_best_pass1"] = {"temperature": best.get("temperature", 1.0), "success": best["success"]}
    return out


def _pm(point: dict, k: str | None = None) -> str:
    if k is None:
        return f"{point['success']:.3f} ± {point.get('success_se', 0.0):.3f}"
    return f"{point['pass_at'][k]:.3f} ± {point['pass_at_se'][k]:.3f}"


def format_pass_at(summary: dict) -> list[str]:
    """The summary's closing lines: pass@1, pass@n and greedy at both ends, the sweep, and
    what an evaluation with n samples cost."""
    if not summary:
        return []
    lines = []
    for end in ("first", "last"):
        parts = []
        sampled, greedy = summary[end].get("sampled"), summary[end].get("greedy")
        if sampled:
            parts.append(f"pass@1 {_pm(sampled)}")
            n = sampled.get("samples", 1)
            if n > 1 and "pass_at" in sampled:
                parts.append(f"pass@{n} {_pm(sampled, str(n))}")
                parts.append(f"({sampled.get('tasks')} tasks x {n}, {sampled.get('eval_s')} s)")
        if greedy:
            parts.append(f"greedy {_pm(greedy)}")
        if parts:
            version = (sampled or greedy)["version"]
            lines.append(f"held-out at v{version} ({end}): " + ", ".join(parts))
    sweep = [p for p in summary.get("sweep", []) if p.get("mode") != "greedy"]
    if len(sweep) > 1:
        lines.append("v0 pass@1 by temperature: " + ", ".join(f"T={p['temperature']:g} {_pm(p)}" for p in sweep))
    best, last = summary.get("v0_best_pass1"), summary["last"].get("sampled")
    if best and last:
        verdict = "above" if last["success"] > best["success"] else "not above"
        lines.append(
            f"last pass@1 {last['success']:.3f} is {verdict} v0's best pass@1 over temperatures "
            f"({best['success']:.3f} at T={best['temperature']:g})"
        )
    return lines


def plot_pass_at(rows: list[dict], out: Path):
    """pass@k against k (log 2) for v0 and the last version, with their standard errors,
    greedy as a dashed line each, and v0's sweep beside; None when no row has pass@k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = pass_at_summary(rows)
    ends = [summary["first"].get("sampled"), summary["last"].get("sampled")] if summary else []
    ends = [p for p in ends if p and "pass_at" in p]
    if not ends:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for point, colour in zip(ends, ("#888888", "#1f77b4")):
        ks = sorted(int(k) for k in point["pass_at"])
        ys = [point["pass_at"][str(k)] for k in ks]
        es = [point["pass_at_se"][str(k)] for k in ks]
        a1.errorbar(ks, ys, yerr=es, marker="o", ms=4, capsize=3, color=colour, label=f"v{point['version']} sampled")
        greedy = summary["first" if point is ends[0] else "last"].get("greedy")
        if greedy and greedy["version"] == point["version"]:
            a1.axhline(greedy["success"], ls="--", color=colour, label=f"v{point['version']} greedy")
    a1.set_xscale("log", base=2)
    a1.set(title="Held-out pass@k", xlabel="k (samples per task)", ylabel="pass@k", ylim=(-0.02, 1.05))
    a1.grid(alpha=0.3)
    a1.legend(fontsize="small")
    sweep = [p for p in summary.get("sweep", []) if p.get("mode") != "greedy"]
    if sweep:
        a2.errorbar(
            [p["temperature"] for p in sweep],
            [p["success"] for p in sweep],
            yerr=[p.get("success_se", 0.0) for p in sweep],
            marker="o",
            capsize=3,
            color="#888888",
            label="v0 pass@1",
        )
        last = summary["last"].get("sampled")
        if last:
            a2.axhline(last["success"], color="#1f77b4", label=f"v{last['version']} pass@1 (T=1)")
        a2.legend(fontsize="small")
    a2.set(title="v0 by temperature: sharpening's control", xlabel="temperature", ylabel="pass@1", ylim=(-0.02, 1.05))
    a2.grid(alpha=0.3)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(out)
