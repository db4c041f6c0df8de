"""Softmax attention whose backward also measures |dL/dP| per key class, without keeping P.

Clark et al. (2019, section 3, Fig. 5) ask how much the loss depends on the attention to
each kind of token: the gradient of the loss with respect to each attention weight P_ij,
averaged in magnitude over the pairs whose key j is [SEP], [CLS], punctuation or other.
With O = P V (per head, before the output projection),

    dL/dP_ij = <dO_i, V_j>

so a row's gradients come from the output's gradient and V alone. `attention_grad` keeps
q, k, v, the output and the row log-sum-exp from the forward (not P) and, in backward,
recomputes P a block of query rows at a time, flash-attention style:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale dS K,  dK = scale dS^T Q

which is exact softmax attention's gradient; the same dP block is summed, |dP_ij| per head and
key class over valid query rows i and valid keys j, and handed to a sink with the pair
counts and the attention mass P on each class (Clark's figure shows both).

The oracle is `kernels.eager.attention_grad_eager`: autograd's dL/dP on the materialised map.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from .common import masked_scores

TILE_ELEMENTS = 1 << 22  # (B, H, rows, L) elements per recomputed block: 16 MB in float32


@dataclass
class GradSums:
    """One attention call's sums over its valid (query i, key j) pairs, per head and key class.

    grad:  (H, C) float64, sum of |dL/dP_ij| over pairs whose key j is of class c
    mass:  (H, C) float64, sum of P_ij over the same pairs (divided by `rows`: the mean
           attention mass a row puts on the class)
    pairs: (C,) float64, number of such pairs (the same for every head)
    rows:  number of valid query rows
    """

    grad: torch.Tensor
    mass: torch.Tensor
    pairs: torch.Tensor
    rows: int


GradSink = Callable[[GradSums], None]


def attention_grad(q, k, v, key_valid, key_class, n_classes: int, sink: GradSink, scale=None,
                   tile_elements: int = TILE_ELEMENTS):
    """Softmax attention P V, differentiable in q, k, v, whose backward calls `sink(GradSums)`.

    q, k, v:   (B, H, L, D)
    key_valid: (B, L) bool, False for padding (padding keys get no attention; padding rows
               are left out of the sums)
    key_class: (B, L) int64 in [0, n_classes)
    Returns the output (B, H, L, D) (no gates: scale it afterwards, autograd does the rest).
    """
    B, H, L, D = q.shape
    scale = D**-0.5 if scale is None else scale
    rows = max(1, min(L, tile_elements // max(1, B * H * L)))
    return _AttentionGrad.apply(q, k, v, key_valid, key_class, n_classes, sink, scale, rows)


def _blocks(L: int, rows: int):
    return ((r, min(L, r + rows)) for r in range(0, L, rows))


def _probs(q_rows, k, key_valid, scale, lse_rows):
    """P of a block of query rows from the saved log-sum-exp: (B, H, r, L)."""
    return torch.exp(masked_scores(q_rows, k, key_valid, scale) - lse_rows[..., None])


class _AttentionGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_valid, key_class, n_classes, sink, scale, rows):
        L = q.shape[-2]
        out = torch.empty_like(q)  # (B, H, L, D)
        lse = q.new_empty(q.shape[:-1])  # (B, H, L)
        for r0, r1 in _blocks(L, rows):
            s = masked_scores(q[:, :, r0:r1], k, key_valid, scale)  # (B, H, r, L)
            lse[:, :, r0:r1] = torch.logsumexp(s, dim=-1)
            out[:, :, r0:r1] = torch.matmul(torch.exp(s - lse[:, :, r0:r1, None]), v)
        ctx.save_for_backward(q, k, v, out, lse, key_valid, key_class)
        ctx.meta = (n_classes, sink, scale, rows)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, key_valid, key_class = ctx.saved_tensors
        n_classes, sink, scale, rows = ctx.meta
        B, H, L, D = q.shape
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (dout * out).sum(-1)  # (B, H, L): rowsum(dO * O) = sum_j P_ij dP_ij
        acc = torch.promote_types(q.dtype, torch.float32)  # the sums' dtype: at least float32
        valid = key_valid.to(acc)  # (B, L)
        key_onehot = torch.nn.functional.one_hot(key_class, n_classes).to(acc) * valid[..., None]  # (B, L, C)
        grad = torch.zeros(H, n_classes, dtype=torch.float64, device=q.device)
        mass = torch.zeros_like(grad)
        for r0, r1 in _blocks(L, rows):
            q_r, do_r = q[:, :, r0:r1], dout[:, :, r0:r1]  # (B, H, r, D)
            p = _probs(q_r, k, key_valid, scale, lse[:, :, r0:r1])  # (B, H, r, L)
            dp = torch.matmul(do_r, v.transpose(-1, -2))  # (B, H, r, L): dL/dP_ij = <dO_i, V_j>
            dv += torch.matmul(p.transpose(-1, -2), do_r)
            ds = p * (dp - delta[:, :, r0:r1, None])  # (B, H, r, L): through the softmax
            dq[:, :, r0:r1] = torch.matmul(ds, k) * scale
            dk += torch.matmul(ds.transpose(-1, -2), q_r) * scale
            row_w = valid[:, None, r0:r1, None]  # (B, 1, r, 1): padding rows count for nothing
            grad += torch.einsum("bhij,bjc->bhc", (dp.abs() * row_w).to(acc), key_onehot).double().sum(0)
            mass += torch.einsum("bhij,bjc->bhc", (p * row_w).to(acc), key_onehot).double().sum(0)
        pairs = (valid.sum(1, keepdim=True) * key_onehot.sum(1)).double().sum(0)  # (C,)
        sink(GradSums(grad=grad, mass=mass, pairs=pairs, rows=int(key_valid.sum())))
        return dq, dk, dv, None, None, None, None, None, None
