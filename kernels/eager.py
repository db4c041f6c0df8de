"""The eager reference: materialise every attention map, then read statistics off it.

This is the oracle every other backend is tested against, so it is written for obvious
correctness, not speed: it holds the full (B, H, L, L) probabilities and reads every
statistic off them with `kernels.reference`, where each one is defined.
"""
from __future__ import annotations

import dataclasses

import torch

from .attention_grad import GradSums
from .common import finish_stats, keep_qk, masked_scores
from .gates import apply_gates
from .reference import stats_from_probs, visible_probs
from .spec import PLAIN, AttentionLayout, StatsSpec, WordPooling
from .streaming import covered_rows_reference, streaming_output_reference, streaming_row_stats


def attention_stats_eager(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None,
                          pooling: WordPooling | None = None, layout: AttentionLayout = PLAIN, token_ids=None,
                          norms=None):
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
    token_ids: (B, L) int64 token ids (>= 0; queries and keys are the same tokens), needed when
               spec.token_relations (duplicate and prefix-match mass); padding positions are ignored
    norms:     (B, H, L) each key's value norm n_j = ||f_h(x_j)|| per query head, needed when spec.norms
               (the norm-based twins, `kernels.norms`); padding keys are ignored
    Returns (out (B, L, H, D), RowStats); rows of padding queries are all zero.
    """
    D = q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    p = visible_probs(q, k, key_valid, layout, scale)  # (B, H, L, L)
    v_h = v.repeat_interleave(layout.group_size(q.shape[1]), dim=1)  # (B, H, L, D): head h's values
    o = torch.matmul(p, v_h)  # (B, H, L, D): the un-gated output
    out = apply_gates(o, v, key_valid, gates, layout)  # (B, H, L, D)
    if not spec.streaming:
        stats = stats_from_probs(p, key_valid, key_class, spec, layout, pooling, token_ids=token_ids, norms=norms)
    else:  # the streaming error by its definition: the explicit sink + recent mask (kernels.streaming)
        stats = stats_from_probs(p, key_valid, key_class, dataclasses.replace(spec, streaming=()), layout, pooling,
                                 token_ids=token_ids, norms=norms)
        sink, recent = spec.streaming
        o_L = streaming_output_reference(q, k, v, key_valid, layout, scale, sink, recent)  # (B, H, L, D)
        covered = covered_rows_reference(key_valid, layout, sink, recent)  # (B, L)
        stats.streaming_error_sq, stats.output_sq = streaming_row_stats(o, o_L, covered)
        stats = finish_stats(stats, spec, key_valid, "eager")
    keep_qk(stats, q, k, scale, spec)
    return out.transpose(1, 2), stats


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
