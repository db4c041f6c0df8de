"""Jensen-Shannon divergence between the attention of every pair of heads, in Triton.

`js.pairwise_js(..., backend="triton")` lands here. For N heads (of any layers, stacked as
(B, N, L, D) queries and keys, `StatsSpec.keep_qk`) it returns the (N, N) float64 matrix
of JS(H_a(i), H_c(i)) summed over the valid query rows i of the batch, in nats, without
keeping any L x L map:

1. a row pass, one program per (query block, b, head): online softmax over the key blocks
   gives each row's lse = m + ln l and entropy H = ln l - t / l, with l = sum_j e_j,
   t = sum_j e_j (s_j - m), e_j = exp(s_j - m) relative to the running max m;
2. a pair pass, one program per (pair a < c, b, query block): both heads' tiles are
   recomputed from q, k and the lse (p = exp(s - lse), `triton_tiles.tile_probs`), and
   JS = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2 needs one log per key (0 ln 0 = 0).
   Each program writes the sum over its valid rows to its own slot; torch reduces the
   slots in float64, so the result is deterministic (no atomics).

Padding keys get no mass (the most negative finite fill, as `eager`), padding queries are
not counted. fp32, fp16 and bf16 inputs; everything is computed in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_tiles import DTYPES, FMIN, key_block_scores, map_base, mask_int8, tile_probs


@triton.jit
def _row_lse_inner(
    l_i, m_i, t_i, q, K_ptr, Valid_ptr,  #
    stride_kl, stride_kd, stride_ml,  #
    sm_scale, L, D, offs_d, FMIN,  #
    BLOCK_N: tl.constexpr, IS_FP32: tl.constexpr,
):
    """Online softmax over every key block of one row block: l, m and t of each row."""
    for start_n in range(0, L, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        s, kv, n_in = key_block_scores(q, K_ptr, Valid_ptr, offs_n, offs_d, stride_kl, stride_kd, stride_ml,
                                       sm_scale, L, D, FMIN, IS_FP32)  # (BLOCK_M, BLOCK_N)
        # -- running max, rescale, block sums
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,); finite: every block has a key < L
        alpha = tl.exp(m_i - m_new)  # 0 on the first block
        e = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        ds = tl.where(n_in[None, :], s - m_new[:, None], 0.0)  # guard 0 * -inf past the row end
        shift = (tl.where(l_i > 0, m_i, m_new) - m_new) * l_i  # moves the old t from m_i to m_new (0 at first)
        t_i = alpha * (t_i + shift) + tl.sum(e * ds, 1)
        l_i = alpha * l_i + tl.sum(e, 1)
        m_i = m_new
    return l_i, m_i, t_i


@triton.jit
def _row_lse_kernel(
    Q, K, KeyValid, Lse, Entropy,  #
    sm_scale,  #
    stride_qb, stride_qh, stride_ql, stride_qd,  #
    stride_kb, stride_kh, stride_kl, stride_kd,  #
    stride_mb, stride_ml,  #
    H, L, D,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IS_FP32: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_bh, off_b, off_h, Q_ptr, K_ptr, Valid_ptr = map_base(Q, K, KeyValid, stride_qb, stride_qh, stride_kb,
                                                             stride_kh, stride_mb, H)
    row0 = off_bh.to(tl.int64) * L
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    m_in = offs_m < L
    q = tl.load(Q_ptr + offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
                mask=m_in[:, None] & (offs_d < D)[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    t_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    l_i, m_i, t_i = _row_lse_inner(l_i, m_i, t_i, q, K_ptr, Valid_ptr,  #
                                   stride_kl, stride_kd, stride_ml,  #
                                   sm_scale, L, D, offs_d, FMIN,  #
                                   BLOCK_N, IS_FP32)
    tl.store(Lse + row0 + offs_m, m_i + tl.log(l_i), mask=m_in)
    tl.store(Entropy + row0 + offs_m, tl.log(l_i) - t_i / l_i, mask=m_in)


@triton.jit
def _js_pair_inner(
    h_m, qa, qc, lse_a, lse_c, Ka_ptr, Kc_ptr, Valid_ptr,  #
    stride_kl, stride_kd, stride_ml,  #
    sm_scale, L, D, offs_d, FMIN,  #
    BLOCK_N: tl.constexpr, IS_FP32: tl.constexpr,
):
    """H(m) of every row of one query block, m = (p_a + p_c) / 2 over all key blocks.
    Blocks of padding keys give the counted rows (which have a valid key) exactly 0: skipped."""
    d_in = offs_d < D
    for start_n in range(0, L, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        n_in = offs_n < L
        kv = tl.load(Valid_ptr + offs_n * stride_ml, mask=n_in, other=0) != 0  # (BLOCK_N,)
        if tl.max(kv.to(tl.int32), 0) > 0:
            kmask = n_in[None, :] & d_in[:, None]
            ka = tl.load(Ka_ptr + offs_n[None, :] * stride_kl + offs_d[:, None] * stride_kd,
                         mask=kmask, other=0.0)  # (BLOCK_D, BLOCK_N)
            kc = tl.load(Kc_ptr + offs_n[None, :] * stride_kl + offs_d[:, None] * stride_kd, mask=kmask, other=0.0)
            pa = tile_probs(qa, ka, lse_a, kv, n_in, sm_scale, L, FMIN, IS_FP32)  # (BLOCK_M, BLOCK_N)
            pc = tile_probs(qc, kc, lse_c, kv, n_in, sm_scale, L, FMIN, IS_FP32)
            m = 0.5 * (pa + pc)  # (BLOCK_M, BLOCK_N)
            h_m -= tl.sum(m * tl.log(tl.where(m > 0, m, 1.0)), 1)  # 0 ln 0 = 0, no NaN
    return h_m


@triton.jit
def _js_pair_kernel(
    Q, K, KeyValid, Lse, Entropy, Pairs, Partial,  #
    sm_scale,  #
    stride_qb, stride_qh, stride_ql, stride_qd,  #
    stride_kb, stride_kh, stride_kl, stride_kd,  #
    stride_mb, stride_ml,  #
    N, L, D, N_MBLOCKS,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IS_FP32: tl.constexpr,
):
    pair = tl.program_id(0)
    pid = tl.program_id(1)
    off_b = (pid // N_MBLOCKS).to(tl.int64)
    start_m = pid % N_MBLOCKS
    head_a = tl.load(Pairs + 2 * pair).to(tl.int64)
    head_c = tl.load(Pairs + 2 * pair + 1).to(tl.int64)
    Valid_ptr = KeyValid + off_b * stride_mb
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    m_in = offs_m < L
    qmask = m_in[:, None] & (offs_d < D)[None, :]
    # -- both heads' query rows, lse and entropies
    qa = tl.load(Q + off_b * stride_qb + head_a * stride_qh + offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
                 mask=qmask, other=0.0)  # (BLOCK_M, BLOCK_D)
    qc = tl.load(Q + off_b * stride_qb + head_c * stride_qh + offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
                 mask=qmask, other=0.0)
    row_a = (off_b * N + head_a) * L + offs_m  # (BLOCK_M,) rows in (B, N, L)
    row_c = (off_b * N + head_c) * L + offs_m
    lse_a = tl.load(Lse + row_a, mask=m_in, other=0.0)
    lse_c = tl.load(Lse + row_c, mask=m_in, other=0.0)
    h_a = tl.load(Entropy + row_a, mask=m_in, other=0.0)
    h_c = tl.load(Entropy + row_c, mask=m_in, other=0.0)
    qv = tl.load(Valid_ptr + offs_m * stride_ml, mask=m_in, other=0) != 0  # (BLOCK_M,) counted rows
    h_m = tl.zeros([BLOCK_M], dtype=tl.float32)
    if tl.max(qv.to(tl.int32), 0) > 0:  # a block of padding rows only writes 0
        h_m = _js_pair_inner(h_m, qa, qc, lse_a, lse_c,  #
                             K + off_b * stride_kb + head_a * stride_kh, K + off_b * stride_kb + head_c * stride_kh,  #
                             Valid_ptr, stride_kl, stride_kd, stride_ml,  #
                             sm_scale, L, D, offs_d, FMIN,  #
                             BLOCK_N, IS_FP32)
    # -- JS per counted row, summed over the block into this program's slot
    js = tl.where(qv, h_m - 0.5 * (h_a + h_c), 0.0)
    tl.store(Partial + pair.to(tl.int64) * tl.num_programs(1) + pid, tl.sum(js, 0))


def js_config(L: int, D: int) -> dict:
    """Block sizes of both JS passes: 32 x 32 tiles (the pair kernel holds two heads' tiles;
    64-row blocks spill registers on sm_80 in fp32)."""
    block = max(16, min(32, triton.next_power_of_2(L)))
    return dict(BLOCK_M=block, BLOCK_N=block, BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=4, num_stages=2)


def row_lse_triton(q, k, key_valid, scale):
    """Row lse and entropy (both (B, H, L) fp32) of the masked scaled scores q k^T * scale."""
    B, H, L, D = q.shape
    dev = q.device
    valid = mask_int8(key_valid, dev)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=dev)
    entropy = torch.empty(B, H, L, dtype=torch.float32, device=dev)
    cfg = js_config(L, D)
    grid = (triton.cdiv(L, cfg["BLOCK_M"]), B * H)
    _row_lse_kernel[grid](
        q, k, valid, lse, entropy,  #
        float(scale),  #
        *q.stride(), *k.stride(), *valid.stride(),  #
        H, L, D,  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"],  #
        IS_FP32=q.dtype == torch.float32, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return lse, entropy


def pairwise_js_triton(q, k, key_valid, scale):
    """(N, N) float64 on the CPU, like the other backends: JS summed over the valid query
    rows of the batch for every pair of heads; the diagonal is 0.

    q, k:      (B, N, L, D) fp32, fp16 or bf16, any strides (read in place)
    key_valid: (B, L) bool
    """
    if q.dtype not in DTYPES or k.dtype != q.dtype:
        raise TypeError(f"q and k must both be float32, float16 or bfloat16, got {q.dtype} and {k.dtype}")
    if k.shape != q.shape:
        raise ValueError(f"q and k must both be (B, N, L, D); got {tuple(q.shape)} and {tuple(k.shape)}")
    B, N, L, D = q.shape
    if tuple(key_valid.shape) != (B, L):
        raise ValueError(f"key_valid must be (B, L) = {(B, L)}, got {tuple(key_valid.shape)}")
    out = torch.zeros(N, N, dtype=torch.float64)
    if N < 2 or B == 0 or L == 0:
        return out
    dev = q.device
    lse, entropy = row_lse_triton(q, k, key_valid, scale)  # (B, N, L) each
    valid = mask_int8(key_valid, dev)
    a, c = torch.triu_indices(N, N, offset=1)  # (P,) each, a < c
    pairs = torch.stack([a, c], 1).to(device=dev, dtype=torch.int32).contiguous()  # (P, 2)
    cfg = js_config(L, D)
    n_mblocks = triton.cdiv(L, cfg["BLOCK_M"])
    partial = torch.empty(len(a), B * n_mblocks, dtype=torch.float32, device=dev)  # one slot per program
    _js_pair_kernel[(len(a), B * n_mblocks)](
        q, k, valid, lse, entropy, pairs, partial,  #
        float(scale),  #
        *q.stride(), *k.stride(), *valid.stride(),  #
        N, L, D, n_mblocks,  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"],  #
        IS_FP32=q.dtype == torch.float32, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    js = partial.double().sum(1).cpu()  # (P,), deterministic reduction
    out[a, c] = js
    out[c, a] = js
    return out


__all__ = ["pairwise_js_triton", "row_lse_triton", "js_config"]
