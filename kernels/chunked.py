"""The CPU fast path: attention plus row statistics, a few heads' L x L at a time.

The (batch, head) maps are flattened to N = B*H and processed in chunks of n maps whose
scores fit in `chunk_bytes` (cache-sized), so memory stays O(n L^2) instead of
O(B H L^2) and the maps are still hot in cache while the statistics read them.

Each statistic is arranged to cost (almost) nothing beyond the attention itself:
- class mass rides along in the P @ V matmul: V is extended with a one-hot of each key's
  class, so (P @ [V | onehot])[..., D:] is the mass on every class;
- the argmax is found per block of 16 keys with a vectorised `amax`, then inside the
  winning block (a full-width index-tracking `argmax` is several times slower);
- entropy uses H = lse - sum_j p_ij s_ij, with lse = s_max - ln p_max read off the
  argmax (p_max >= 1/L, so no log of zero) and one dot product per row;
- offset masses are diagonals of P, i.e. strided views.
"""
from __future__ import annotations

import torch

from .eager import zero_padding_rows
from .gates import apply_gates
from .spec import RowStats, StatsSpec

DEFAULT_CHUNK_BYTES = 1 << 20
ARGMAX_BLOCK = 16


def attention_stats_chunked(
    q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None, chunk_bytes=DEFAULT_CHUNK_BYTES
):
    """Same contract as `attention_stats_eager`; never holds more than one chunk of maps."""
    B, H, L, D = q.shape
    N, C, O = B * H, spec.n_key_classes, len(spec.offsets)
    scale = D**-0.5 if scale is None else scale
    need_argmax = spec.argmax or spec.entropy  # the entropy reads p_max off the argmax

    # -- per-map operands, flattened to N = B*H maps
    qs = (q * scale).reshape(N, L, D)  # (N, L, D)
    kt = k.reshape(N, L, D).transpose(1, 2)  # (N, D, L)
    one_hot = torch.nn.functional.one_hot(key_class, C).to(v.dtype)  # (B, L, C)
    rhs = torch.cat([v, one_hot[:, None].expand(B, H, L, C)], dim=-1).reshape(N, L, D + C)  # (N, L, D+C)
    padded = not bool(key_valid.all())
    if padded:
        bias = torch.zeros(B, L, dtype=q.dtype, device=q.device)
        bias.masked_fill_(~key_valid, torch.finfo(q.dtype).min)
        bias = bias[:, None, None, :].expand(B, H, 1, L).reshape(N, 1, L)  # (N, 1, L)

    out_ext = torch.empty(N, L, D + C, dtype=q.dtype, device=q.device)  # (N, L, D+C)
    offset_mass = torch.zeros(N, L, O, dtype=q.dtype, device=q.device) if O else None
    entropy = torch.empty(N, L, dtype=q.dtype, device=q.device) if spec.entropy else None
    argmax = torch.empty(N, L, dtype=torch.long, device=q.device) if need_argmax else None

    n = max(1, chunk_bytes // (L * L * q.element_size()))
    for n0 in range(0, N, n):
        c = slice(n0, min(N, n0 + n))
        # -- scores and probabilities of this chunk
        if padded:
            s = torch.baddbmm(bias[c], qs[c], kt[c])  # (n, L, L)
        else:
            s = torch.bmm(qs[c], kt[c])  # (n, L, L)
        p = torch.softmax(s, dim=-1)  # (n, L, L)
        # -- output and class mass in one matmul
        torch.bmm(p, rhs[c], out=out_ext[c])
        # -- offsets: diagonals of p
        for t, o in enumerate(spec.offsets):
            if abs(o) >= L:
                continue  # no row has a key that far away
            rows = slice(0, L - o) if o >= 0 else slice(-o, L)
            offset_mass[c, rows, t] = torch.diagonal(p, o, 1, 2)
        if need_argmax:
            am, p_max = row_argmax(p)  # (n, L), (n, L)
            argmax[c] = am
            if spec.entropy:
                # -- H = lse - sum_j p_j s_j, with lse = s_max - ln p_max
                s_max = s.gather(-1, am[..., None]).squeeze(-1)  # (n, L)
                entropy[c] = s_max - torch.log(p_max) - torch.linalg.vecdot(p, s)

    out = out_ext[..., :D].reshape(B, H, L, D)
    out = apply_gates(out, v, key_valid, gates)
    stats = RowStats(
        entropy=None if entropy is None else entropy.view(B, H, L),
        offset_mass=None if offset_mass is None else offset_mass.view(B, H, L, O),
        class_mass=out_ext[..., D:].reshape(B, H, L, C),
        argmax=argmax.view(B, H, L) if spec.argmax else None,
    )
    return out.transpose(1, 2), zero_padding_rows(stats, key_valid)


def row_argmax(p, block=ARGMAX_BLOCK):
    """Index (lowest on ties) and value of each row's maximum, for p of shape (n, L, L).

    Two levels: the maximum of every block of `block` keys (a vectorised reduction), the
    first block holding the row maximum, then the first maximum inside that block.
    """
    L = p.shape[-1]
    n_full = L // block
    maxima = []
    if n_full:
        maxima.append(p[..., : n_full * block].unflatten(-1, (n_full, block)).amax(-1))  # (n, L, n_full)
    if n_full * block < L:
        maxima.append(p[..., n_full * block :].amax(-1, keepdim=True))  # (n, L, 1)
    block_max = torch.cat(maxima, dim=-1) if len(maxima) > 1 else maxima[0]  # (n, L, nb)
    best_block = block_max.argmax(-1)  # (n, L)
    start = best_block * block
    # the last block may be short: clamped indices repeat column L-1 *after* its real
    # occurrence, so the first-maximum rule still finds the true index
    idx = (start[..., None] + torch.arange(block, device=p.device)).clamp_max(L - 1)  # (n, L, block)
    within = p.gather(-1, idx).argmax(-1)  # (n, L)
    return start + within, block_max.gather(-1, best_block[..., None]).squeeze(-1)
