"""pass@k: the chance that at least one of k samples solves a task, estimated from n >= k.

The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code"): with c of a task's n samples correct, pass@k = 1 - C(n - c, k) / C(n, k), the
probability that k of the n drawn without replacement include a correct one. Averaged
over tasks. Drawing k samples and checking any would be unbiased too, but throws away the
other n - k; this uses them all.

Why it is reported: RL that only sharpens (moves probability onto answers the model
already ranks first) raises pass@1 and leaves pass@n where it was; so does a lower
temperature. RL that teaches raises pass@n too (Yue et al. 2025).
"""

from __future__ import annotations

import math

import numpy as np

# The eval rows' mode of v0 scored at other temperatures (rollout/evaluator.py writes them,
# localstack/reports reads them): the control that tells sharpening from learning.
SWEEP_MODE = "sweep"


def pass_at_k(n: int, c: int, k: int) -> float:
    """One task: 1 - C(n-c, k) / C(n, k), computed as a product (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(max(n, 0).bit_length())]  # powers of two, the last <= n
    return ks if not ks or ks[-1] == n else [*ks, n]


def pass_at_ks(correct: list[int], n: int) -> tuple[dict[int, float], dict[int, float]]:
    """({k: mean pass@k}, {k: its standard error}) over tasks with `correct[t]` of n
    samples right, for k in ks_for(n). The error is over tasks (the sample standard
    deviation of the per-task estimates over sqrt(tasks)): it covers both the draw of the
    tasks and of the samples, since each task's estimate is unbiased."""
    if not correct:
        return {}, {}
    means, errors = {}, {}
    for k in ks_for(n):
        per_task = np.array([pass_at_k(n, c, k) for c in correct])
        means[k] = float(per_task.mean())
        errors[k] = standard_error(per_task)
    return means, errors


def standard_error(values) -> float:
    """The standard error of the mean of `values` (0 for fewer than two)."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return 0.0
    return float(values.std(ddof=1) / math.sqrt(len(values)))
