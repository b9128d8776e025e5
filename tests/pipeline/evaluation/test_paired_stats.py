"""The paired statistics (pipeline.evaluation.paired) on cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.evaluation.paired import bootstrap_ci, compare, randomization_p


def col(*values: float) -> np.ndarray:
    return np.array(values, dtype=float)[:, None]


def test_identical_runs_give_zero_delta_zero_interval_and_p_one():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 2, size=(200, 3)).astype(float)  # 200 questions: Monte Carlo p
    for r in compare(scores, scores.copy()):
        assert (r.delta, r.ci95, r.p, r.n) == (0.0, (0.0, 0.0), 1.0, 200)
        assert not r.significant
    small = compare(scores[:5], scores[:5])  # 5 questions: exact p
    assert small[0].p == 1.0 and small[0].p_exact


def test_exact_sign_flip_p_by_hand():
    # diffs (1, 1, 1): of the 8 sign patterns only +++ and --- reach |mean| 1, so p = 2/8
    p, exact = randomization_p(col(1, 1, 1), 10_000, 0)
    assert exact and p[0] == pytest.approx(0.25)
    # diffs (1, 0, 0, 1): |mean| >= 1/2 for ++, -- on the two nonzero ones (x4 for the zeros' signs): 8 of 16
    p, _ = randomization_p(col(1, 0, 0, 1), 10_000, 0)
    assert p[0] == pytest.approx(0.5)
    # diffs (2, -1): means over (+,+), (+,-), (-,+), (-,-) are 0.5, 1.5, -1.5, -0.5; |.| >= 0.5 for all 4
    p, _ = randomization_p(col(2, -1), 10_000, 0)
    assert p[0] == 1.0


def test_monte_carlo_p_matches_the_exact_one():
    # 10 diffs of 1 and 3 of 0: exact p = 2 * 8 / 2**13 (the ten 1s all one sign; the zeros free)
    diffs = col(*([1] * 10 + [0] * 3))
    exact, is_exact = randomization_p(diffs, 10_000, 0)
    mc, mc_exact = randomization_p(diffs, 2**13 - 1, 0)  # one pattern fewer than 2**13: sampled
    assert is_exact and not mc_exact
    assert exact[0] == pytest.approx(16 / 2**13)
    assert mc[0] == pytest.approx(exact[0], abs=0.005)


def test_bootstrap_of_two_questions_by_hand():
    # diffs (0, 1): resample means 0, 0.5, 1 with chances 1/4, 1/2, 1/4, so the 2.5% and 97.5% points are 0 and 1
    assert bootstrap_ci(col(0, 1), 10_000, 0)[0].tolist() == [0.0, 1.0]
    # a constant difference has no spread
    lo, hi = bootstrap_ci(col(0.25, 0.25, 0.25), 1000, 0)[0]
    assert lo == pytest.approx(0.25) and hi == pytest.approx(0.25)


def test_bootstrap_interval_matches_the_normal_approximation():
    rng = np.random.default_rng(7)
    diffs = rng.choice([-1.0, 0.0, 1.0], p=[0.2, 0.5, 0.3], size=(2000, 1))
    lo, hi = bootstrap_ci(diffs, 10_000, 1)[0]
    half = 1.96 * diffs.std(ddof=0) / np.sqrt(len(diffs))
    assert lo == pytest.approx(diffs.mean() - half, abs=0.004) and hi == pytest.approx(diffs.mean() + half, abs=0.004)


def test_large_difference_is_significant_and_seeded():
    rng = np.random.default_rng(11)
    a = (rng.random((300, 2)) < 0.4).astype(float)
    b = np.maximum(a, (rng.random((300, 2)) < 0.3).astype(float))  # b right wherever a is, and on ~30% more
    first = compare(a, b, seed=5)
    for r in first:
        assert r.p < 0.01 and r.ci95[0] > 0 and r.significant and not r.p_exact
        assert r.delta == pytest.approx(r.mean_b - r.mean_a)
    assert compare(a, b, seed=5) == first  # seeded: the same numbers again
    spread = np.random.default_rng(2).random((50, 1))  # continuous differences: a new seed moves the ends
    assert bootstrap_ci(spread, 500, 5).tolist() != bootstrap_ci(spread, 500, 6).tolist()


def test_smaller_run_resample_counts_and_bad_shapes():
    assert compare(np.zeros((0, 3)), np.zeros((0, 3)))[0].n == 0
    with pytest.raises(ValueError, match="one shape"):
        compare(np.zeros((3, 1)), np.zeros((4, 1)))
    with pytest.raises(ValueError, match="at least 1"):
        compare(np.zeros((3, 1)), np.zeros((3, 1)), resamples=0)
