"""Helpers every backend shares, kept out of the oracle (`eager.py`) so that the fast paths
depend on the contract, not on the reference they are tested against."""
from __future__ import annotations

import torch

from . import spec as _spec
from .spec import AttentionLayout, RowStats, StatsSpec, missing_stats


def masked_scores(q, k, key_valid, scale):
    """Scaled scores with padding keys set to the most negative finite float.

    A finite fill (not -inf) keeps a sequence with no valid key at all finite: its rows
    become uniform instead of NaN. For every real row exp(min - max) is exactly 0.
    """
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, L, L)
    return s.masked_fill(~key_valid[:, None, None, :], torch.finfo(s.dtype).min)


def require_pooling(pooling):
    if pooling is None:
        raise ValueError("spec.word_maps needs the batch's WordPooling (pooling=...)")
    return pooling


def keep_qk(stats: RowStats, q, k, scale, spec: StatsSpec):
    """Hand q and k on as they are (views): cross-layer analyses recompute tiles from them."""
    if spec.keep_qk:
        stats.queries, stats.keys, stats.scale = q, k, scale


def finish_stats(stats: RowStats, spec: StatsSpec, query_valid, backend: str) -> RowStats:
    """Every backend's last step: fail loudly when a statistic of the table that `spec` asks
    for was not computed (a backend someone forgot), then set padding rows."""
    missing = missing_stats(stats, spec)
    if missing:
        raise NotImplementedError(f"the {backend} backend does not compute {', '.join(missing)} "
                                  "(see docs/contributing.md); use another --backend")
    return zero_padding_rows(stats, query_valid)


def zero_padding_rows(stats: RowStats, query_valid):
    """Set every per-row statistic of padding queries to the table's `padding` value (0), so
    that no consumer can trip on them."""
    if bool(query_valid.all()):
        return stats
    keep = query_valid[:, None, :]  # (B, 1, L)
    for stat in _spec.ROW_STATS:
        t = getattr(stats, stat.name, None)
        if t is not None and stat.padding is not None:
            mask = keep.view(*keep.shape, *(1,) * (t.dim() - 3))  # (B, 1, L, 1...)
            setattr(stats, stat.name, torch.where(mask, t, torch.full_like(t, stat.padding)))
    return stats


def query_blocks(L: int, rows_per_query: int, layout: AttentionLayout, budget: int, min_rows: int = 1):
    """[(i0, i1, k0, k1)]: query blocks [i0, i1) covering 0..L-1, each with the keys [k0, k1)
    its rows may see (the union of their `key_band`s: lo(i0) .. hi(i1 - 1)), as long as
    rows_per_query * (i1 - i0) * (k1 - k0) <= budget scores allows (at least one row).

    A causal block reads the keys up to its last row, a windowed one from its first row's
    left edge on, so the blocks' scores add up to ~L^2 / 2 (causal) or ~L (w + block) (window)
    instead of L^2."""
    blocks, i0 = [], 0
    while i0 < L:
        k0 = layout.key_band(i0, L)[0]
        # the largest n that fits, by bisection (the band only grows with n)
        least = min(L - i0, max(1, -(-min_rows // rows_per_query)))
        lo, hi = least, L - i0 if layout.window is None else max(least, min(L - i0, sum(layout.window) + 1))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if rows_per_query * mid * (layout.key_band(i0 + mid - 1, L)[1] + 1 - k0) <= budget:
                lo = mid
            else:
                hi = mid - 1
        i1 = i0 + lo
        blocks.append((i0, i1, k0, layout.key_band(i1 - 1, L)[1] + 1))
        i0 = i1
    return blocks
