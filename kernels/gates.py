"""Head gates on an attention output, shared by every path but the Triton kernel's epilogue,
and the differentiable output (SDPA, then the gates) that autograd gets instead of a fast
path's."""
from __future__ import annotations

import torch

from .common import query_blocks
from .spec import PLAIN, AttentionLayout, LayerGates
from .streaming import apply_streaming, check_span


def uniform_output(v, key_valid, layout: AttentionLayout = PLAIN):
    """The output of uniform attention over the keys each row sees: the mean of V over them.

    v: (B, H_kv, L, D), key_valid: (B, L) bool -> (B, H_kv, 1, D) for the plain layout (every
    row sees the same keys), (B, H_kv, L, D) for any other: the mean over the row's band, from
    a running sum over positions (O(L D), no map). Padding keys are left out (uniform attention
    over padding would leak it); a row with no visible key gets 0.
    """
    w = key_valid.to(v.dtype)  # (B, L)
    if layout.is_plain or (not layout.causal and layout.window is None):
        total = torch.einsum("bl,bhld->bhd", w, v)  # (B, H_kv, D)
        return (total / w.sum(-1).clamp_min(1)[:, None, None])[:, :, None, :]
    B, Hkv, L, D = v.shape
    # running sums in float64: a difference of two sums over 32k positions keeps float32's precision
    wide = torch.float64
    wv = torch.cat([v.new_zeros(B, Hkv, 1, D, dtype=wide),
                    (v.to(wide) * w.to(wide)[:, None, :, None]).cumsum(-2)], dim=-2)  # (B, H_kv, L+1, D)
    wc = torch.cat([w.new_zeros(B, 1, dtype=wide), w.to(wide).cumsum(-1)], dim=-1)  # (B, L+1) real keys before
    lo, hi = layout.key_band(torch.arange(L, device=v.device), L)  # (L,), (L,)
    n = wc[:, hi + 1] - wc[:, lo]  # (B, L) real keys each row sees (padding rows too: they are zeroed later)
    total = wv[:, :, hi + 1] - wv[:, :, lo]  # (B, H_kv, L, D)
    return (total / n.clamp_min(1)[:, None, :, None]).to(v.dtype)


def apply_gates(out, v, key_valid, gates: LayerGates | None, layout: AttentionLayout = PLAIN):
    """out_h -> xi_h * (mean of V if uniform_h else out_h), differentiable in xi, out and v.

    out:       (B, H, L, D)
    v:         (B, H_kv, L, D); query head h reads v head h // (H / H_kv)
    key_valid: (B, L) bool
    gates:     `LayerGates`, or None (identity: out is returned as is, bit for bit)
    layout:    which keys each row sees: a uniform head is uniform over those
    """
    if gates is None or gates.is_identity:
        return out
    if gates.uniform is not None:
        uniform = gates.uniform.to(out.device)
        uniform = uniform[None, :, None, None] if uniform.dim() == 1 else uniform[:, :, None, None]  # (1|B, H, 1, 1)
        mean_v = uniform_output(v, key_valid, layout).to(out.dtype)  # (B, H_kv, 1 or L, D)
        mean_v = mean_v.repeat_interleave(out.shape[1] // v.shape[1], dim=1)  # (B, H, 1 or L, D)
        out = torch.where(uniform, mean_v, out)
    if gates.xi is not None:
        xi = gates.xi.to(device=out.device, dtype=out.dtype)
        out = out * (xi[None, :, None, None] if xi.dim() == 1 else xi[:, :, None, None])  # (1|B, H, 1, 1)
    return out


def check_layer_gates(gates, batch: int, heads: int):
    """Raise a clear error for gates the backends cannot take (shapes and types only: a NaN
    check would synchronise a GPU on every layer; `bertscope.models.gates.HeadGates` does it once)."""
    if gates is None:
        return
    if not isinstance(gates, LayerGates):
        raise TypeError("gates must be a LayerGates (LayerGates.from_codes(...) for Gate codes), "
                        f"not {type(gates).__name__}")
    if gates.xi is not None:
        if not gates.xi.is_floating_point():
            raise ValueError(f"gate xi must be a float tensor, not {gates.xi.dtype}")
        if tuple(gates.xi.shape) not in ((heads,), (batch, heads)):
            raise ValueError(f"gate xi of a layer must have shape ({heads},) or ({batch}, {heads}), "
                             f"not {tuple(gates.xi.shape)}")
    if gates.uniform is not None and (gates.uniform.dtype != torch.bool
                                      or tuple(gates.uniform.shape) not in ((heads,), (batch, heads))):
        raise ValueError(f"uniform gates of a layer must be a bool tensor of shape ({heads},) or ({batch}, {heads}), "
                         f"not {gates.uniform.dtype} {tuple(gates.uniform.shape)}")
    if gates.streaming is not None:
        if gates.streaming.dtype != torch.bool or tuple(gates.streaming.shape) not in ((heads,), (batch, heads)):
            raise ValueError(f"streaming gates of a layer must be a bool tensor of shape ({heads},) or "
                             f"({batch}, {heads}), not {gates.streaming.dtype} {tuple(gates.streaming.shape)}")
        check_span(gates.streaming_span)


def needs_grad(q, k, v, gates: LayerGates | None) -> bool:
    """Whether autograd will want the attention output: grad enabled and q, k, v or xi require it."""
    xi = None if gates is None else gates.xi
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, xi))


# the scores (or mask entries) of one query block of `gated_sdpa` under a banded layout
SDPA_BLOCK_ELEMENTS = 1 << 22


def gated_sdpa(q, k, v, key_valid, gates: LayerGates | None, scale=None, dropout=0.0,
               layout: AttentionLayout = PLAIN):
    """SDPA (with its dropout), then the head gates: q (B, H, L, D), k and v (B, H_kv, L, D) in,
    (B, L, H, D) out. Differentiable in everything; without gates, bit for bit transformers'
    "sdpa" output for the plain layout.

    Other layouts never build an L x L tensor: causal attention without padding is SDPA's own
    `is_causal`; grouped-query attention alone takes the plain (B, 1, 1, L) padding mask; any
    other (a window, or causal with padding) runs SDPA over query blocks (`query_blocks`),
    each against its key band with a (B, 1, block, band) mask. A row that sees no key (a
    padding query under causal left padding) attends to its whole band instead: finite, and
    zeroed or ignored downstream."""
    gqa = k.shape[1] != q.shape[1]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if layout.is_plain:
        mask = key_valid[:, None, None, :]  # (B, 1, 1, L)
        out = sdpa(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=gqa)  # (B, H, L, D)
    elif not layout.causal and layout.window is None:  # grouped-query attention only
        out = sdpa(q, k, v, attn_mask=key_valid[:, None, None, :], dropout_p=dropout, scale=scale, enable_gqa=gqa)
    elif layout.window is None and bool(key_valid.all()):
        out = sdpa(q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        B, H, L, _ = q.shape
        parts = []
        for i0, i1, k0, k1 in query_blocks(L, B * H, layout, SDPA_BLOCK_ELEMENTS):
            lo, hi = layout.key_band(torch.arange(i0, i1, device=q.device), L)  # (bq,), (bq,)
            keys = torch.arange(k0, k1, device=q.device)  # (bk,)
            band = (keys >= lo[:, None]) & (keys <= hi[:, None])  # (bq, bk)
            mask = band[None] & key_valid[:, None, k0:k1]  # (B, bq, bk)
            mask = mask | ~mask.any(-1, keepdim=True)  # a row that sees nothing attends to its band: finite
            parts.append(sdpa(q[:, :, i0:i1], k[:, :, k0:k1], v[:, :, k0:k1], attn_mask=mask[:, None],
                              dropout_p=dropout, scale=scale, enable_gqa=gqa))  # (B, H, bq, D)
        out = torch.cat(parts, dim=2)  # (B, H, L, D)
    out = apply_streaming(apply_gates(out, v, key_valid, gates, layout), q, k, v, key_valid, gates, scale, layout)
    return out.transpose(1, 2).contiguous()
