"""Helpers every backend shares, kept out of the oracle (`eager.py`) so that the fast paths
depend on the contract, not on the reference they are tested against."""
from __future__ import annotations

import torch

from .spec import RowStats, StatsSpec


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


def zero_padding_rows(stats: RowStats, query_valid):
    """Zero every statistic of padding queries so that no consumer can trip on them."""
    if bool(query_valid.all()):
        return stats
    keep = query_valid[:, None, :]  # (B, 1, L)
    for name in ("entropy", "argmax"):
        t = getattr(stats, name)
        if t is not None:
            setattr(stats, name, torch.where(keep, t, torch.zeros_like(t)))
    for name in ("offset_mass", "class_mass"):
        t = getattr(stats, name)
        if t is not None:
            setattr(stats, name, torch.where(keep[..., None], t, torch.zeros_like(t)))
    return stats
