"""Whole-map Triton passes after the fused forward: column mass and word-level maps.

Both re-derive the attention probabilities tile by tile from q, k and the row
log-sum-exp `lse` (B, H, L) fp32 that the fused forward stores
(`triton_attention.fused_attention`): p_ij = exp(s_ij - lse_i), with s_ij = q_i . k_j * scale
and padding keys at the most negative finite float, as `eager` does. No L x L map is
ever written, and no atomics are used: every output element is owned by one program, so
the results are deterministic.

- column mass (B, H, L): the mass each key receives, summed over the valid query rows.
  One program per (b, h, key block) keeps its K tile and runs over the query blocks, like
  the dK/dV loop of the FlashAttention backward; blocks of padding keys or padding rows
  add exactly 0 and are skipped.
- word maps (B, H, W, W) = from_word @ P @ to_word (`spec.WordPooling`) and their row
  argmax over the *other* candidate units (lowest index on ties, -1 when there is none).
  One program per (b, h, block of BLOCK_W units) walks the column tiles of its rows: for
  each (BLOCK_W, BLOCK_W) tile and query block it accumulates R = P_tile @ to_word_tile
  (BLOCK_M, BLOCK_W) over the key blocks, then adds from_word_tile @ R; the running row
  argmax is the epilogue of each tile. BLOCK_W is 32 (tl.dot needs >= 16): a whole
  (W, W) map in one program spills registers on sm_80 from W = 64 on (fp32 dots run on
  FMA units). Query blocks with no from_word weight on the rows and key blocks outside the
  tile's units add exactly 0 and are skipped, so a tile of a sentence touches a few blocks.

A sequence with no valid key has uniform rows in `eager` (every score is the same finite
fill). Its lse is fill + ln L, which rounds to the fill in fp32, so exp(s - lse) would be
1 instead of 1/L: rows whose lse is below FMIN / 2 are taken as uniform over the L keys.

fp32, fp16 and bf16 q / k are accepted; scores, probabilities and the pooling matmuls are
fp32 (fp32 dots with input_precision="ieee"; a half-precision Q K^T accumulates in fp32). Under
TRITON_INTERPRET=1 (set before this module is imported) the kernels run on CPU tensors.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import require_pooling
from .spec import PLAIN, AttentionLayout, WordPooling
from .triton_tiles import DTYPES, FMIN, in_band, launch_caps, map_base, mask_int8, sliced_probs, tile_probs


@triton.jit
def _column_mass_kernel(
    Q, K, KeyValid, Lse, ColMass,  #
    sm_scale,  #
    stride_qb, stride_qh, stride_ql, stride_qd,  #
    stride_kb, stride_kh, stride_kl, stride_kd,  #
    stride_mb, stride_ml,  #
    H, L, D, G, win_left, win_right,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IS_FP32: tl.constexpr,
    BANDED: tl.constexpr,
):
    start_n = tl.program_id(0)
    off_bh, off_b, off_h, Q_ptr, K_ptr, Valid_ptr = map_base(Q, K, KeyValid, stride_qb, stride_qh, stride_kb,
                                                             stride_kh, stride_mb, H)
    if BANDED:  # query head h reads key head h // G; query i sees keys i - win_left .. i + win_right
        K_ptr = K + off_b * stride_kb + (off_h // G) * stride_kh
        # the rows that see any of this block's keys: start_n * BLOCK_N - win_right .. last key + win_left
        m_lo = (tl.maximum(start_n * BLOCK_N - win_right, 0) // BLOCK_M) * BLOCK_M
        m_hi = tl.minimum(start_n * BLOCK_N + BLOCK_N + win_left, L)
    else:
        m_lo = 0
        m_hi = L
    row0 = off_bh.to(tl.int64) * L  # this map's first row in (B, H, L)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    n_in = offs_n < L
    d_in = offs_d < D
    # -- this program's keys stay resident
    k = tl.load(K_ptr + offs_n[None, :] * stride_kl + offs_d[:, None] * stride_kd,
                mask=n_in[None, :] & d_in[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
    kv = tl.load(Valid_ptr + offs_n * stride_ml, mask=n_in, other=0) != 0  # (BLOCK_N,)
    col = tl.zeros([BLOCK_N], dtype=tl.float32)
    # -- padding keys receive exactly 0 from valid rows, and padding rows are not counted
    if tl.max(kv.to(tl.int32), 0) > 0:
        for start_m in range(m_lo, m_hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
            m_in = offs_m < L
            qv = tl.load(Valid_ptr + offs_m * stride_ml, mask=m_in, other=0) != 0  # (BLOCK_M,) valid query rows
            if tl.max(qv.to(tl.int32), 0) > 0:
                q = tl.load(Q_ptr + offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
                            mask=m_in[:, None] & d_in[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
                lse = tl.load(Lse + row0 + offs_m, mask=m_in, other=0.0)  # (BLOCK_M,)
                p = tile_probs(q, k, lse, kv, n_in, sm_scale, L, FMIN, IS_FP32)  # (BLOCK_M, BLOCK_N)
                if BANDED:
                    p = tl.where(in_band(offs_m, offs_n, win_left, win_right), p, 0.0)
                col += tl.sum(tl.where(qv[:, None], p, 0.0), 0)
    tl.store(ColMass + row0 + offs_n, col.to(ColMass.dtype.element_ty), mask=n_in)


@triton.jit
def _word_tile_inner(
    acc, Q_ptr, K_ptr, Valid_ptr, Lse_ptr, FW_ptr, TW_ptr,  #
    stride_ql, stride_qd, stride_kl, stride_kd, stride_ml,  #
    stride_fw, stride_fl, stride_tl, stride_tw,  #
    sm_scale, L, D, W, offs_r, offs_c, offs_d, FMIN, win_left, win_right,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, IS_FP32: tl.constexpr,
    BANDED: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DK: tl.constexpr,
):
    """acc += from_word[rows, :] @ P @ to_word[:, cols] for one (BLOCK_W, BLOCK_W) tile of the
    word map: per query block R = P_tile @ to_word_tile over the key blocks, then from_word_tile @ R.
    Query blocks with no weight in from_word[rows] and key blocks outside the units of cols
    add exactly 0 and are skipped (units are token spans, so a tile touches few blocks)."""
    d_in = offs_d < D
    r_in = offs_r < W
    c_in = offs_c < W
    for start_m in range(0, L, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        m_in = offs_m < L
        fw = tl.load(FW_ptr + offs_r[:, None] * stride_fw + offs_m[None, :] * stride_fl,
                     mask=r_in[:, None] & m_in[None, :], other=0.0).to(tl.float32)  # (BLOCK_W, BLOCK_M)
        if tl.max(tl.max(fw, 1), 0) > 0:
            q = tl.load(Q_ptr + offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
                        mask=m_in[:, None] & d_in[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
            lse = tl.load(Lse_ptr + offs_m, mask=m_in, other=0.0)  # (BLOCK_M,)
            # -- R = P[rows of this block, :] @ to_word[:, cols]
            r = tl.zeros([BLOCK_M, BLOCK_W], dtype=tl.float32)  # (BLOCK_M, BLOCK_W)
            if BANDED:  # the keys these rows see
                n_lo = (tl.maximum(start_m - win_left, 0) // BLOCK_N) * BLOCK_N
                n_hi = tl.minimum(start_m + BLOCK_M + win_right, L)
            else:
                n_lo = 0
                n_hi = L
            for start_n in range(n_lo, n_hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
                n_in = offs_n < L
                tw = tl.load(TW_ptr + offs_n[:, None] * stride_tl + offs_c[None, :] * stride_tw,
                             mask=n_in[:, None] & c_in[None, :], other=0.0).to(tl.float32)  # (BLOCK_N, BLOCK_W)
                if tl.max(tl.max(tw, 1), 0) > 0:
                    if BLOCK_DK < BLOCK_D:  # the scores slice by slice of D (fp32 above D = 128)
                        kv = tl.load(Valid_ptr + offs_n * stride_ml, mask=n_in, other=0) != 0  # (BLOCK_N,)
                        p = sliced_probs(Q_ptr, K_ptr, offs_m, offs_n, m_in, n_in, lse, kv, sm_scale, L, D, FMIN,
                                         stride_ql, stride_qd, stride_kl, stride_kd, BLOCK_M, BLOCK_N, BLOCK_D,
                                         BLOCK_DK)  # (BLOCK_M, BLOCK_N)
                    else:
                        k = tl.load(K_ptr + offs_n[None, :] * stride_kl + offs_d[:, None] * stride_kd,
                                    mask=n_in[None, :] & d_in[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
                        kv = tl.load(Valid_ptr + offs_n * stride_ml, mask=n_in, other=0) != 0  # (BLOCK_N,)
                        p = tile_probs(q, k, lse, kv, n_in, sm_scale, L, FMIN, IS_FP32)  # (BLOCK_M, BLOCK_N)
                    if BANDED:
                        p = tl.where(in_band(offs_m, offs_n, win_left, win_right), p, 0.0)
                    r = tl.dot(p, tw, r, input_precision="ieee")  # (BLOCK_M, BLOCK_W)
            # -- word map tile += from_word[rows, block] @ R
            acc = tl.dot(fw, r, acc, input_precision="ieee")  # (BLOCK_W, BLOCK_W)
    return acc


@triton.jit
def _word_map_kernel(
    Q, K, KeyValid, Lse, FromWord, ToWord, Candidate, WordMap, WordArgmax,  #
    sm_scale,  #
    stride_qb, stride_qh, stride_ql, stride_qd,  #
    stride_kb, stride_kh, stride_kl, stride_kd,  #
    stride_mb, stride_ml,  #
    stride_fb, stride_fw, stride_fl,  #
    stride_tb, stride_tl, stride_tw,  #
    stride_cb, stride_cw,  #
    H, L, D, W, G, win_left, win_right,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr,  #
    IS_FP32: tl.constexpr, BANDED: tl.constexpr, BLOCK_DK: tl.constexpr,
):
    start_r = tl.program_id(0)
    off_bh, off_b, off_h, Q_ptr, K_ptr, Valid_ptr = map_base(Q, K, KeyValid, stride_qb, stride_qh, stride_kb,
                                                             stride_kh, stride_mb, H)
    if BANDED:  # query head h reads key head h // G
        K_ptr = K + off_b * stride_kb + (off_h // G) * stride_kh
    Lse_ptr = Lse + off_bh.to(tl.int64) * L
    FW_ptr = FromWord + off_b * stride_fb
    TW_ptr = ToWord + off_b * stride_tb
    map0 = off_bh.to(tl.int64) * W * W  # this map's first element in (B, H, W, W)
    offs_r = start_r * BLOCK_W + tl.arange(0, BLOCK_W)  # (BLOCK_W,) this program's units (map rows)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    r_in = offs_r < W
    best = tl.full([BLOCK_W], -1.0, dtype=tl.float32)  # running row max over allowed units
    arg = tl.full([BLOCK_W], -1, dtype=tl.int32)
    for start_c in range(0, W, BLOCK_W):
        offs_c = start_c + tl.arange(0, BLOCK_W)  # (BLOCK_W,) map columns
        c_in = offs_c < W
        acc = tl.zeros([BLOCK_W, BLOCK_W], dtype=tl.float32)
        acc = _word_tile_inner(acc, Q_ptr, K_ptr, Valid_ptr, Lse_ptr, FW_ptr, TW_ptr,  #
                               stride_ql, stride_qd, stride_kl, stride_kd, stride_ml,  #
                               stride_fw, stride_fl, stride_tl, stride_tw,  #
                               sm_scale, L, D, W, offs_r, offs_c, offs_d, FMIN, win_left, win_right,  #
                               BLOCK_M, BLOCK_N, BLOCK_W, IS_FP32, BANDED, BLOCK_D, BLOCK_DK)
        tl.store(WordMap + map0 + offs_r[:, None] * W + offs_c[None, :], acc.to(WordMap.dtype.element_ty),
                 mask=r_in[:, None] & c_in[None, :])
        # -- argmax over the other candidate units; an earlier tile keeps ties (lowest index)
        cand = tl.load(Candidate + off_b * stride_cb + offs_c * stride_cw, mask=c_in, other=0) != 0  # (BLOCK_W,)
        allowed = cand[None, :] & (offs_r[:, None] != offs_c[None, :])  # (BLOCK_W, BLOCK_W)
        score = tl.where(allowed, acc, -1.0)  # probabilities are >= 0, so -1 never wins
        tile_best = tl.max(score, 1)  # (BLOCK_W,)
        tile_arg = tl.min(tl.where(allowed & (score == tile_best[:, None]), offs_c[None, :], 2147483647), 1)
        take = tile_best > best
        arg = tl.where(take, tile_arg, arg)
        best = tl.where(take, tile_best, best)
    tl.store(WordArgmax + off_bh.to(tl.int64) * W + offs_r, arg.to(tl.int64), mask=r_in)  # -1: no candidate


# True when this module was imported under TRITON_INTERPRET=1 (the kernels run on CPU tensors)
INTERPRETED = not isinstance(_column_mass_kernel, triton.runtime.jit.JITFunction)


def _check(q, k, key_valid, lse, layout: AttentionLayout = PLAIN):
    if q.dtype not in DTYPES or k.dtype != q.dtype:
        raise TypeError(f"q and k must both be float32, float16 or bfloat16, got {q.dtype} and {k.dtype}")
    B, H, L, D = q.shape
    H_kv = H // layout.group_size(H)
    if k.shape != (B, H_kv, L, D):
        raise ValueError(f"q must be (B, H, L, D) and k (B, H_kv, L, D) with H_kv = {H_kv}; got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if tuple(key_valid.shape) != (B, L):
        raise ValueError(f"key_valid must be (B, L) = {(B, L)}, got {tuple(key_valid.shape)}")
    if tuple(lse.shape) != (B, H, L) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be float32 (B, H, L) = {(B, H, L)}, got {lse.dtype} {tuple(lse.shape)}")


def column_mass_config(L: int, D: int) -> dict:
    """Block sizes of the column-mass pass for rows of length L and head dimension D.

    32 x 32 tiles: fp32 dots run on FMA units and hold their operands in registers, and
    64-row blocks reach sm_80's 255-register limit (kernels/triton_aot.py checks spills)."""
    block = max(16, min(32, triton.next_power_of_2(L)))
    return dict(BLOCK_M=block, BLOCK_N=block, BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=4, num_stages=2)


def band_args(layout: AttentionLayout, H: int, L: int) -> dict:
    """The kernels' layout arguments: G, the band (L for no limit) and the BANDED switch (off
    for the plain layout, whose code is then the same as before layouts existed)."""
    left, right = layout.reach
    return dict(G=layout.group_size(H), win_left=L if left is None else min(left, L),
                win_right=L if right is None else min(right, L), BANDED=not layout.is_plain)


def column_mass_triton(q, k, key_valid, lse, scale=None, out_dtype=None, layout: AttentionLayout = PLAIN):
    """(B, H, L): the attention mass each key receives, summed over the valid query rows.

    q:         (B, H, L, D) fp32, fp16 or bf16, any strides (read in place)
    k:         (B, H_kv, L, D), H_kv = layout.n_key_value_heads or H
    key_valid: (B, L) bool; padding rows are not counted, padding keys receive 0
    lse:       (B, H, L) fp32 row log-sum-exp of the masked scaled scores (fused forward)
    out_dtype: dtype of the result (default: the input dtype, as eager)
    layout:    causal / windowed / grouped-query (`AttentionLayout`): each key block visits
               only the query blocks whose band holds it
    """
    _check(q, k, key_valid, lse, layout)
    B, H, L, D = q.shape
    scale = D**-0.5 if scale is None else float(scale)
    dev = q.device
    valid = mask_int8(key_valid, dev)
    lse = lse.contiguous()
    out = torch.empty(B, H, L, dtype=q.dtype if out_dtype is None else out_dtype, device=dev)
    if out.numel() == 0:
        return out
    cfg = column_mass_config(L, D)
    grid = (triton.cdiv(L, cfg["BLOCK_N"]), B * H)
    _column_mass_kernel[grid](
        q, k, valid, lse, out,  #
        scale,  #
        *q.stride(), *k.stride(), *valid.stride(),  #
        H, L, D,  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"],  #
        IS_FP32=q.dtype == torch.float32, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **band_args(layout, H, L),
    )
    return out


def word_map_config(L: int, D: int, W: int, fp32: bool = True) -> dict:
    """Block sizes of the word-map pass: the (W, W) map in 32 x 32 tiles. Measured with
    kernels/triton_aot.py for D = 32 and 64 on sm_80: fp32 (FMA dots) needs 8 warps to stay
    under 255 registers per thread, fp16 and bf16 (tensor-core dots) 4; the other warp counts, and
    16-unit tiles for some of them, spill (ptxas then caps the kernel at 128 registers). Above
    D = 128 (Gemma-3's 256) 16-token blocks: 32 spill in fp32. BLOCK_DK: the width of the slices
    of D the scores are summed over, BLOCK_D (one dot) but in fp32 above D = 128: one 256-deep
    exact FMA dot holds its operands' 2 x 256 values per thread and spilled 240-320 bytes at 255
    registers, with 4, 8 or 16 warps, 16-unit tiles, 1 stage or a register cap alike. Four
    64-wide slices, each slice of q and k loaded where it is used, with `maxnreg` 255 (an
    explicit cap; without it ptxas settles at 128 registers on sm_90 and spills a few bytes)
    do not spill: 255 registers, one CTA of 8 warps per SM (Triton 3.6 and 3.7,
    bench/results_triton_layout.md)."""
    block = max(16, min(32 if D <= 128 else 16, triton.next_power_of_2(L)))
    block_d = max(16, triton.next_power_of_2(D))
    if fp32 and block_d > 128:
        return dict(BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, BLOCK_DK=64, BLOCK_W=32, num_warps=8, num_stages=2,
                    maxnreg=255)
    return dict(BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, BLOCK_DK=block_d,
                BLOCK_W=32, num_warps=8 if fp32 else 4, num_stages=2)


def word_maps_triton(q, k, key_valid, lse, pooling: WordPooling, scale=None, out_dtype=None,
                     layout: AttentionLayout = PLAIN):
    """Word-level maps (B, H, W, W) = from_word @ P @ to_word and their argmax (B, H, W) int64
    (most-attended other candidate unit, lowest index on ties, -1 when none).

    q, k, key_valid, lse, layout as in `column_mass_triton`; pooling: the batch's `WordPooling`
    (from_word (B, W, L), to_word (B, L, W), candidate (B, W)), read through its strides.
    """
    require_pooling(pooling)
    _check(q, k, key_valid, lse, layout)
    B, H, L, D = q.shape
    fw, tw, cand = pooling.from_word, pooling.to_word, pooling.candidate
    W = pooling.n_units
    if tuple(fw.shape) != (B, W, L) or tuple(tw.shape) != (B, L, W) or tuple(cand.shape) != (B, W):
        raise ValueError(f"pooling does not fit (B, L) = {(B, L)}: from_word {tuple(fw.shape)}, "
                         f"to_word {tuple(tw.shape)}, candidate {tuple(cand.shape)}")
    scale = D**-0.5 if scale is None else float(scale)
    dev = q.device
    valid = mask_int8(key_valid, dev)
    fw, tw = fw.to(dev), tw.to(dev)
    cand = mask_int8(cand, dev)
    lse = lse.contiguous()
    word_map = torch.empty(B, H, W, W, dtype=q.dtype if out_dtype is None else out_dtype, device=dev)
    word_arg = torch.empty(B, H, W, dtype=torch.int64, device=dev)
    if word_map.numel() == 0:
        return word_map, word_arg
    cfg = word_map_config(L, D, W, q.dtype == torch.float32)
    _word_map_kernel[(triton.cdiv(W, cfg["BLOCK_W"]), B * H)](
        q, k, valid, lse, fw, tw, cand, word_map, word_arg,  #
        scale,  #
        *q.stride(), *k.stride(), *valid.stride(),  #
        *fw.stride(), *tw.stride(), *cand.stride(),  #
        H, L, D, W,  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], BLOCK_W=cfg["BLOCK_W"],  #
        BLOCK_DK=cfg["BLOCK_DK"], IS_FP32=q.dtype == torch.float32, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **launch_caps(cfg), **band_args(layout, H, L),
    )
    return word_map, word_arg


__all__ = ["column_mass_triton", "word_maps_triton", "column_mass_config", "word_map_config", "band_args",
           "INTERPRETED"]
