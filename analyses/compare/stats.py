"""Per-head differences between two runs, and whether they are more than noise.

Arrays only (no files): the run-directory side is `bertscope.analyses.compare.command`.

A corpus mean moves between two runs (pre-trained vs fine-tuned, two corpora, two
checkpoints) for every head a little; the question is which heads moved beyond what the
variation between segments explains. With per-example statistics in both runs, each head
and statistic gets a two-sided test on its per-segment values:
    paired     the runs hold the same segments (same model input, two models): Wilcoxon
               signed-rank on the per-segment differences b - a. It needs no normality
               (masses are bounded, skewed, often near 0 or 1) and uses the pairing, which
               removes the segment-to-segment variation both runs share.
    unpaired   different segments (two corpora): Mann-Whitney U on the two samples.
Both compare segment-level values, each segment counting once (the `--average segments`
view), whereas heads.csv pools tokens; the diff reported beside the test is heads.csv's.
Testing every head is many tests: p-values are adjusted with Benjamini-Hochberg across
the heads of each statistic, which keeps the expected share of false discoveries among
the heads called changed at most alpha.
"""
from __future__ import annotations

import warnings

import numpy as np

PAIRED, UNPAIRED = "wilcoxon_signed_rank", "mann_whitney_u"
TEST_NAMES = {PAIRED: "Wilcoxon signed-rank (paired over shared segments)",
              UNPAIRED: "Mann-Whitney U (unpaired)"}


def bh_adjust(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q) of a 1-D array; NaN entries stay NaN and do
    not count as tests."""
    p = np.asarray(p, dtype=np.float64)
    q = np.full_like(p, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    if m == 0:
        return q
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = p[order] * m / np.arange(1, m + 1)
    q[order] = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)  # monotone from the top
    return q


def paired_test(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Wilcoxon signed-rank test of b - a, column by column.

    a, b: (N, K) values of the same N segments for K heads; a pair with a NaN is left out.
    Returns (p, n): (K,) p-values and the pairs used. A column whose differences are all
    zero has p = 1 (nothing changed); one without pairs has p = NaN.
    """
    from scipy.stats import wilcoxon  # here: `bertscope compare --help` must not wait for scipy.stats (~0.5 s)

    d = b - a  # (N, K)
    n = (~np.isnan(d)).sum(0)
    nonzero = (np.nan_to_num(d) != 0).sum(0)
    p = np.full(d.shape[1], np.nan)
    p[(n > 0) & (nonzero == 0)] = 1.0
    cols = np.flatnonzero(nonzero > 0)
    if len(cols):
        with warnings.catch_warnings():  # ties and small samples fall back to the normal approximation
            warnings.simplefilter("ignore")
            for j in cols:  # one call per head: scipy picks exact or normal per sample, not for all at once
                p[j] = wilcoxon(d[:, j], nan_policy="omit").pvalue
    return p, n


def unpaired_test(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-sided Mann-Whitney U test of a (Na, K) against b (Nb, K), column by column;
    NaN values are left out. Returns (p, n_a, n_b), each (K,). A column whose values are
    all equal has p = 1; one with an empty sample has p = NaN."""
    from scipy.stats import mannwhitneyu  # as in paired_test

    n_a, n_b = (~np.isnan(a)).sum(0), (~np.isnan(b)).sum(0)
    both = np.concatenate([a, b])  # (Na + Nb, K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an all-NaN column: nanmax/nanmin warn
        constant = np.nanmax(both, 0) == np.nanmin(both, 0)
    p = np.full(a.shape[1], np.nan)
    usable = (n_a > 0) & (n_b > 0)
    p[usable & constant] = 1.0
    cols = np.flatnonzero(usable & ~constant)
    if len(cols):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for j in cols:
                p[j] = mannwhitneyu(a[:, j], b[:, j], nan_policy="omit").pvalue
    return p, n_a, n_b


def head_test(a: np.ndarray, b: np.ndarray, paired: bool) -> dict[str, np.ndarray]:
    """The test of every head of one statistic, with BH across those heads.

    a, b: (N, layers, H) per-segment values (same segments in the same order when paired).
    Returns (layers, H) arrays p, q, n_a, n_b.
    """
    Ly, H = a.shape[1:]
    a2, b2 = a.reshape(len(a), -1), b.reshape(len(b), -1)  # (N, layers * H)
    if paired:
        p, n = paired_test(a2, b2)
        n_a = n_b = n
    else:
        p, n_a, n_b = unpaired_test(a2, b2)
    q = bh_adjust(p)
    return {k: v.reshape(Ly, H) for k, v in (("p", p), ("q", q), ("n_a", n_a), ("n_b", n_b))}


def top_changes(diff: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The k (layer, head) pairs, from 1, with the largest |diff|; unchanged (0 or NaN) heads never."""
    flat = np.abs(diff).ravel()
    order = np.argsort(np.where(np.isnan(flat), -np.inf, -flat), kind="stable")[:k]
    H = diff.shape[1]
    return [(int(i // H) + 1, int(i % H) + 1) for i in order if np.nan_to_num(flat[i]) != 0]
