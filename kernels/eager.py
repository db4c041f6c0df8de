"""The eager reference: materialise every attention map, then read statistics off it.

This is the oracle every other backend is tested against, so it is written for obvious
correctness, not speed: it holds the full (B, H, L, L) probabilities and computes each
statistic by its textbook definition.
"""
from __future__ import annotations

import torch

from .common import keep_qk, masked_scores, require_pooling, zero_padding_rows
from .gates import apply_gates
from .pooling import pool_map, word_argmax
from .spec import RowStats, StatsSpec, WordPooling


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
