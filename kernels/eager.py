"""The eager reference: materialise every attention map, then read statistics off it.

This is the oracle every other backend is tested against, so it is written for obvious
correctness, not speed: it holds the full (B, H, L, L) probabilities and computes each
statistic by its textbook definition.
"""
from __future__ import annotations

import torch

from .gates import apply_gates
from .pooling import pool_map, word_argmax
from .spec import RowStats, StatsSpec, WordPooling


def masked_scores(q, k, key_valid, scale):
    """Scaled scores with padding keys set to the most negative finite float.

    A finite fill (not -inf) keeps a sequence with no valid key at all finite: its rows
    become uniform instead of NaN. For every real row exp(min - max) is exactly 0.
    """
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, L, L)
    return s.masked_fill(~key_valid[:, None, None, :], torch.finfo(s.dtype).min)


def attention_stats_eager(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None,
                          pooling: WordPooling | None = None):
    """Attention output and per-row statistics from the full probability maps.

    q, k, v:   (B, H, L, D)
    key_valid: (B, L) bool, False for padding
    key_class: (B, L) int64 in [0, spec.n_key_classes)
    gates:     `LayerGates` (xi, uniform) of the layer, or None for none
    pooling:   word pooling of the batch, needed when spec.word_maps
    Returns (out (B, L, H, D), RowStats); rows of padding queries are all zero.
    """
    B, H, L, D = q.shape
    scale = D**-0.5 if scale is None else scale
    p = torch.softmax(masked_scores(q, k, key_valid, scale), dim=-1)  # (B, H, L, L)
    out = apply_gates(torch.matmul(p, v), v, key_valid, gates)  # (B, H, L, D)

    stats = RowStats()
    if spec.entropy:
        stats.entropy = -torch.special.xlogy(p, p).sum(-1)  # (B, H, L); 0 ln 0 = 0
    if spec.offsets:
        i = torch.arange(L, device=q.device)
        cols = []
        for o in spec.offsets:
            j = i + o
            inside = (j >= 0) & (j < L)
            picked = p[..., i, j.clamp(0, L - 1)]  # (B, H, L): p[b, h, i, i + o]
            cols.append(torch.where(inside, picked, torch.zeros_like(picked)))
        stats.offset_mass = torch.stack(cols, dim=-1)  # (B, H, L, O)
    one_hot = torch.nn.functional.one_hot(key_class, spec.n_key_classes).to(p.dtype)  # (B, L, C)
    stats.class_mass = torch.matmul(p, one_hot[:, None])  # (B, H, L, C)
    if spec.argmax:
        stats.argmax = p.argmax(dim=-1)  # (B, H, L), first maximum on ties
    if spec.column_mass:
        stats.column_mass = (p * key_valid[:, None, :, None]).sum(-2)  # (B, H, L): over valid query rows
    if spec.word_maps:
        stats.word_map = pool_map(p, require_pooling(pooling))  # (B, H, W, W)
        stats.word_argmax = word_argmax(stats.word_map, pooling.candidate)  # (B, H, W)
    keep_qk(stats, q, k, scale, spec)
    return out.transpose(1, 2), zero_padding_rows(stats, key_valid)


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
