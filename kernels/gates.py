"""Head gates on an attention output, shared by every path but the Triton kernel's epilogue,
and the differentiable output (SDPA, then the gates) that autograd gets instead of a fast
path's."""
from __future__ import annotations

import torch

from .spec import PLAIN, AttentionLayout, LayerGates, visible_counts, visible_mask


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
    wv = torch.cat([v.new_zeros(B, Hkv, 1, D), (v * w[:, None, :, None]).cumsum(-2)], dim=-2)  # (B, H_kv, L+1, D)
    n, _ = visible_counts(key_valid, layout)  # (B, L) real keys each row sees
    lo, hi = layout.key_band(torch.arange(L, device=v.device), L)  # (L,), (L,)
    total = wv[:, :, hi + 1] - wv[:, :, lo]  # (B, H_kv, L, D)
    return total / n.clamp_min(1).to(v.dtype)[:, None, :, None]


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


def needs_grad(q, k, v, gates: LayerGates | None) -> bool:
    """Whether autograd will want the attention output: grad enabled and q, k, v or xi require it."""
    xi = None if gates is None else gates.xi
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, xi))


def gated_sdpa(q, k, v, key_valid, gates: LayerGates | None, scale=None, dropout=0.0,
               layout: AttentionLayout = PLAIN):
    """SDPA (with its dropout), then the head gates: q (B, H, L, D), k and v (B, H_kv, L, D) in,
    (B, L, H, D) out. Differentiable in everything; without gates, bit for bit transformers'
    "sdpa" output for the plain layout.

    Any other layout is handed to SDPA as a boolean (B, 1, L, L) visibility mask for now: an
    L x L tensor, which the plug-in's no-grad paths never build (HOOK: a banded path)."""
    if layout.is_plain:
        mask = key_valid[:, None, None, :]  # (B, 1, 1, L)
    else:
        mask = visible_mask(key_valid, layout)  # (B, 1, L, L)
        mask = mask | ~mask.any(-1, keepdim=True)  # a row that sees nothing (padding) attends to all: finite
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )  # (B, H, L, D)
    return apply_gates(out, v, key_valid, gates, layout).transpose(1, 2).contiguous()
