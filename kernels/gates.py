"""Head gates on an attention output, shared by every path but the Triton kernel's epilogue,
and the differentiable output (SDPA, then the gates) that autograd gets instead of a fast
path's."""
from __future__ import annotations

import torch

from .spec import LayerGates


def uniform_output(v, key_valid):
    """The output of uniform attention over the valid keys: the mean of V over them.

    v: (B, H, L, D), key_valid: (B, L) bool -> (B, H, 1, D). Padding keys are left out
    (uniform attention over padding would leak it); a sequence with no valid key gets 0.
    """
    w = key_valid.to(v.dtype)  # (B, L)
    total = torch.einsum("bl,bhld->bhd", w, v)  # (B, H, D)
    return (total / w.sum(-1).clamp_min(1)[:, None, None])[:, :, None, :]


def apply_gates(out, v, key_valid, gates: LayerGates | None):
    """out_h -> xi_h * (mean of V if uniform_h else out_h), differentiable in xi, out and v.

    out, v:    (B, H, L, D)
    key_valid: (B, L) bool
    gates:     `LayerGates`, or None (identity: out is returned as is, bit for bit)
    """
    if gates is None or gates.is_identity:
        return out
    if gates.uniform is not None:
        uniform = gates.uniform.to(out.device)
        uniform = uniform[None, :, None, None] if uniform.dim() == 1 else uniform[:, :, None, None]  # (1|B, H, 1, 1)
        out = torch.where(uniform, uniform_output(v, key_valid).to(out.dtype), out)
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


def gated_sdpa(q, k, v, key_valid, gates: LayerGates | None, scale=None, dropout=0.0):
    """SDPA (with its dropout), then the head gates: (B, H, L, D) in, (B, L, H, D) out.
    Differentiable in everything; without gates, bit for bit transformers' "sdpa" output."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=key_valid[:, None, None, :], dropout_p=dropout, scale=scale
    )  # (B, H, L, D)
    return apply_gates(out, v, key_valid, gates).transpose(1, 2).contiguous()
