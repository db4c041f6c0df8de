"""Helpers every backend shares, kept out of the oracle (`eager.py`) so that the fast paths
depend on the contract, not on the reference they are tested against."""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass

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


def finish_stats(stats: RowStats, spec: StatsSpec, query_valid, backend: str, rows_zeroed: bool = False) -> RowStats:
    """Every backend's last step: fail loudly when a statistic of the table that `spec` asks
    for was not computed (a backend someone forgot), then set padding rows (unless the backend
    wrote them itself: rows_zeroed)."""
    missing = missing_stats(stats, spec)
    if missing:
        raise NotImplementedError(f"the {backend} backend does not compute {', '.join(missing)} "
                                  "(see docs/contributing.md); use another --backend")
    return stats if rows_zeroed else zero_padding_rows(stats, query_valid)


@dataclass(frozen=True)
class PaddingRows:
    """The padding rows of one (B, L) `query_valid`, worked out once for every layer call that gets
    that very tensor (the engine: once per mask of a forward pass, `known_padding`), not once per
    call. `padded` says whether it has any: the host knows it from the batch it collated, where
    reading the tensor (`bool(query_valid.all())`) would wait for the device. `fill[n]` is the
    mask a statistic of n + 3 dimensions is filled through, (B, 1, L) then (B, 1, L, 1): True on
    padding rows. Not padded: nothing to fill."""

    query_valid: torch.Tensor
    padded: bool
    fill: tuple[torch.Tensor, ...] = ()

    @classmethod
    def of(cls, query_valid: torch.Tensor, padded: bool | None = None) -> PaddingRows:
        """padded: what the caller knows; None when it does not (the rows are filled then: right
        whatever the tensor holds, with no read of it)."""
        if padded is False:
            return cls(query_valid, False)
        pad = ~query_valid[:, None, :]  # (B, 1, L)
        return cls(query_valid, True, (pad, pad[..., None]))

    def mask(self, dim: int) -> torch.Tensor:
        """The fill mask of a statistic of `dim` dimensions (B, H, L, ...)."""
        if dim - 3 < len(self.fill):
            return self.fill[dim - 3]
        return self.fill[0].view(*self.fill[0].shape, *(1,) * (dim - 3))


_PADDING: contextvars.ContextVar[PaddingRows | None] = contextvars.ContextVar("bertscope_padding", default=None)


@contextmanager
def known_padding(rows: PaddingRows):
    """Within this block, `zero_padding_rows` of a call whose query_valid is `rows.query_valid`
    (the same tensor, not an equal one) takes `rows` instead of working them out again."""
    token = _PADDING.set(rows)
    try:
        yield rows
    finally:
        _PADDING.reset(token)


def zero_padding_rows(stats: RowStats, query_valid):
    """Set every per-row statistic of padding queries to the table's `padding` value (0), so
    that no consumer can trip on them. Never reads query_valid on the host (on a GPU that would
    wait for the device): a batch known to have no padding (`known_padding`) is left as it is,
    any other is filled through the mask, one masked_fill per statistic."""
    known = _PADDING.get()
    rows = known if known is not None and known.query_valid is query_valid else PaddingRows.of(query_valid)
    if not rows.padded:
        return stats
    for stat in _spec.ROW_STATS:
        t = getattr(stats, stat.name, None)
        if t is not None and stat.padding is not None:
            setattr(stats, stat.name, t.masked_fill(rows.mask(t.dim()), stat.padding))
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
