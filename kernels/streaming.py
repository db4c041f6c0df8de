"""Streaming attention (StreamingLLM's attention sink + recent window) beside a head's full
attention: the output a head would give if it could see only the first `sink` tokens and the
last `recent` ones, and how far that is from what it gives (DuoAttention, Xiao et al. 2024:
heads whose output barely moves are "streaming heads", the others "retrieval heads").

The streaming set of query position i is the keys j in [0, sink) or in [i - recent + 1, i],
intersected with the keys the layer itself lets row i see (its `AttentionLayout` band, real
keys only). The same definition holds for every layout: for a bidirectional encoder "recent"
is the `recent` keys nearest *before and including* the query, so an encoder's streaming head
loses everything after the query beyond the sink (what a KV cache that streams would keep).

    streaming_output(q, k, v, key_valid, layout, scale, sink, recent) -> o_L (B, H, L, D)
    covered_rows(key_valid, layout, sink, recent) -> (B, L) bool: rows whose every visible key
        is in the streaming set, where o_L is o by construction
    streaming_row_stats(o, o_L, covered) -> (err_sq, out_sq) (B, H, L): the per-row statistics
        `streaming_error_sq` and `output_sq` of the kernels' table

Cost: each query block is scored against a gathered key set (the sink keys, then the block's
recent band), so memory is O(block x (sink + recent + block)) per head, never L x L, and the
work is O(L (sink + recent)) per head. A row with no streaming key (sink = recent = 0, or a
padding row) gets o_L = 0, so its error is 1. A covered row's error is exactly 0, decided
from the positions (`covered_rows`, O(L) running counts), not by subtracting two floats: a
sliding-window layer whose window fits in the recent span is exactly 0 on every backend.
"""
from __future__ import annotations

import torch

from .spec import PLAIN, AttentionLayout, LayerGates, visible_mask

# query rows of one block of `streaming_output`
BLOCK_ROWS = 128
HALF = (torch.float16, torch.bfloat16)


def check_span(span) -> tuple[int, int]:
    """(sink, recent) as two whole numbers >= 0, or a ValueError."""
    try:
        sink, recent = (int(x) for x in span)
    except (TypeError, ValueError):
        raise ValueError(f"the streaming span must be (sink, recent), not {span!r}") from None
    if sink < 0 or recent < 0 or (sink, recent) != tuple(span):
        raise ValueError(f"sink and recent must be whole numbers >= 0, not {tuple(span)}")
    return sink, recent


def streaming_output(q, k, v, key_valid, layout: AttentionLayout = PLAIN, scale=None, sink: int = 4,
                     recent: int = 64, block_rows: int = BLOCK_ROWS):
    """o_L (B, H, L, D): each head's attention output over its streaming set only (module docstring).

    q: (B, H, L, D); k, v: (B, H_kv, L, D) (query head h reads key head h // (H / H_kv));
    key_valid: (B, L) bool. Half precision is computed in float32 and returned in v's dtype.
    Differentiable (plain torch ops), on any device.
    """
    B, H, L, D = q.shape
    H_kv = k.shape[1]
    G = layout.group_size(H)
    scale = D**-0.5 if scale is None else scale
    out_dtype = v.dtype
    if q.dtype in HALF:
        q, k, v = q.float(), k.float(), v.float()
    qg = q.reshape(B, H_kv, G, L, D)  # the G query heads of each key head
    S = min(sink, L)
    parts = []
    for i0 in range(0, L, block_rows):
        i1 = min(L, i0 + block_rows)
        b0 = max(S, i0 - recent + 1) if recent > 0 else i1  # the block's recent band [b0, i1), after the sink
        idx = torch.cat([torch.arange(0, S, device=q.device), torch.arange(b0, max(b0, i1), device=q.device)])
        i = torch.arange(i0, i1, device=q.device)[:, None]  # (bq, 1)
        j = idx[None, :]  # (1, n)
        lo, hi = layout.key_band(i, L)  # (bq, 1) each
        in_set = (j < sink) | ((j >= i - recent + 1) & (j <= i))  # (bq, n)
        mask = in_set & (j >= lo) & (j <= hi)  # (bq, n)
        mask = mask[None] & key_valid[:, None, idx]  # (B, bq, n)
        ks, vs = k[:, :, idx], v[:, :, idx]  # (B, H_kv, n, D)
        s = torch.matmul(qg[:, :, :, i0:i1], ks[:, :, None].transpose(-1, -2)) * scale  # (B, H_kv, G, bq, n)
        m = mask[:, None, None]  # (B, 1, 1, bq, n)
        s = s.masked_fill(~m, torch.finfo(s.dtype).min)
        p = torch.softmax(s, dim=-1) * m  # a row with no streaming key: all 0, so o_L = 0
        parts.append(torch.matmul(p, vs[:, :, None]))  # (B, H_kv, G, bq, D)
    o = torch.cat(parts, dim=3) if parts else qg.new_zeros(B, H_kv, G, 0, D)
    return o.reshape(B, H, L, D).to(out_dtype)


def covered_rows(key_valid, layout: AttentionLayout, sink: int, recent: int):
    """(B, L) bool: rows every visible key of which is in the streaming set, so that o_L is o.

    Decided from positions with running counts of real keys (O(L), no map): the keys row i sees
    that are *not* streaming are the real ones of its band in [sink, i - recent] (before the
    window) and in [max(sink, i + 1), hi] (after the query, bidirectional layouts only).
    """
    B, L = key_valid.shape
    csum = torch.cat([key_valid.new_zeros(B, 1, dtype=torch.long), key_valid.long().cumsum(-1)], dim=-1)  # (B, L+1)
    i = torch.arange(L, device=key_valid.device)
    lo, hi = layout.key_band(i, L)  # (L,), (L,)

    def count(a, b):  # real keys in [a, b] per row, 0 when a > b
        a, b = a.clamp(0, L), (b + 1).clamp(0, L)
        return (csum[:, b] - csum[:, a]).clamp_min(0) * (b > a)

    before = count(lo.clamp_min(sink), torch.minimum(hi, i - recent))  # (B, L)
    after = count(torch.maximum(lo, (i + 1).clamp_min(sink)), hi)  # (B, L)
    return (before + after) == 0


def covered_rows_reference(key_valid, layout: AttentionLayout, sink: int, recent: int):
    """`covered_rows` from the explicit (B, 1, L, L) masks: the oracle's, for tests only."""
    vis = visible_mask(key_valid, layout)[:, 0]  # (B, L, L)
    return ~(vis & ~streaming_mask(key_valid.shape[-1], sink, recent, key_valid.device)).any(-1)


def streaming_mask(L: int, sink: int, recent: int, device=None):
    """(L, L) bool: key j is in query i's streaming set (before the layout's own mask)."""
    i = torch.arange(L, device=device)[:, None]
    j = torch.arange(L, device=device)[None, :]
    return (j < sink) | ((j >= i - recent + 1) & (j <= i))


def streaming_row_stats(o, o_L, covered):
    """(err_sq, out_sq), (B, H, L) each, in o's dtype: ||o_i - o_L,i||^2 (exactly 0 on covered rows)
    and ||o_i||^2, per head; o and o_L (B, H, L, D), covered (B, L) bool."""
    err = (o - o_L.to(o.dtype)).pow(2).sum(-1)  # (B, H, L)
    err = err.masked_fill(covered[:, None, :], 0.0)
    return err, o.pow(2).sum(-1)


def add_streaming_stats(stats, spec, q, k, v, o, key_valid, layout: AttentionLayout, scale):
    """Fill `stats.streaming_error_sq` and `stats.output_sq` when `spec.streaming` asks for them:
    every fast backend's step (eager has its own oracle). o: the head's un-gated output (B, H, L, D)
    (the statistics describe the head as trained, whatever its gates)."""
    if not spec.streaming:
        return stats
    sink, recent = spec.streaming
    o_L = streaming_output(q, k, v, key_valid, layout, scale, sink, recent)
    err, out = streaming_row_stats(o, o_L, covered_rows(key_valid, layout, sink, recent))
    pad = ~key_valid[:, None, :]  # (B, 1, L): padding rows hold 0 (the triton backend zeroes none after this)
    stats.streaming_error_sq, stats.output_sq = err.masked_fill(pad, 0.0), out.masked_fill(pad, 0.0)
    return stats


def apply_streaming(out, q, k, v, key_valid, gates: LayerGates | None, scale=None, layout: AttentionLayout = PLAIN):
    """The streaming heads of `gates` restricted to sink + recent: out (B, H, L, D), already gated
    (xi, uniform), becomes xi_h * o_L,h on every head with gates.streaming set. Applied after
    every backend in one place (the dispatcher, `gated_sdpa`), so it holds on each of them;
    differentiable. A head both uniform and streaming is streaming."""
    if gates is None or gates.streaming is None:
        return out
    sink, recent = check_span(gates.streaming_span)
    on = gates.streaming.to(out.device)
    on = on[None, :, None, None] if on.dim() == 1 else on[:, :, None, None]  # (1|B, H, 1, 1)
    o_L = streaming_output(q, k, v, key_valid, layout, scale, sink, recent).to(out.dtype)  # (B, H, L, D)
    if gates.xi is not None:
        xi = gates.xi.to(device=out.device, dtype=out.dtype)
        o_L = o_L * (xi[None, :, None, None] if xi.dim() == 1 else xi[:, :, None, None])
    return torch.where(on, o_L, out)


def streaming_output_reference(q, k, v, key_valid, layout: AttentionLayout, scale, sink: int, recent: int):
    """The oracle of `streaming_output`: softmax over the explicit (B, 1, L, L) mask visible & streaming."""
    D = q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    G = layout.group_size(q.shape[1])
    k_h, v_h = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B, H, L, D)
    s = torch.matmul(q, k_h.transpose(-1, -2)) * scale  # (B, H, L, L)
    m = visible_mask(key_valid, layout) & streaming_mask(q.shape[2], sink, recent, q.device)  # (B, 1, L, L)
    p = torch.softmax(s.masked_fill(~m, torch.finfo(s.dtype).min), dim=-1) * m
    return torch.matmul(p, v_h)  # (B, H, L, D)
