"""Does the reward the learner trains on track held-out success? Per policy version: the mean
batch reward of the steps trained while it was the newest version, against its held-out
sampled success (the seed's question with staleness: stale data can train on rewards the
current policy no longer earns)."""

from __future__ import annotations

import statistics


def reward_tracking(learner_rows: list[dict], eval_rows: list[dict], mode: str = "sampled") -> list[dict]:
    """[{version, train_reward, held_out}] for each version with both, by version."""
    trained: dict[int, list[float]] = {}
    for r in learner_rows:
        if "data/batch_reward" in r and "policy/version" in r:
            trained.setdefault(int(r["policy/version"]), []).append(float(r["data/batch_reward"]))
    held = {int(r["version"]): r["success"] for r in eval_rows if r.get("mode") == mode}
    return [
        {"version": v, "train_reward": round(statistics.fmean(rs), 4), "held_out": held[v]}
        for v, rs in sorted(trained.items())
        if v in held
    ]


def tracking_r(pairs: list[dict]) -> float | None:
    """Pearson's r between train reward and held-out success over the versions (None: fewer
    than 3, or either constant)."""
    xs, ys = [p["train_reward"] for p in pairs], [p["held_out"] for p in pairs]
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return round(statistics.correlation(xs, ys), 3)


def tracking_text(learner_rows: list[dict], eval_rows: list[dict]) -> str:
    pairs = reward_tracking(learner_rows, eval_rows)
    r = tracking_r(pairs)
    return f"r = {r} over {len(pairs)} versions" if r is not None else f"n/a ({len(pairs)} versions with both)"
