"""The eager reference: materialise every attention map, then read statistics off it.

This is the oracle every other backend is tested against, so it is written for obvious
correctness, not speed: it holds the full (B, H, L, L) probabilities and computes each
statistic by its textbook definition.
"""
from __future__ import annotations

import torch

from .attention_grad import GradSums
from .common import finish_stats, keep_qk, masked_scores, require_pooling
from .gates import apply_gates
from .pooling import pool_map, word_argmax
from .spec import PLAIN, AttentionLayout, RowStats, StatsSpec, WordPooling, visible_mask


def attention_stats_eager(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None,
                          pooling: WordPooling | None = None, layout: AttentionLayout = PLAIN):
    """Attention output and per-row statistics from the full probability maps.

    q:         (B, H, L, D)
    k, v:      (B, H_kv, L, D), H_kv = layout.n_key_value_heads or H; query head h reads
               key/value head h // (H / H_kv)
    key_valid: (B, L) bool, False for padding
    key_class: (B, L) int64 in [0, spec.n_key_classes)
    gates:     `LayerGates` (xi, uniform) of the layer, or None for none
    pooling:   word pooling of the batch, needed when spec.word_maps
    layout:    which keys each query sees (`AttentionLayout`: causal, window, key/value heads);
               every statistic is over the keys a row sees (the others have p = 0)
    Returns (out (B, L, H, D), RowStats); rows of padding queries are all zero.
    """
    B, H, L, D = q.shape
    scale = D**-0.5 if scale is None else scale
    group = layout.group_size(H)
    k_h, v_h = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, L, D): head h's k, v
    if layout.is_plain:
        p = torch.softmax(masked_scores(q, k_h, key_valid, scale), dim=-1)  # (B, H, L, L)
    else:
        # rows that see no key (padding queries under causal left padding) become uniform, not NaN
        s = torch.matmul(q, k_h.transpose(-1, -2)) * scale  # (B, H, L, L)
        p = torch.softmax(s.masked_fill(~visible_mask(key_valid, layout), torch.finfo(s.dtype).min), dim=-1)
    out = apply_gates(torch.matmul(p, v_h), v, key_valid, gates, layout)  # (B, H, L, D)

    stats = RowStats(layout=layout)
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
    if spec.class_mass:
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
    return out.transpose(1, 2), finish_stats(stats, spec, key_valid, "eager")


def attention_grad_eager(q, k, v, key_valid, key_class, n_classes: int, sink, scale=None):
    """The oracle of `kernels.attention_grad`: softmax attention on the materialised map P,
    with a hook on P that reads autograd's dL/dP and hands `sink` the same `GradSums`.

    Sums by their definition: over valid query rows i and valid keys j of class c,
    |dL/dP_ij| and P_ij; pairs counts them. Returns the output (B, H, L, D).
    """
    B, H, L, D = q.shape
    scale = D**-0.5 if scale is None else scale
    p = torch.softmax(masked_scores(q, k, key_valid, scale), dim=-1)  # (B, H, L, L)
    pair = key_valid[:, None, :, None] & key_valid[:, None, None, :]  # (B, 1, L, L): valid row i, valid key j

    def read(grad):  # grad: dL/dP (B, H, L, L)
        sums = [torch.zeros(H, n_classes, dtype=torch.float64, device=q.device) for _ in range(2)]
        pairs = torch.zeros(n_classes, dtype=torch.float64, device=q.device)
        for c in range(n_classes):
            on = (pair & (key_class == c)[:, None, None, :]).expand(B, H, L, L)  # (B, H, L, L)
            sums[0][:, c] = torch.where(on, grad.abs(), 0).double().sum((0, 2, 3))
            sums[1][:, c] = torch.where(on, p.detach(), 0).double().sum((0, 2, 3))
            pairs[c] = float(on[:, 0].sum())
        sink(GradSums(grad=sums[0], mass=sums[1], pairs=pairs, rows=int(key_valid.sum())))

    if p.requires_grad:
        p.register_hook(read)
    return torch.matmul(p, v)  # (B, H, L, D)
