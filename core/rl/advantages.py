"""Group-relative advantages: RL math that both sides share.

The rollout pipeline computes them once a group of G episodes for one prompt is complete
(numpy, on the host); the learner only reads them from the records. Kept outside the
learner package so that the rollout side never imports the learner.
"""

from __future__ import annotations

import numpy as np


# Per group of trajectories sampled for one prompt; the pipeline calls these with numpy on
# the host. A group whose rewards are all equal carries no signal: every estimator returns
# exact zeros there (the packer drops such groups by testing for exact zeros).
def grpo_advantages(rewards, eps: float = 1e-6) -> np.ndarray:
    """GRPO: (r - mean(group)) / (std(group) + eps), population std."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0 or r.std() < eps:
        return np.zeros_like(r, dtype=np.float32)
    return ((r - r.mean()) / (r.std() + eps)).astype(np.float32)


def rloo_advantages(rewards) -> np.ndarray:
    """RLOO: r_i minus the mean of the *other* rewards, = n/(n-1) * (r_i - mean).
    A group of one has nobody to leave out: 0."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2 or np.all(r == r[0]):
        return np.zeros_like(r, dtype=np.float32)
    return (r - (r.sum() - r) / (r.size - 1)).astype(np.float32)


def dr_grpo_advantages(rewards) -> np.ndarray:
    """Dr. GRPO: r - mean(group), no division by the std (which biases towards easy and
    hard prompts)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0 or np.all(r == r[0]):
        return np.zeros_like(r, dtype=np.float32)
    return (r - r.mean()).astype(np.float32)


ADVANTAGE_ESTIMATORS = {"grpo": grpo_advantages, "rloo": rloo_advantages, "dr_grpo": dr_grpo_advantages}
