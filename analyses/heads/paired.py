"""Is a variant's change of accuracy more than noise? Paired tests on per-example correctness.

Every variant is evaluated on the same examples as the baseline, so the comparison is paired:
what matters is the examples on which the two disagree. With c (V, N) correctness of the
variants and c0 (N,) the baseline's, b = baseline right and variant wrong, c = the reverse,
m = b + c the discordant pairs and n = N the examples:

    delta      accuracy(variant) - accuracy(baseline) = (c - b) / n.
    McNemar    exact two-sided test of "the variant is as often right where the baseline is
               wrong (c) as the reverse (b)": under the null each disagreement goes either way
               with probability 1/2, so p = P(|X - m/2| >= |c - m/2|) for X ~ Binomial(m, 1/2)
               (scipy's binomtest). It uses only the disagreements, which is what makes it
               sensitive where accuracies differ by a few examples.
    interval   the exact (Clopper-Pearson) interval of pi = P(a disagreement favours the variant)
               from c ~ Binomial(m, pi), mapped to delta = m/n * (2 pi - 1): see
               `mcnemar_interval`. It is the McNemar test inverted, so the interval excludes 0
               if and only if McNemar's p is below its level's alpha.

Testing every head and layer is many tests: p-values are adjusted with Benjamini-Hochberg
across the variants of a run (`bh_adjust`), and a change is called significant at q < alpha.
The interval is per variant (unadjusted), like p.

Why not the paired percentile bootstrap used before: with few discordant pairs it is too
narrow (it cannot produce a positive delta when c = 0), so it excluded 0 where the exact test
did not (b = 4, c = 0, n = 200: p = 0.125, bootstrap interval [-0.045, -0.005]).
"""
from __future__ import annotations

import numpy as np

from bertscope.analyses.compare.stats import bh_adjust

__all__ = ["mcnemar_interval", "mcnemar_exact", "bh_adjust", "disagreements"]


def disagreements(correct: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(b, c) per variant: b = baseline right and variant wrong, c = the reverse.
    correct (V, N) or (N,) bool, base (N,) bool."""
    correct, base = np.atleast_2d(np.asarray(correct, bool)), np.asarray(base, bool)
    return (base & ~correct).sum(1), (~base & correct).sum(1)


def mcnemar_exact(b, c) -> np.ndarray:
    """Exact two-sided McNemar p-value for each pair of disagreement counts (1 when n = 0)."""
    from scipy.stats import binomtest  # here: the heads commands' --help must not wait for scipy.stats (~0.5 s)

    b, c = np.atleast_1d(b), np.atleast_1d(c)
    return np.array([1.0 if x + y == 0 else binomtest(int(x), int(x + y), 0.5).pvalue for x, y in zip(b, c)])


def mcnemar_interval(b, c, n: int, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Interval (low, high), each (V,), of delta = accuracy(variant) - accuracy(baseline), at
    `level`, that agrees with `mcnemar_exact`: it excludes 0 iff p < 1 - level.

    The exact McNemar test conditions on m = b + c, the number of discordant pairs: given m,
    c ~ Binomial(m, pi) with pi = P(a disagreement favours the variant), whatever the
    discordance rate (the nuisance parameter that conditioning removes). Clopper-Pearson's
    interval [pi_lo, pi_hi] for pi is the set of pi0 that the equal-tailed exact binomial test
    does not reject at 1 - level; for pi0 = 1/2 the Binomial(m, 1/2) distribution is
    symmetric, so that test is McNemar's two-sided exact test (scipy's binomtest). Given m,
    delta = (c - b) / n = (2c - m) / n has expectation m/n * (2 pi - 1), an increasing map of
    pi with 0 at pi = 1/2, so [m/n (2 pi_lo - 1), m/n (2 pi_hi - 1)] excludes 0 exactly when
    the test rejects pi = 1/2. It holds delta itself (pi_lo <= c/m <= pi_hi) and is
    conservative like Clopper-Pearson (coverage at least `level` given m). What it leaves out:
    the uncertainty of m itself (the interval is conditional on the observed number of
    disagreements; it is [0, 0] when there are none). That is the price of agreeing with the
    test; where m is small against n, the direction of the disagreements is what is uncertain.
    """
    from scipy.stats import beta  # as in mcnemar_exact

    b, c = np.atleast_1d(np.asarray(b, dtype=np.int64)), np.atleast_1d(np.asarray(c, dtype=np.int64))
    if n <= 0:
        raise ValueError("no examples")
    if (b < 0).any() or (c < 0).any() or (b + c > n).any():
        raise ValueError("disagreement counts must be >= 0 and b + c <= n")
    m = b + c
    tail = (1 - level) / 2
    pi_lo = np.where(c > 0, beta.ppf(tail, np.maximum(c, 1), m - c + 1), 0.0)
    pi_hi = np.where(c < m, beta.ppf(1 - tail, c + 1, np.maximum(m - c, 1)), 1.0)
    scale = m / n
    return scale * (2 * pi_lo - 1), scale * (2 * pi_hi - 1)
