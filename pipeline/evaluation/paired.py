"""Paired statistics of two runs on the same questions: the difference of means, its percentile bootstrap
interval, and a two-sided sign-flip randomization p-value. Pure numpy, vectorised over resamples.

Input is a matrix of per-question differences (questions x metrics, e.g. EM, F1, Acc of run B minus run A),
so every metric shares the same resamples.

- Interval: resample the questions with replacement `resamples` times, take the mean difference of each
  resample, and report its 2.5th and 97.5th percentiles (linear interpolation between order statistics).
- p-value: under "no difference" each question's difference is as likely negated, so flip the signs at
  random and count the flips whose |mean| is at least the observed |mean|. With at most `resamples` sign
  patterns (2**n <= resamples, n <= 13 at 10,000) every pattern is enumerated and p is exact: count / 2**n.
  Otherwise p = (count + 1) / (resamples + 1), which counts the observed pattern itself and so is never 0.
  Either way identical runs (all differences 0) give p = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK_CELLS = 1_000_000  # resamples x questions per block (x metrics x 8 bytes: ~24 MB for 3 metrics)
TIE = 1e-12  # |mean| equal to the observed one up to float rounding counts as "at least as extreme"


@dataclass
class Paired:
    """One metric's comparison; deltas are B - A over the paired questions."""

    n: int
    mean_a: float
    mean_b: float
    delta: float
    ci95: tuple[float, float]
    p: float
    p_exact: bool  # True: every sign pattern enumerated; False: Monte Carlo (count + 1) / (R + 1)

    @property
    def significant(self) -> bool:
        """Whether the 95% interval excludes 0."""
        return self.ci95[0] > 0 or self.ci95[1] < 0


def _blocks(total: int, n: int):
    """Sizes of the resample blocks that keep each block's matrix near CHUNK_CELLS."""
    size = max(1, CHUNK_CELLS // max(n, 1))
    for start in range(0, total, size):
        yield min(size, total - start)


def bootstrap_ci(diffs: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The 95% percentile bootstrap interval of the column means of `diffs` (n x m): an m x 2 array."""
    n = diffs.shape[0]
    rng = np.random.default_rng([seed, 0])
    means = np.concatenate(
        [diffs[rng.integers(0, n, size=(b, n))].mean(axis=1) for b in _blocks(resamples, n)]
    )  # resamples x m
    return np.quantile(means, [0.025, 0.975], axis=0).T


def randomization_p(diffs: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, bool]:
    """Two-sided sign-flip p-value of each column mean of `diffs` (n x m), and whether it is exact."""
    n = diffs.shape[0]
    observed = np.abs(diffs.mean(axis=0)) - TIE
    if n < 63 and 2**n <= resamples:  # enumerate every pattern: bit j of pattern i flips question j
        bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
        means = ((1 - 2 * bits) @ diffs) / n
        return (np.abs(means) >= observed).mean(axis=0), True
    rng = np.random.default_rng([seed, 1])
    count = np.zeros(diffs.shape[1])
    for b in _blocks(resamples, n):
        signs = rng.integers(0, 2, size=(b, n), dtype=np.int8) * 2 - 1
        count += (np.abs(signs @ diffs / n) >= observed).sum(axis=0)
    return (count + 1) / (resamples + 1), False


def compare(a: np.ndarray, b: np.ndarray, resamples: int = 10_000, seed: int = 0) -> list[Paired]:
    """Per column (metric) of the paired score matrices `a` and `b` (questions x metrics, same row order)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"paired score matrices must have one shape (questions x metrics): {a.shape} vs {b.shape}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    n = a.shape[0]
    if n == 0:
        nan = float("nan")
        return [Paired(0, nan, nan, nan, (nan, nan), nan, False) for _ in range(a.shape[1])]
    diffs = b - a
    ci = bootstrap_ci(diffs, resamples, seed)
    p, exact = randomization_p(diffs, resamples, seed)
    return [
        Paired(
            n=n,
            mean_a=float(a[:, j].mean()),
            mean_b=float(b[:, j].mean()),
            delta=float(diffs[:, j].mean()),
            ci95=(float(ci[j, 0]), float(ci[j, 1])),
            p=float(p[j]),
            p_exact=exact,
        )
        for j in range(a.shape[1])
    ]
