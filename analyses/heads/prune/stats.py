"""The maths of Michel et al. (2019)'s iterative pruning (section 4), for `bertscope heads prune`.

The schedule (how many heads are pruned in all after each step), the order the importance
removes them in (recomputed each step with the heads pruned so far masked), the seeded random
orders beside it, the masked variants each order gives, and the largest fraction prunable
within a tolerance. No command line and no files: `command.py` reads the arguments and writes
the outputs.
"""
from __future__ import annotations

import itertools

import numpy as np

from bertscope.analyses.heads import variants as V
from bertscope.analyses.heads.importance.stats import head_importance, least_important
from bertscope.kernels.spec import Gate


def prune_counts(n_heads: int, step: float, max_fraction: float) -> list[int]:
    """Heads pruned in all after steps 1, 2, ...: round half up of s x step x n_heads, up to max_fraction."""
    steps = int(max_fraction / step + 1e-9)
    return [int(np.floor(s * step * n_heads + 0.5)) for s in range(1, steps + 1)]


def importance_order(loaded, task, counts: list[int], batch_size=32, convention="michel", normalise=True,
                     progress=True, log=lambda *a: None):
    """The heads Michel's iterative pruning removes at each step, (layer, head) 0-based lists, and
    each step's Importance (computed with the heads pruned before it masked)."""
    live = np.ones((loaded.n_layers, loaded.n_heads), bool)
    removed, scores, done = [], [], 0
    for s, n in enumerate(counts, 1):
        imp = head_importance(loaded, task, batch_size, convention, normalise, live.astype(np.int8), progress)
        heads = least_important(imp.scores, live, n - done)
        for lay, h in heads:
            live[lay, h] = False
        removed.append(heads)
        scores.append(imp)
        done = n
        log(f"step {s}: {n} heads pruned ({n / live.size:.0%}), dev loss before this step {imp.loss:.4f}; removed "
            + ", ".join(f"{lay + 1}-{h + 1}" for lay, h in heads))
    return removed, scores


def random_order(n_layers: int, n_heads: int, counts: list[int], seed: int) -> list[list[tuple[int, int]]]:
    """The heads a seeded random order removes at each step (one permutation of all heads)."""
    perm = np.random.default_rng(seed).permutation(n_layers * n_heads)
    return [[(int(i // n_heads), int(i % n_heads)) for i in perm[a:b]] for a, b in itertools.pairwise([0] + counts)]


def prunable_fraction(fractions, accuracy, base: float, tolerance: float) -> float:
    """The largest fraction pruned such that every step up to it keeps accuracy >= base - tolerance."""
    best = 0.0
    for f, a in zip(fractions, accuracy):
        if a < base - tolerance - 1e-12:
            break
        best = f
    return best


def cumulative_variants(name: str, orders, L: int, H: int):
    """One ZERO-gated Variant per step: the heads removed up to it."""
    out, so_far = [], []
    for s, heads in enumerate(orders, 1):
        so_far = so_far + list(heads)
        out.append(V.gated(f"{name} step {s}", L, H, so_far, Gate.ZERO))
    return out
