"""Per-key value norms for the norm-based twins (Kobayashi, Kuribayashi, Yokoi, Inui, EMNLP 2020,
"Attention is Not Only a Weight: Analyzing Transformers with Vector Norms"; docs/norms.md).

A head's output at query i, projected to the residual stream, is sum_j p_ij f_h(x_j) with
f_h(x_j) = (x_j W_V + b_V)_h W_O^h: the key's value vector v_j (bias included) times the head's D
columns of the output projection (the output bias is left out: it is not a key's). Kobayashi et al.
read ||p_ij f_h(x_j)|| = p_ij n_j, n_j = ||f_h(x_j)||, beside the weight p_ij. n_j needs only the
value states the attention function receives and the output projection's weight.

The norm is computed through the head's Gram matrix M_h = W_h^T W_h (D x D; W_h the head's
(hidden, D) columns), in the form of its factor R_h (D x D, R_h^T R_h = M_h), so that
n_j = ||R_h v_j||: a D x D product per key instead of the D x hidden one of f_h(x_j) itself, and
no square root of a difference (v M v^T computed as is loses digits where n_j is small against
||v||). R_h comes from an eigendecomposition of M_h in float64 (exact for any rank), once per
weight (`head_factors`; the engine caches it per module and weight version). Measured on the
development CPU: bench/results_norms.md.

Grouped-query attention: v_j is the key/value head's vector, W_O^h the query head's own columns,
so n_j is per query head: (B, H, L) whatever H_kv is.
"""
from __future__ import annotations

import torch


def output_weight(projection) -> torch.Tensor:
    """The output projection's weight as (hidden, H * D): out = x W^T. An `nn.Linear` holds it so;
    GPT-2's `Conv1D` holds (H * D, hidden) (out = x W), transposed here (a view)."""
    weight = projection.weight
    if type(projection).__name__ == "Conv1D":  # transformers.pytorch_utils.Conv1D: nx in, nf out
        return weight.t()
    return weight


def head_columns(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(H, hidden, D): each head's D input columns of a (hidden, H * D) output projection."""
    hidden, width = weight.shape
    if width % n_heads:
        raise ValueError(f"the output projection takes {width} inputs, not a multiple of {n_heads} heads")
    return weight.reshape(hidden, n_heads, width // n_heads).permute(1, 0, 2)


def head_grams(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(H, D, D) float64: M_h = W_h^T W_h, the Gram matrix of each head's output columns."""
    w = head_columns(weight.detach().double(), n_heads)  # (H, hidden, D)
    return w.transpose(1, 2) @ w


def head_factors(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(H, D, D) float32: R_h with R_h^T R_h = W_h^T W_h, so ||W_h v|| = ||R_h v|| for every v.
    From the eigendecomposition M_h = U S U^T (R_h = S^(1/2) U^T), in float64: any rank."""
    s, u = torch.linalg.eigh(head_grams(weight, n_heads))  # (H, D), (H, D, D)
    return (s.clamp_min(0).sqrt()[:, :, None] * u.transpose(1, 2)).float()


def value_norms(v: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """(B, H, L) float32: n_j = ||f_h(x_j)|| = ||R_h v_j|| for each query head h and key j.

    v: (B, H_kv, L, D) the value states the attention function receives (bias included);
    factors: (H, D, D) from `head_factors`; query head h reads key/value head h // (H / H_kv)."""
    B, H_kv, L, D = v.shape
    H = factors.shape[0]
    if H % H_kv:
        raise ValueError(f"{H} query heads cannot share {H_kv} key/value heads evenly")
    G = H // H_kv
    # one batched product per key/value head against its G query heads' R_h^T side by side:
    # r[k, d, g D + e] = R_{kG+g}[e, d]
    r = factors.to(v.device).view(H_kv, G, D, D).permute(0, 3, 1, 2).reshape(H_kv, D, G * D)
    x = v.float().permute(1, 0, 2, 3).reshape(H_kv, B * L, D)  # (H_kv, B L, D)
    y = torch.bmm(x, r).view(H_kv, B, L, G, D)  # R_h v_j
    return torch.linalg.vector_norm(y, dim=-1).permute(1, 0, 3, 2).reshape(B, H, L)  # (B, H_kv, G, L)


def value_norms_gram(v: torch.Tensor, grams: torch.Tensor) -> torch.Tensor:
    """(B, H, L): sqrt(v_j M_h v_j^T), the Gram form as written (for the benchmark and the tests)."""
    B, H_kv, L, D = v.shape
    H = grams.shape[0]
    m = grams.to(v.device, torch.float32).view(H_kv, H // H_kv, D, D)
    vf = v.float()
    y = torch.einsum("bkld,kgde->bkgle", vf, m)  # (B, H_kv, G, L, D): v M
    return (y * vf[:, :, None]).sum(-1).clamp_min(0).sqrt().reshape(B, H, L)


def value_norms_direct(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B, H, L): ||v_j W_h^T|| by the product itself, f_h(x_j) of `hidden` entries per key and head
    (the definition; the benchmark's and the tests' reference). weight: (hidden, H * D)."""
    B, H_kv, L, D = v.shape
    H = weight.shape[1] // D
    w = head_columns(weight.detach().float(), H).view(H_kv, H // H_kv, -1, D)  # (H_kv, G, hidden, D)
    f = torch.einsum("bkld,kgod->bkglo", v.float(), w)  # (B, H_kv, G, L, hidden): f_h(x_j)
    return torch.linalg.vector_norm(f, dim=-1).reshape(B, H, L)
