"""pass@k (core/rl/pass_at_k.py) against brute force, the evaluator's rows built from it
(rollout/scoring.pass_at_row), what the summary makes of them, and the engine's draw at
another temperature (the sweep's)."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy.sampling import decode_loop
from core.rl.pass_at_k import ks_for, pass_at_k, pass_at_ks, standard_error
from localstack.reports.pass_at import format_pass_at, pass_at_summary
from rollout.scoring import pass_at_row


def brute_force(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n samples (c of them correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_estimator_is_the_share_of_k_subsets_with_a_correct_sample(data):
    n = data.draw(st.integers(1, 10))
    c, k = data.draw(st.integers(0, n)), data.draw(st.integers(1, n))
    assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 64), data=st.data())
def test_pass_at_1_is_the_mean_pass_at_n_any_correct_and_k_never_lowers_it(n, data):
    correct = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=20))
    means, errors = pass_at_ks(correct, n)
    assert list(means) == ks_for(n) and means[1] == pytest.approx(np.mean(correct) / n)
    assert means[n] == pytest.approx(np.mean([c > 0 for c in correct]))
    values = list(means.values())
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))
    assert all(e >= 0 for e in errors.values())


def test_ks_are_the_powers_of_two_up_to_n_and_n():
    assert [ks_for(n) for n in (-1, 0, 1, 2, 3, 6, 8)] == [[], [], [1], [1, 2], [1, 2, 3], [1, 2, 4, 6], [1, 2, 4, 8]]


def test_bad_counts_are_refused():
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_standard_error_is_the_sample_deviation_over_root_n():
    assert standard_error([1.0]) == 0.0
    assert standard_error([0.0, 1.0, 0.0, 1.0]) == pytest.approx(np.std([0, 1, 0, 1], ddof=1) / 2)


@dataclasses.dataclass
class Outcome:
    reward: float
    info: dict = dataclasses.field(default_factory=dict)


def test_a_rows_pass_at_k_groups_each_tasks_samples():
    # 3 tasks x 4 samples, side by side: 4/4, 1/4, 0/4 correct.
    wins = [1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0]
    row = pass_at_row([Outcome(float(w)) for w in wins], None, 4)
    assert row["tasks"] == 3 and row["pass_at"]["1"] == pytest.approx(5 / 12, abs=1e-4)
    assert row["pass_at"]["4"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["pass_at"]["2"] == pytest.approx((1 + 0.5 + 0) / 3, abs=1e-4)  # 1 - C(3,2)/C(4,2) = 1/2
    assert row["success_se"] == pytest.approx(standard_error([1.0, 0.25, 0.0]))
    assert "pass_at" not in pass_at_row([Outcome(1.0)], None, 1)  # one sample: pass@1 is success


def _row(version, mode, success, temperature=1.0, pass_at=None):
    row = {"version": version, "mode": mode, "temperature": temperature, "success": success, "success_se": 0.01}
    if pass_at:
        row.update(samples=max(map(int, pass_at)), tasks=64, pass_at=pass_at, pass_at_se=dict.fromkeys(pass_at, 0.02))
    return row


def test_the_summary_tells_learning_from_sharpening():
    rows = [
        _row(0, "sampled", 0.30, pass_at={"1": 0.30, "8": 0.70}),
        _row(0, "greedy", 0.25, 0.0),
        _row(0, "sweep", 0.45, 0.5, {"1": 0.45, "8": 0.60}),
        _row(0, "sweep", 0.40, 0.2, {"1": 0.40, "8": 0.50}),
        _row(5, "sampled", 0.50),  # a middle version: one sample
        _row(10, "sampled", 0.80, pass_at={"1": 0.80, "8": 0.90}),
        _row(10, "greedy", 0.85, 0.0),
    ]
    s = pass_at_summary(rows)
    assert s["first"]["sampled"]["version"] == 0 and s["last"]["sampled"]["version"] == 10
    assert [p["temperature"] for p in s["sweep"]] == [0.0, 0.2, 0.5, 1.0]
    assert s["v0_best_pass1"] == {"temperature": 0.5, "success": 0.45}
    text = "\n".join(format_pass_at(s))
    assert "pass@8 0.900 ± 0.020" in text and "is above v0's best pass@1 over temperatures (0.450 at T=0.5)" in text
    rows[-2]["success"] = 0.44  # what a lower temperature gave v0 too: sharpening only
    assert "is not above" in "\n".join(format_pass_at(pass_at_summary(rows)))
    assert pass_at_summary([_row(0, "sampled", 0.3), _row(1, "sampled", 0.4)]) == {}  # nothing to say


def test_a_version_scored_twice_is_summarised_by_its_row_with_the_most_samples():
    """The final version may be scored with one sample before it is known to be final, then
    again with all: either order, the summary's last point is the full row."""
    one, full = _row(10, "sampled", 0.5), _row(10, "sampled", 0.8, pass_at={"1": 0.8, "4": 0.95})
    first = _row(0, "sampled", 0.3, pass_at={"1": 0.3, "4": 0.6})
    for order in ([first, one, full], [first, full, one]):
        assert pass_at_summary(order)["last"]["sampled"]["success"] == 0.8


def test_a_draw_at_another_temperature_follows_the_tempered_softmax_and_reports_the_models_log_prob():
    logits = np.array([2.0, 1.0, 0.0, -1.0], np.float32)
    n, t = 20000, 0.5
    tokens, logp = jax.jit(decode_loop.pick, static_argnums=2)(jnp.tile(logits, (n, 1)), jax.random.key(3), t)
    tokens = np.asarray(tokens)
    want = np.asarray(jax.nn.softmax(jnp.asarray(logits) / t))
    freq = np.bincount(tokens, minlength=4) / n
    assert np.all(np.abs(freq - want) < 4 * np.sqrt(want * (1 - want) / n) + 1e-3), (freq, want)
    model = np.asarray(jax.nn.log_softmax(jnp.asarray(logits)))
    np.testing.assert_allclose(np.asarray(logp), model[tokens], rtol=1e-5, atol=1e-5)
    greedy, _ = decode_loop.pick(jnp.asarray(logits)[None], jax.random.key(0), 0.0)
    assert int(greedy[0]) == 0
    with pytest.raises(ValueError):
        decode_loop.pick(jnp.asarray(logits)[None], jax.random.key(0), True)  # a bool is not a temperature


def test_only_the_first_version_is_swept_and_the_modes_are_never_changed():
    """A run scored v4 and v7 at every sweep temperature too: the list of modes had been
    extended in place by v0's sweep (run of 2026-12-07 08:00)."""
    from rollout.evaluator import mode_temperature, modes_for, sweep_temperatures

    modes, sweep = ["sampled", "greedy"], sweep_temperatures("0.5,1,0.2")
    assert sweep == [0.2, 0.5]  # 1 is the sampled mode's own row
    first = modes_for(modes, sweep, "ends", 0, first=True, final=None)
    assert first == ["sampled", "greedy", "sweep@0.2", "sweep@0.5"] and modes == ["sampled", "greedy"]
    assert modes_for(modes, sweep, "ends", 4, first=False, final=None) == ["sampled"]
    assert modes_for(modes, sweep, "ends", 9, first=False, final=9) == ["sampled", "greedy"]
    assert modes_for(modes, sweep, "every", 4, first=False, final=None) == ["sampled", "greedy"]
    assert [mode_temperature(t) for t in first] == [("sampled", 1.0), ("greedy", 0.0), ("sweep", 0.2), ("sweep", 0.5)]
    for bad in ("0,0.5", "-1", "hot"):
        with pytest.raises(SystemExit):
            sweep_temperatures(bad)


# Mutation testing (make mutation) found these unchecked: the refusal's words and the
# standard error of exactly two tasks.


def test_an_impossible_count_is_refused_naming_the_rule():
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError, match=rf"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}"):
            pass_at_k(n, c, k)


def test_the_standard_error_of_two_tasks_is_their_sample_spread():
    assert standard_error([0.0, 1.0]) == pytest.approx(0.5)  # sd (ddof 1) 0.707 / sqrt(2)
    assert standard_error([1.0]) == 0.0 and standard_error([]) == 0.0
