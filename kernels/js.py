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
"""
from __future__ import annotations

import torch

from .common import masked_scores

JS_BACKENDS = ("eager", "chunked", "triton")


def pairwise_js(q, k, key_valid, scale, backend: str = "chunked", pair_bytes: int = 64 << 20):
    """(N, N) float64: JS summed over the valid query rows of the batch, for every pair of heads.

    q, k:      (B, N, L, D) queries and keys of N heads (e.g. all layers' heads stacked)
    key_valid: (B, L) bool; padding queries are not counted and padding keys get no mass
    """
    if backend == "eager":
        return pairwise_js_eager(q, k, key_valid, scale)
    if backend == "chunked":
        return pairwise_js_chunked(q, k, key_valid, scale, pair_bytes)
    if backend == "triton":
        from .triton_js import pairwise_js_triton  # triton is optional (and TRITON_INTERPRET is read on import)

        return pairwise_js_triton(q, k, key_valid, scale)
    raise ValueError(f"unknown JS backend {backend!r}; choose one of {JS_BACKENDS}")


def pairwise_js_eager(q, k, key_valid, scale):
    """The reference: every map materialised, JS by its definition, one pair at a time."""
    p = torch.softmax(masked_scores(q.double(), k.double(), key_valid, scale), dim=-1)  # (B, N, L, L)
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
    out = torch.zeros(N, N, dtype=torch.float64)
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
    return out
