"""Jensen-Shannon divergence between the attention of every pair of heads.

Clark et al. (2019, section 6) cluster heads by the distance
    D(H_a, H_b) = sum over tokens of JS(H_a(token), H_b(token)),
the JS divergence of the two heads' attention distributions from the same query token,
summed over a corpus. Heads of different layers are compared, so no single attention call
sees both maps: the analysis keeps each layer's queries and keys (`StatsSpec.keep_qk`) for
one batch and calls `pairwise_js` once the forward pass is done, which recomputes the maps
from them instead of keeping all L x L maps of all heads.

JS is in nats and computed as JS(p, q) = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2,
which needs one entropy per pair instead of two KL terms.

Decoders: each layer has its own `AttentionLayout` (Gemma-3 alternates sliding-window and
global layers) and, under grouped-query attention, fewer key heads than query heads. `layouts`
says so (`stack_layers` builds it from the layers' `RowStats`): each head's distribution is over
the keys its own layer lets it see, from its own key head; the pairs are then compared row by
row as for encoders, over query blocks (`pairwise_js_banded`), never an L x L map per head.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .common import masked_scores
from .spec import AttentionLayout, visible_mask

JS_BACKENDS = ("eager", "chunked", "triton")
# layer by layer: (the layer's layout, its number of query heads); see `pairwise_js`
Layouts = Sequence[tuple[AttentionLayout, int]]


def stack_layers(layers) -> tuple[torch.Tensor, torch.Tensor, Layouts | None]:
    """(q, k, layouts) for `pairwise_js` from the `RowStats` of each layer (spec.keep_qk): the
    layers' queries with their scale folded in, (B, N, L, D), their keys, (B, N_kv, L, D), and
    their layouts (None when every layer is an encoder's)."""
    q = torch.cat([s.queries * s.scale for s in layers], dim=1)  # (B, layers*H, L, D)
    k = torch.cat([s.keys for s in layers], dim=1)  # (B, layers*H_kv, L, D)
    if all(s.layout.is_plain for s in layers):
        return q, k, None
    return q, k, [(s.layout, s.queries.shape[1]) for s in layers]


def head_layouts(layouts: Layouts | None, n_heads: int, n_key_heads: int) -> tuple[list, list[int]]:
    """Per query head: its layout and the index of the key head it reads."""
    if layouts is None:
        if n_key_heads != n_heads:
            raise ValueError(f"{n_key_heads} key heads for {n_heads} query heads: pass the layers' layouts")
        return [AttentionLayout()] * n_heads, list(range(n_heads))
    per_head, key_head, first_key = [], [], 0
    for layout, H in layouts:
        G = layout.group_size(H)
        per_head += [layout] * H
        key_head += [first_key + h // G for h in range(H)]
        first_key += H // G
    if len(per_head) != n_heads or first_key != n_key_heads:
        raise ValueError(f"the layouts describe {len(per_head)} query and {first_key} key heads; "
                         f"q has {n_heads}, k {n_key_heads}")
    return per_head, key_head


def pairwise_js(q, k, key_valid, scale, backend: str = "chunked", pair_bytes: int = 64 << 20,
                layouts: Layouts | None = None):
    """(N, N) float64: JS summed over the valid query rows of the batch, for every pair of heads.

    q:         (B, N, L, D) queries of N heads (e.g. all layers' heads stacked)
    k:         (B, N, L, D) their keys, or (B, N_kv, L, D) under grouped-query attention
    key_valid: (B, L) bool; padding queries are not counted and padding keys get no mass
    layouts:   None (every head bidirectional, one key head each), or layer by layer
               (layout, query heads) in the order of q's heads (`stack_layers`): each head
               attends to the keys its layer's layout lets it see, from key head h // G of its layer
    """
    if layouts is not None and all(layout.is_plain for layout, _ in layouts):
        layouts = None
    head_layouts(layouts, q.shape[1], k.shape[1])  # a ValueError when q, k and layouts disagree
    if backend == "eager":
        return pairwise_js_eager(q, k, key_valid, scale, layouts)
    if backend == "chunked":
        if layouts is not None or not right_padded(key_valid):  # pairwise_js_chunked reads the first n keys
            return pairwise_js_banded(q, k, key_valid, scale, layouts or [(AttentionLayout(), q.shape[1])],
                                      pair_bytes)
        return pairwise_js_chunked(q, k, key_valid, scale, pair_bytes)
    if backend == "triton":
        if layouts is not None:
            raise ValueError("the triton JS backend computes bidirectional heads only; use --js-backend chunked")
        from .triton_js import pairwise_js_triton  # triton is optional (and TRITON_INTERPRET is read on import)

        return pairwise_js_triton(q, k, key_valid, scale)
    raise ValueError(f"unknown JS backend {backend!r}; choose one of {JS_BACKENDS}")


def right_padded(key_valid) -> bool:
    """Whether every sequence's real tokens come first (an encoder's batch), not after left padding."""
    n = key_valid.sum(-1, keepdim=True)  # (B, 1)
    return bool((key_valid == (torch.arange(key_valid.shape[1], device=key_valid.device) < n)).all())


def pairwise_js_eager(q, k, key_valid, scale, layouts: Layouts | None = None):
    """The reference: every map materialised, JS by its definition, one pair at a time."""
    if layouts is None:
        p = torch.softmax(masked_scores(q.double(), k.double(), key_valid, scale), dim=-1)  # (B, N, L, L)
    else:
        per_head, key_head = head_layouts(layouts, q.shape[1], k.shape[1])
        s = torch.matmul(q.double(), k.double()[:, key_head].transpose(-1, -2)) * scale  # (B, N, L, L)
        seen = torch.cat([visible_mask(key_valid, layout) for layout in per_head], dim=1)  # (B, N, L, L)
        p = torch.softmax(s.masked_fill(~seen, torch.finfo(s.dtype).min), dim=-1)
    rows = key_valid.double()  # (B, L)
    N = p.shape[1]
    out = torch.zeros(N, N, dtype=torch.float64)
    for a in range(N):
        for b in range(a + 1, N):
            m = (p[:, a] + p[:, b]) / 2  # (B, L, L)
            kl_a = torch.special.xlogy(p[:, a], p[:, a] / m.clamp_min(1e-300)).sum(-1)  # (B, L)
            kl_b = torch.special.xlogy(p[:, b], p[:, b] / m.clamp_min(1e-300)).sum(-1)
            out[a, b] = out[b, a] = ((kl_a + kl_b) / 2 * rows).sum()
    return out


def pairwise_js_chunked(q, k, key_valid, scale, pair_bytes: int = 64 << 20):
    """The CPU path: per sequence, all N maps once, then blocks of pairs against head a."""
    B, N, L, _ = q.shape
    out = torch.zeros(N, N, dtype=torch.float64, device=q.device)  # summed where q is
    for b in range(B):
        n = int(key_valid[b].sum())
        if n == 0:
            continue
        kv = key_valid[b, :n]  # right padding: the first n keys are the valid ones
        s = torch.matmul(q[b, :, :n], k[b, :, :n].transpose(-1, -2)) * scale  # (N, n, n)
        s = s.masked_fill(~kv, torch.finfo(s.dtype).min)
        p = torch.softmax(s, dim=-1)  # (N, n, n)
        h = -torch.special.xlogy(p, p).sum(-1)  # (N, n) row entropies
        block = max(1, pair_bytes // (n * n * p.element_size()))
        for a in range(N - 1):
            for b0 in range(a + 1, N, block):
                b1 = min(N, b0 + block)
                m = (p[a] + p[b0:b1]) * 0.5  # (nb, n, n)
                # m ln m, with 0 ln 0 = 0 through the clamp: twice as fast as xlogy here
                h_m = -(m * torch.log(m.clamp_min(1e-30))).sum(-1)  # (nb, n)
                js = (h_m - (h[a] + h[b0:b1]) * 0.5).double().sum(-1)  # (nb,)
                out[a, b0:b1] += js
                out[b0:b1, a] += js
    return out.cpu()  # (N, N) on the CPU, as every JS backend returns it


def pairwise_js_banded(q, k, key_valid, scale, layouts: Layouts, pair_bytes: int = 64 << 20):
    """The CPU path for decoders: per sequence, its real tokens only (left or right padding), in
    blocks of query rows; each head's rows over the keys its layout lets it see (absolute
    positions, as the attention counted them), from its own key head. Memory: one block of
    rows of all N heads (N x block x n) and one of pairs, within `pair_bytes`; no n x n map."""
    B, N, L, _ = q.shape
    per_head, key_head = head_layouts(layouts, N, k.shape[1])
    groups = {}  # layout -> its heads: one mask per distinct layout and block
    for h, layout in enumerate(per_head):
        groups.setdefault(layout, []).append(h)
    out = torch.zeros(N, N, dtype=torch.float64, device=q.device)  # summed where q is
    for b in range(B):
        pos = key_valid[b].nonzero().squeeze(1)  # (n,) absolute positions of the real tokens
        n = pos.numel()
        if n == 0:
            continue
        qb = q[b][:, pos]  # (N, n, D)
        kb = k[b][:, pos][key_head]  # (N, n, D): each query head's key head
        rows = max(1, pair_bytes // (N * n * q.element_size()))
        for r0 in range(0, n, rows):
            r = slice(r0, min(n, r0 + rows))
            s = torch.matmul(qb[:, r], kb.transpose(-1, -2)) * scale  # (N, bq, n)
            for layout, heads in groups.items():
                if layout.causal or layout.window is not None:
                    lo, hi = layout.key_band(pos[r], L)  # (bq,) each row's band, absolute
                    seen = (pos >= lo[:, None]) & (pos <= hi[:, None])  # (bq, n)
                    s[heads] = s[heads].masked_fill(~seen, torch.finfo(s.dtype).min)
            p = torch.softmax(s, dim=-1)  # (N, bq, n)
            h = -torch.special.xlogy(p, p).sum(-1)  # (N, bq) row entropies
            block = max(1, pair_bytes // (p.shape[1] * n * p.element_size()))
            for a in range(N - 1):
                for b0 in range(a + 1, N, block):
                    b1 = min(N, b0 + block)
                    m = (p[a] + p[b0:b1]) * 0.5  # (nb, bq, n)
                    h_m = -(m * torch.log(m.clamp_min(1e-30))).sum(-1)  # (nb, bq)
                    js = (h_m - (h[a] + h[b0:b1]) * 0.5).double().sum(-1)  # (nb,)
                    out[a, b0:b1] += js
                    out[b0:b1, a] += js
    return out.cpu()  # (N, N) on the CPU, as every JS backend returns it
