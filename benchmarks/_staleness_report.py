"""benchmarks/staleness.py's reading of a run (its workdir and summary), its tables and plot."""

from __future__ import annotations

import statistics
from pathlib import Path

from _report import print_table

from core.telemetry.scalars import read_rows
from localstack.reports.heldout import curve
from localstack.reports.summary import DemoSummary
from localstack.reports.tracking import reward_tracking, tracking_r


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.fmean(xs), 4) if xs else None


def run_row(setting: str, seed: int, workdir: Path, s: DemoSummary, target: float) -> dict:
    """One run's figures: time to target from the evaluator's rows, the rest from the
    learner's summary and its per-step metrics."""
    L = s.learner
    evals = read_rows(workdir / "eval.jsonl")
    held = curve(evals, "sampled")
    hit = first_at(held, target)
    steps = [r for r in read_rows(workdir / "logs" / "learner" / "metrics.jsonl") if "losses/clipfrac" in r]
    hist = {int(k): v for k, v in L.staleness_histogram.items()}
    n = sum(hist.values())
    pairs = reward_tracking(steps, evals)
    rollout_s, learner_s = split_time(steps)
    return {
        "setting": setting,
        "seed": seed,
        "workdir": str(workdir),
        "wall_s": L.wall_s,
        "steps": L.steps,
        "versions": len(L.policy_versions_published) - 1,
        "time_to_target_s": hit["rl_s"] if hit else None,
        "versions_to_target": hit["version"] if hit else None,
        "rl_s_evaluated": held[-1]["rl_s"] if held else None,  # how far the curve reaches
        "held_out": held,
        "held_out_first": held[0]["success"] if held else None,
        "held_out_last": held[-1]["success"] if held else None,
        "versions_evaluated": len(held),
        "tokens_per_s": L.steady_trained_tokens_per_s,
        "duty": L.steady_duty_cycle,
        "staleness_histogram": hist,
        "mean_staleness": round(sum(k * v for k, v in hist.items()) / n, 2) if n else 0.0,
        "max_staleness": max(hist, default=0),
        "dropped_stale": L.trajectories_dropped_stale,
        "trajectories": L.trajectories,
        "importance_weight_mean": _mean(r.get("losses/importance_weight_mean") for r in steps),
        "clipfrac": _mean(r.get("losses/clipfrac") for r in steps),
        "approx_kl": _mean(r.get("losses/approx_kl") for r in steps),
        "behaviour_weight_mean": _mean(r.get("losses/behaviour_weight_mean") for r in steps),
        "reward_tracking": pairs,
        "reward_tracking_r": tracking_r(pairs),
        # The sync run's own split of its time (async: the same split, for the record).
        "rollout_s": rollout_s,
        "learner_s": learner_s,
        "overlap_bound": overlap_bound(rollout_s, learner_s),
    }


def split_time(steps: list[dict]) -> tuple[float | None, float | None]:
    """(rollout s, learner s) between the run's first and last step: the learner's step
    time summed, and the rest (in a sync run, waiting for its round's rollouts)."""
    timed = [r for r in steps if "perf/wall_s" in r and "perf/step_s" in r]
    if len(timed) < 2:
        return None, None
    learner = sum(r["perf/step_s"] for r in timed[1:])  # the first step's time is before the span
    whole = timed[-1]["perf/wall_s"] - timed[0]["perf/wall_s"]
    return round(max(0.0, whole - learner), 2), round(learner, 2)


def overlap_bound(rollout_s: float | None, learner_s: float | None) -> float | None:
    """The least share of the sync run's time an asynchronous run can take, by overlap
    alone: max(R, L) / (R + L) (the same versions, the rollouts hidden behind the steps or
    the steps behind the rollouts)."""
    if rollout_s is None or learner_s is None or rollout_s + learner_s <= 0:
        return None
    return round(max(rollout_s, learner_s) / (rollout_s + learner_s), 3)


def _span(xs: list) -> str:
    got = [x for x in xs if x is not None]
    if not got:
        return f"not reached ({len(xs)})"
    lo, hi, mean = min(got), max(got), statistics.fmean(got)
    miss = f", {len(xs) - len(got)} of {len(xs)} not reached" if len(got) < len(xs) else ""
    return f"{mean:.0f} [{lo:.0f}-{hi:.0f}]{miss}"


def by_setting(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in runs:
        out.setdefault(r["setting"], []).append(r)
    return out


def first_at(held: list[dict], threshold: float) -> dict | None:
    """The first evaluated version at or above `threshold` (its rl_s and version), if any."""
    return next((p for p in held if p["success"] >= threshold), None)


def averaged_at(held: list[dict], threshold: float, window_s: float) -> float | None:
    """The first time (s from v0, whole seconds) at which the held-out curve averaged over the
    last `window_s` reaches `threshold`. First crossings favour the mode scored more often:
    each evaluation is another chance to cross by noise. A window of time holds as much of
    either mode's curve."""
    if not held:
        return None
    t = window_s
    while t <= held[-1]["rl_s"] + window_s:
        got = [x for x in (_held_at(held, t - window_s + i) for i in range(int(window_s) + 1)) if x is not None]
        if got and statistics.fmean(got) >= threshold:
            return t
        t += 1.0
    return None


def _ratios(runs: list[dict], mine: list[float | None], sync: dict[int, list[dict]], at) -> str:
    """Each run's time `mine` as a share of its seed's sync run's time (`at` of its curve)."""
    out = []
    for r, t in zip(runs, mine):
        base = at(sync.get(r["seed"], []))
        if t is not None and base:
            out.append(f"{t / base:.2f}")
    return ", ".join(out) or "-"


def _times_row(
    name: str, runs: list[dict], sync: dict[int, list[dict]], threshold: float, window_s: float, bounds=None
) -> list:
    def first_s(held):
        return (first_at(held, threshold) or {}).get("rl_s")

    def averaged_s(held):
        return averaged_at(held, threshold, window_s)

    hits = [first_at(r["held_out"], threshold) for r in runs]
    firsts = [h["rl_s"] if h else None for h in hits]
    averaged = [averaged_s(r["held_out"]) for r in runs]
    bound, efficiency = _against_bound(runs, averaged, sync, averaged_s, bounds or {})
    return [
        threshold,
        name,
        len(runs),
        _span(firsts),
        _span([h["version"] if h else None for h in hits]),
        _ratios(runs, firsts, sync, first_s),
        _span(averaged),
        _ratios(runs, averaged, sync, averaged_s),
        bound,
        efficiency,
    ]


def _against_bound(runs, mine, sync, at, bounds: dict[int, float]) -> tuple[str, str]:
    """The same seed's sync overlap bound, and bound / achieved ratio (1: all of the
    overlap won), for each run of a setting."""
    got_bounds, effs = [], []
    for r, t in zip(runs, mine):
        b, base = bounds.get(r["seed"]), at(sync.get(r["seed"], []))
        if b is None or r["setting"] == "sync":
            continue
        got_bounds.append(f"{b:.2f}")
        if t is not None and base:
            effs.append(f"{b / (t / base):.2f}")
    return ", ".join(got_bounds) or "-", ", ".join(effs) or "-"


def print_tables(lat: str, sweep: dict, thresholds: tuple[float, ...], window_s: float = 30.0) -> None:
    groups = by_setting(sweep["runs"])
    sync = {r["seed"]: r["held_out"] for r in groups.get("sync", [])}
    bounds = {r["seed"]: r.get("overlap_bound") for r in groups.get("sync", []) if r.get("overlap_bound")}
    print_table(
        f"tool latency {lat}: seconds and versions from v0 to held-out sampled success (mean [range] over seeds); "
        f"then the same for the curve averaged over its last {window_s:g} s",
        [
            "held-out",
            "setting",
            "seeds",
            "s from v0",
            "versions",
            "s / same seed's sync",
            f"s, {window_s:g} s average",
            "averaged / same seed's sync",
            "overlap bound (sync's R, L)",
            "efficiency (bound / averaged ratio)",
        ],
        [_times_row(name, runs, sync, t, window_s, bounds) for t in thresholds for name, runs in groups.items()],
    )
    rows = [
        [
            name,
            _mean(r["wall_s"] for r in runs),
            _mean(r["versions"] for r in runs),
            _mean(r["held_out_first"] for r in runs),
            _mean(r["held_out_last"] for r in runs),
            _mean(r["tokens_per_s"] for r in runs),
            _mean(r["duty"] for r in runs),
            _mean(r["mean_staleness"] for r in runs),
            max(r["max_staleness"] for r in runs),
            sum(r["dropped_stale"] for r in runs),
            _mean(r["importance_weight_mean"] for r in runs),
            _mean(r["clipfrac"] for r in runs),
            _mean(r["approx_kl"] for r in runs),
            _mean(r["reward_tracking_r"] for r in runs),
        ]
        for name, runs in groups.items()
    ]
    print_table(
        f"tool latency {lat}: each setting, means over its seeds",
        [
            "setting",
            "learner wall s",
            "versions",
            "held-out v0",
            "held-out last",
            "trained tok/s",
            "duty",
            "mean stale",
            "max stale",
            "dropped stale (all seeds)",
            "IS ratio",
            "clip frac",
            "approx KL",
            "reward tracking r",
        ],
        rows,
    )


def _held_at(held: list[dict], t: float) -> float | None:
    """The held-out success of the newest evaluated version published by t."""
    got = [p["success"] for p in held if p["rl_s"] <= t]
    return got[-1] if got else None


def plot(results: dict, thresholds: tuple[float, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lats = list(results["latencies"])
    if not lats:
        return
    fig, axes = plt.subplots(1, len(lats), figsize=(6.5 * len(lats), 4.2), squeeze=False)
    for ax, lat in zip(axes[0], lats):
        for name, runs in by_setting(results["latencies"][lat]["runs"]).items():
            end = max(r["rl_s_evaluated"] or 0 for r in runs)
            ts = [end * i / 200 for i in range(201)]
            values = [[_held_at(r["held_out"], t) for r in runs] for t in ts]
            keep = [(t, [v for v in vs if v is not None]) for t, vs in zip(ts, values)]
            keep = [(t, vs) for t, vs in keep if vs]
            if not keep:
                continue
            t, vs = zip(*keep)
            (line,) = ax.plot(t, [statistics.fmean(v) for v in vs], label=f"{name} ({len(runs)} seeds)")
            ax.fill_between(t, [min(v) for v in vs], [max(v) for v in vs], color=line.get_color(), alpha=0.15)
        for t in thresholds:
            ax.axhline(t, color="k", ls=":", lw=1)
        ax.set_title(f"{results.get('args', {}).get('env', 'calculator')}, tools {lat}")
        ax.set_xlabel("seconds since v0 was published")
        ax.set_ylabel("held-out sampled success")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
