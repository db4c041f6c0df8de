"""Is a variant's change of accuracy more than noise? Paired tests on per-example correctness.

Every variant is evaluated on the same examples as the baseline, so the comparison is paired:
what matters is the examples on which the two disagree. With c (V, N) correctness of the
variants and c0 (N,) the baseline's:

    delta      accuracy(variant) - accuracy(baseline) = mean over examples of c - c0.
    bootstrap  a paired percentile interval for delta: resample the N examples with
               replacement (the same resample for variant and baseline), recompute delta,
               take the 2.5% and 97.5% quantiles of `resamples` such deltas. Seeded.
    McNemar    exact two-sided test of "the variant is as often right where the baseline is
               wrong (c) as the reverse (b)": under the null each disagreement goes either way
               with probability 1/2, so p = P(|X - n/2| >= |b - n/2|) for X ~ Binomial(n =
               b + c, 1/2) (scipy's binomtest). It uses only the disagreements, which is what
               makes it sensitive where accuracies differ by a few examples.

Testing every head and layer is many tests: p-values are adjusted with Benjamini-Hochberg
across the variants of a run (`bh_adjust`), and a change is called significant at q < alpha.
"""
from __future__ import annotations

import numpy as np

from bertscope.analyses.compare.stats import bh_adjust

__all__ = ["paired_bootstrap", "mcnemar_exact", "bh_adjust", "disagreements"]


def disagreements(correct: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(b, c) per variant: b = baseline right and variant wrong, c = the reverse.
    correct (V, N) or (N,) bool, base (N,) bool."""
    correct, base = np.atleast_2d(np.asarray(correct, bool)), np.asarray(base, bool)
    return (base & ~correct).sum(1), (~base & correct).sum(1)


def mcnemar_exact(b, c) -> np.ndarray:
    """Exact two-sided McNemar p-value for each pair of disagreement counts (1 when n = 0)."""
    from scipy.stats import binomtest

    b, c = np.atleast_1d(b), np.atleast_1d(c)
    return np.array([1.0 if x + y == 0 else binomtest(int(x), int(x + y), 0.5).pvalue for x, y in zip(b, c)])


def paired_bootstrap(correct: np.ndarray, base: np.ndarray, resamples: int = 1000, seed: int = 0,
                     level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval (low, high), each (V,), of accuracy(variant) - accuracy(baseline).

    One set of `resamples` resamples of the examples serves every variant (drawn from
    `np.random.default_rng(seed)`), as counts per example: delta* = d @ w / N for d = c - c0."""
    correct = np.atleast_2d(np.asarray(correct, bool))
    d = correct.astype(np.float64) - np.asarray(base, bool).astype(np.float64)[None, :]  # (V, N)
    N = d.shape[1]
    if N == 0:
        raise ValueError("no examples to resample")
    rng = np.random.default_rng(seed)
    counts = np.stack([np.bincount(rng.integers(0, N, N), minlength=N) for _ in range(resamples)])  # (R, N)
    deltas = d @ counts.T.astype(np.float64) / N  # (V, R)
    tail = (1 - level) / 2
    low, high = np.quantile(deltas, [tail, 1 - tail], axis=1)
    return low, high
