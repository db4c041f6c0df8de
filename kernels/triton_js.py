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

from .spec import PLAIN, AttentionLayout
from .triton_tiles import DTYPES, FMIN, in_band, key_block_scores, map_base, mask_int8, tile_probs


@triton.jit
def _row_lse_inner(
    l_i, m_i, t_i, q, K_ptr, Valid_ptr,  #
    stride_kl, stride_kd, stride_ml,  #
    sm_scale, L, D, offs_d, FMIN, n_lo, n_hi, offs_m, win_left, win_right,  #
    BLOCK_N: tl.constexpr, IS_FP32: tl.constexpr, BANDED: tl.constexpr,
):
    """Online softmax over the key blocks n_lo .. n_hi of one row block: l, m and t of each
    row (BANDED: keys outside a row's band get the padding fill, as eager's visibility mask)."""
    for start_n in range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        s, kv, n_in = key_block_scores(q, K_ptr, Valid_ptr, offs_n, offs_d, stride_kl, stride_kd, stride_ml,
                                       sm_scale, L, D, FMIN, IS_FP32)  # (BLOCK_M, BLOCK_N)
        if BANDED:
            s = tl.where(in_band(offs_m, offs_n, win_left, win_right) | (offs_n >= L)[None, :], s, FMIN)
        # -- running max, rescale, block sums
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,); finite: every block has a key < L
        alpha = tl.exp(m_i - m_new)  # 0 on the first block
        e = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        ds = tl.where(n_in[None, :], s - m_new[:, None], 0.0)  # guard 0 * -inf past the row end
        if BANDED:  # a row may see only filled keys first (m_i = FMIN): no -inf * 0 when they vanish
            shift = tl.where(alpha > 0, (m_i - m_new) * l_i, 0.0)
        else:
            shift = (tl.where(l_i > 0, m_i, m_new) - m_new) * l_i  # moves the old t from m_i to m_new (0 at first)
        t_i = alpha * (t_i + shift) + tl.sum(e * ds, 1)
        l_i = alpha * l_i + tl.sum(e, 1)
        m_i = m_new
    return l_i, m_i, t_i


@triton.jit
def _row_lse_kernel(
    Q, K, KeyValid, Lse, Entropy, KvHead, Left, Right,  #
    sm_scale,  #
    stride_qb, stride_qh, stride_ql, stride_qd,  #
    stride_kb, stride_kh, stride_kl, stride_kd,  #
    stride_mb, stride_ml,  #
    H, L, D,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IS_FP32: tl.constexpr,
    BANDED: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_bh, off_b, off_h, Q_ptr, K_ptr, Valid_ptr = map_base(Q, K, KeyValid, stride_qb, stride_qh, stride_kb,
                                                             stride_kh, stride_mb, H)
    if BANDED:  # head h: key head KvHead[h], band Left[h] .. Right[h]
        K_ptr = K + off_b * stride_kb + tl.load(KvHead + off_h).to(tl.int64) * stride_kh
        win_left = tl.load(Left + off_h)
        win_right = tl.load(Right + off_h)
        n_lo = (tl.maximum(start_m * BLOCK_M - win_left, 0) // BLOCK_N) * BLOCK_N
        n_hi = tl.minimum(start_m * BLOCK_M + BLOCK_M + win_right, L)
    else:
        win_left = L
        win_right = L
        n_lo = 0
        n_hi = L
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
                                   sm_scale, L, D, offs_d, FMIN, n_lo, n_hi, offs_m, win_left, win_right,  #
                                   BLOCK_N, IS_FP32, BANDED)
    tl.store(Lse + row0 + offs_m, m_i + tl.log(l_i), mask=m_in)
    tl.store(Entropy + row0 + offs_m, tl.log(l_i) - t_i / l_i, mask=m_in)


@triton.jit
def _js_pair_inner(
    h_m, qa, qc, lse_a, lse_c, Ka_ptr, Kc_ptr, Valid_ptr,  #
    stride_kl, stride_kd, stride_ml,  #
    sm_scale, L, D, offs_d, FMIN, n_lo, n_hi, offs_m, left_a, right_a, left_c, right_c,  #
    BLOCK_N: tl.constexpr, IS_FP32: tl.constexpr, BANDED: tl.constexpr,
):
    """H(m) of every row of one query block, m = (p_a + p_c) / 2 over the key blocks n_lo .. n_hi
    (BANDED: each head's p is 0 outside its own band). Blocks of padding keys give the counted
    rows (which have a valid key) exactly 0: skipped."""
    d_in = offs_d < D
    for start_n in range(n_lo, n_hi, BLOCK_N):
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
            if BANDED:
                pa = tl.where(in_band(offs_m, offs_n, left_a, right_a), pa, 0.0)
                pc = tl.where(in_band(offs_m, offs_n, left_c, right_c), pc, 0.0)
            m = 0.5 * (pa + pc)  # (BLOCK_M, BLOCK_N)
            h_m -= tl.sum(m * tl.log(tl.where(m > 0, m, 1.0)), 1)  # 0 ln 0 = 0, no NaN
    return h_m


@triton.jit
def _js_pair_kernel(
    Q, K, KeyValid, Lse, Entropy, Pairs, Partial, KvHead, Left, Right,  #
    sm_scale,  #
    stride_qb, stride_qh, stride_ql, stride_qd,  #
    stride_kb, stride_kh, stride_kl, stride_kd,  #
    stride_mb, stride_ml,  #
    N, L, D, N_MBLOCKS,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IS_FP32: tl.constexpr,
    BANDED: tl.constexpr,
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
    if BANDED:  # each head's key head and band; the keys either head's rows see
        kv_a = tl.load(KvHead + head_a).to(tl.int64)
        kv_c = tl.load(KvHead + head_c).to(tl.int64)
        left_a, right_a = tl.load(Left + head_a), tl.load(Right + head_a)
        left_c, right_c = tl.load(Left + head_c), tl.load(Right + head_c)
        n_lo = (tl.maximum(start_m * BLOCK_M - tl.maximum(left_a, left_c), 0) // BLOCK_N) * BLOCK_N
        n_hi = tl.minimum(start_m * BLOCK_M + BLOCK_M + tl.maximum(right_a, right_c), L)
    else:
        kv_a, kv_c = head_a, head_c
        left_a, right_a, left_c, right_c = L, L, L, L
        n_lo = 0
        n_hi = L
    h_m = tl.zeros([BLOCK_M], dtype=tl.float32)
    if tl.max(qv.to(tl.int32), 0) > 0:  # a block of padding rows only writes 0
        h_m = _js_pair_inner(h_m, qa, qc, lse_a, lse_c,  #
                             K + off_b * stride_kb + kv_a * stride_kh, K + off_b * stride_kb + kv_c * stride_kh,  #
                             Valid_ptr, stride_kl, stride_kd, stride_ml,  #
                             sm_scale, L, D, offs_d, FMIN, n_lo, n_hi, offs_m, left_a, right_a, left_c, right_c,  #
                             BLOCK_N, IS_FP32, BANDED)
    # -- JS per counted row, summed over the block into this program's slot
    js = tl.where(qv, h_m - 0.5 * (h_a + h_c), 0.0)
    tl.store(Partial + pair.to(tl.int64) * tl.num_programs(1) + pid, tl.sum(js, 0))


def js_config(L: int, D: int) -> dict:
    """Block sizes of both JS passes: 32 x 32 tiles (the pair kernel holds two heads' tiles;
    64-row blocks spill registers on sm_80 in fp32), 16 x 16 above D = 128 (Gemma-3's 256:
    32-row fp32 pair tiles spill)."""
    block = max(16, min(32 if D <= 128 else 16, triton.next_power_of_2(L)))
    return dict(BLOCK_M=block, BLOCK_N=block, BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=4, num_stages=2)


def head_bands(layout, N: int, N_kv: int, L: int, kv_head=None, device=None):
    """The kernels' per-head layout operands for N stacked query heads over N_kv key heads:
    (kv_head (N,) int32, left (N,) int32, right (N,) int32, banded). layout: one
    `AttentionLayout` for every head, or one per head (stacked layers of different layouts,
    e.g. Gemma-3's sliding and global layers); L stands for a side without limit.
    kv_head: the key head of each query head; default h // (N / N_kv)."""
    layouts = [layout] * N if isinstance(layout, AttentionLayout) else list(layout)
    if len(layouts) != N:
        raise ValueError(f"{len(layouts)} layouts for {N} heads")
    if kv_head is None:
        if N % N_kv:
            raise ValueError(f"{N} query heads cannot share {N_kv} key heads evenly; give kv_head")
        kv_head = [h // (N // N_kv) for h in range(N)]
    kv_head = torch.as_tensor(kv_head, dtype=torch.int64).cpu()  # checked here, moved to `device` below
    if kv_head.shape != (N,) or (N and (int(kv_head.min()) < 0 or int(kv_head.max()) >= N_kv)):
        raise ValueError(f"kv_head must give each of the {N} query heads a key head in [0, {N_kv})")
    reach = [lay.reach for lay in layouts]
    left = [L if r[0] is None else min(r[0], L) for r in reach]
    right = [L if r[1] is None else min(r[1], L) for r in reach]
    banded = N_kv != N or not all(lay.is_plain for lay in layouts) or not torch.equal(kv_head, torch.arange(N))
    as_i32 = lambda x: torch.as_tensor(x, dtype=torch.int32).to(device)  # noqa: E731
    return as_i32(kv_head), as_i32(left), as_i32(right), banded


def row_lse_triton(q, k, key_valid, scale, layout: AttentionLayout = PLAIN, kv_head=None):
    """Row lse and entropy (both (B, H, L) fp32) of the masked scaled scores q k^T * scale.
    k: (B, H_kv, L, D); layout and kv_head as in `head_bands` (keys outside a row's band get
    the padding fill, as eager's visibility mask gives them)."""
    B, H, L, D = q.shape
    dev = q.device
    valid = mask_int8(key_valid, dev)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=dev)
    entropy = torch.empty(B, H, L, dtype=torch.float32, device=dev)
    kv_head, left, right, banded = head_bands(layout, H, k.shape[1], L, kv_head, dev)
    cfg = js_config(L, D)
    grid = (triton.cdiv(L, cfg["BLOCK_M"]), B * H)
    _row_lse_kernel[grid](
        q, k, valid, lse, entropy, kv_head, left, right,  #
        float(scale),  #
        *q.stride(), *k.stride(), *valid.stride(),  #
        H, L, D,  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"],  #
        IS_FP32=q.dtype == torch.float32, BANDED=banded, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return lse, entropy


def pairwise_js_triton(q, k, key_valid, scale, layout: AttentionLayout = PLAIN, kv_head=None):
    """(N, N) float64 on the CPU, like the other backends: JS summed over the valid query
    rows of the batch for every pair of heads; the diagonal is 0.

    q:         (B, N, L, D) fp32, fp16 or bf16, any strides (read in place)
    k:         (B, N_kv, L, D): N_kv = N, or fewer key heads shared by the query heads
    key_valid: (B, L) bool
    layout:    one `AttentionLayout` for all N heads or one per head (causal, windowed:
               each head's distribution is over the keys its rows see; key blocks outside
               both heads' bands are skipped); kv_head: the key head of each query head
               (default h // (N / N_kv))
    """
    if q.dtype not in DTYPES or k.dtype != q.dtype:
        raise TypeError(f"q and k must both be float32, float16 or bfloat16, got {q.dtype} and {k.dtype}")
    B, N, L, D = q.shape
    if k.dim() != 4 or k.shape[0] != B or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"q must be (B, N, L, D) and k (B, N_kv, L, D); got {tuple(q.shape)} and {tuple(k.shape)}")
    if tuple(key_valid.shape) != (B, L):
        raise ValueError(f"key_valid must be (B, L) = {(B, L)}, got {tuple(key_valid.shape)}")
    out = torch.zeros(N, N, dtype=torch.float64)
    if N < 2 or B == 0 or L == 0:
        return out
    dev = q.device
    kv_head, left, right, banded = head_bands(layout, N, k.shape[1], L, kv_head, dev)
    lse, entropy = row_lse_triton(q, k, key_valid, scale, layout, kv_head.long())  # (B, N, L) each
    valid = mask_int8(key_valid, dev)
    a, c = torch.triu_indices(N, N, offset=1)  # (P,) each, a < c
    pairs = torch.stack([a, c], 1).to(device=dev, dtype=torch.int32).contiguous()  # (P, 2)
    cfg = js_config(L, D)
    n_mblocks = triton.cdiv(L, cfg["BLOCK_M"])
    partial = torch.empty(len(a), B * n_mblocks, dtype=torch.float32, device=dev)  # one slot per program
    _js_pair_kernel[(len(a), B * n_mblocks)](
        q, k, valid, lse, entropy, pairs, partial, kv_head, left, right,  #
        float(scale),  #
        *q.stride(), *k.stride(), *valid.stride(),  #
        N, L, D, n_mblocks,  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"],  #
        IS_FP32=q.dtype == torch.float32, BANDED=banded, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    js = partial.double().sum(1).cpu()  # (P,), deterministic reduction
    out[a, c] = js
    out[c, a] = js
    return out


__all__ = ["pairwise_js_triton", "row_lse_triton", "js_config", "head_bands"]
