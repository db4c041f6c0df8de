"""The CPU fast path: attention plus row statistics, a few heads' L x L at a time.

The (batch, head) maps are flattened to N = B*H and processed in chunks of n maps whose
scores fit in `chunk_bytes` (cache-sized), so memory stays O(n L^2) instead of
O(B H L^2) and the maps are still hot in cache while the statistics read them.

Each statistic is arranged to cost (almost) nothing beyond the attention itself:
- class mass rides along in the P @ V matmul: V is extended with a one-hot of each key's
  class, so (P @ [V | onehot])[..., D:] is the mass on every class;
- entropy uses H = lse - sum_j p_ij s_ij with lse = max_j s_ij - ln max_j p_ij (the largest
  probability is exactly 1/sum_j exp(s_ij - max s), and it is >= 1/L, so no log of zero):
  two vectorised max reductions and one row dot product, no log over the L x L map;
- offset masses are gathered in one call from fixed positions of the flattened map;
- the argmax (only when asked for: an index-tracking reduction is several times slower
  than a max) is torch's, which returns the first maximum.
"""
from __future__ import annotations

import torch

from .eager import zero_padding_rows
from .gates import apply_gates
from .spec import RowStats, StatsSpec

DEFAULT_CHUNK_BYTES = 1 << 20


def attention_stats_chunked(
    q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None, chunk_bytes=DEFAULT_CHUNK_BYTES
):
    """Same contract as `attention_stats_eager`; never holds more than one chunk of maps."""
    B, H, L, D = q.shape
    N, C, O = B * H, spec.n_key_classes, len(spec.offsets)
    scale = D**-0.5 if scale is None else scale
    dev = q.device

    # -- per-map operands, flattened to N = B*H maps (one contiguous copy each; the scale
    #    rides on k, so scores come out of the matmul already scaled)
    qf = q.reshape(N, L, D)  # (N, L, D)
    ks = torch.empty(B, H, L, D, dtype=k.dtype, device=dev)
    kt = torch.mul(k, scale, out=ks).view(N, L, D).transpose(1, 2)  # (N, D, L)
    rhs = torch.empty(B, H, L, D + C, dtype=v.dtype, device=dev)  # (B, H, L, D+C): [V | onehot(class)]
    rhs[..., :D] = v
    rhs[..., D:] = torch.nn.functional.one_hot(key_class, C).to(v.dtype)[:, None]  # (B, 1, L, C)
    rhs = rhs.view(N, L, D + C)
    padded = not bool(key_valid.all())
    if padded:
        bias = torch.zeros(B, L, dtype=q.dtype, device=dev)
        bias.masked_fill_(~key_valid, torch.finfo(q.dtype).min)
        bias = bias[:, None, None, :].expand(B, H, 1, L).reshape(N, 1, L)  # (N, 1, L)
    if O:
        flat_idx, inside = offset_positions(L, spec.offsets, dev)  # (L*O,), (L, O)

    out_ext = torch.empty(N, L, D + C, dtype=q.dtype, device=dev)  # (N, L, D+C)
    offset_mass = torch.empty(N, L * O, dtype=q.dtype, device=dev)  # (N, L*O)
    entropy = torch.empty(N, L, dtype=q.dtype, device=dev) if spec.entropy else None
    argmax = torch.empty(N, L, dtype=torch.long, device=dev) if spec.argmax else None

    n = max(1, chunk_bytes // (L * L * q.element_size()))
    for n0 in range(0, N, n):
        c = slice(n0, min(N, n0 + n))
        # -- scores and probabilities of this chunk
        if padded:
            s = torch.baddbmm(bias[c], qf[c], kt[c])  # (n, L, L)
        else:
            s = torch.bmm(qf[c], kt[c])  # (n, L, L)
        p = torch.softmax(s, dim=-1)  # (n, L, L)
        # -- output and class mass in one matmul
        torch.bmm(p, rhs[c], out=out_ext[c])
        if O:
            offset_mass[c] = p.flatten(1).gather(1, flat_idx.expand(p.shape[0], -1))
        if spec.entropy:
            # -- H = lse - sum_j p_j s_j
            lse = s.amax(-1) - torch.log(p.amax(-1))  # (n, L)
            entropy[c] = lse - torch.linalg.vecdot(p, s)
        if spec.argmax:
            argmax[c] = p.argmax(-1)

    out = apply_gates(out_ext.view(B, H, L, D + C)[..., :D], v, key_valid, gates)  # (B, H, L, D) view
    stats = RowStats(
        entropy=None if entropy is None else entropy.view(B, H, L),
        offset_mass=(offset_mass.view(N, L, O) * inside).view(B, H, L, O) if O else None,
        class_mass=out_ext[..., D:].reshape(B, H, L, C),
        argmax=None if argmax is None else argmax.view(B, H, L),
    )
    return out.transpose(1, 2), zero_padding_rows(stats, key_valid)


def offset_positions(L, offsets, device):
    """Flat indices i*L + (i+o) of p[i, i+o] in an L x L map, and whether i+o is inside it.

    Positions outside are clamped to a valid index (and later multiplied by 0), so one
    gather reads every offset of every row.
    """
    i = torch.arange(L, device=device)[:, None]  # (L, 1)
    j = i + torch.tensor(offsets, device=device)[None, :]  # (L, O)
    inside = (j >= 0) & (j < L)
    return (i * L + j.clamp(0, L - 1)).flatten(), inside
