"""The fused Triton forward: attention output and row statistics in one pass over K and V.

One program handles BLOCK_M query rows of one (batch, head) map (of the G heads that share one
key/value head, stacked, under grouped-query attention). It computes
S = Q K^T * scale with padding keys set to the most negative finite float (as `eager` does,
so a sequence with no valid key gets uniform rows instead of NaN), the softmax, O = P V,
and in the same pass the row statistics of `spec.StatsSpec`:

- entropy       H = lse - sum_j p_j s_j, kept as H = ln l - t / l with l = sum_j e_j,
                t = sum_j e_j (s_j - m), e_j = exp(s_j - m) relative to the running max m
                (no log per key, and no cancellation of two large numbers);
- offset mass   p_{i, i+o} for each offset o, recomputed in the epilogue from the final
                m and l: one (BLOCK_M, D) load of K shifted by o and a row dot product;
- class mass    sum of p_j over the keys of each class (one class id per key): per key
                block one tl.dot(P, onehot), onehot the (BLOCK_N, C_PAD) one-hot of the
                block's key classes, C_PAD >= 16 (tl.dot's smallest width); the constexpr
                CLASS_DOT=False takes C masked passes instead (kept to time both on a GPU);
- argmax        the first key with the row's largest score (ties: lowest index), tracked
                with the running max;
- distance mass, mean distance, position mass: sums of p_j by the query-key distance
                |i - j| (log2 buckets), of p_j |i - j|, and by the key's tenth of the row's
                context [0, i] (then "after the query"), from the block's query and key positions
                in `_key_block`: exact integer buckets, one masked row sum per bucket a block can
                touch, rescaled like the class mass;
- lse           m + ln l, fp32, for passes that need p again (column mass, JS divergence).

Two code paths, chosen by the constexpr SINGLE_TILE:
- single-tile (plain layout only): the whole key row sits in one (BLOCK_M, BLOCK_N) tile, the
  softmax is exact (normalised in registers before P V), for short rows (`kernel_config`);
- online: key blocks of BLOCK_N with a running max, FlashAttention-style rescaling of
  the output, the class masses, the position-dependent sums and t.

Head gates are applied in the epilogue: a uniform head's output is the mean of V over the
valid keys it sees (a second pass over its keys, compiled in only for a call with uniform
gates: UNIFORM), and every head's output is scaled by its float
gate xi (per head, or per sequence and head). The statistics, lse included, are always
those of the head's own un-gated attention. The kernel has no backward: with a gradient
to compute, `bertscope.engine.attention` takes the output from SDPA instead.

One kernel, `_attn_stats_fwd`, serves every `AttentionLayout`, as Triton's fused-attention
tutorial handles its causal stages with a constexpr: the plain (encoder) layout is the kernel
with BANDED off and G = 1 (no band arithmetic, no mask, no stacking: Triton's launcher
specialises G = 1 to a constant), any other one (causal, windowed, grouped-query: decoders)
switches BANDED on: the G query heads that share a key/value head are stacked into the rows of
one tile (each K / V tile loaded once for all of them), key blocks outside the tile's band are
never visited, blocks inside every row's band run without a mask and the band's edges with one,
and the statistics are over the keys each row sees. Every key block goes through one function,
`_key_block`, which knows its rows' query positions and its key positions: a statistic summed
over keys, position-dependent or not, is written there once. The kernel's outputs are read off
the statistics table (`kernel_outputs`), and a statistic the table has but the kernel lacks is
an error before the launch (`check_computed`).

Inputs are (B, H, L, D) tensors, possibly strided views of the model's projections: the
kernel reads them through their strides, nothing is copied. fp32, fp16 and bf16 inputs
are supported; everything is computed in fp32 (fp32 dots use input_precision="ieee", not
tf32; a half-precision P V multiplies P cast to the input dtype as FlashAttention does),
the output has the input dtype. On a machine without a GPU the kernel runs on CPU tensors through Triton's
interpreter when TRITON_INTERPRET=1 is set before this module is imported.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import torch
import triton
import triton.language as tl

from . import triton_maps
from .common import finish_stats, keep_qk, require_pooling
from .spec import (
    FIXED_WIDTHS,
    N_DISTANCE_BUCKETS,
    N_POSITION_BINS,
    PLAIN,
    ROW_STATS,
    STAT,
    AttentionLayout,
    RowStats,
    StatsSpec,
    WordPooling,
    asked_stats,
)
from .triton_tiles import DTYPES, FMIN, key_block_scores, launch_caps

# rows up to this length take the single-tile path (fp16 / bf16; fp32, whose exact dots need more registers)
SINGLE_TILE_MAX_L = 128
SINGLE_TILE_MAX_L_FP32 = 32
# the register cap (`maxnreg`) of fp32 online blocks at D <= 32 and half-precision single tiles at
# D = 64 (see kernel_config)
MAXNREG_PLAIN = 128
# the half-precision input dtypes: tensor-core dots with fp32 accumulation, the same block sizes
HALF_DTYPES = (torch.float16, torch.bfloat16)
# the statistics whose accumulators change which plain-layout configuration fits in registers
# (`kernel_config`'s positions)
POSITION_STATS = ("distance_mass", "mean_distance", "position_mass")
# the position-dependent statistics' widths (spec.FIXED_WIDTHS) and their accumulators' (powers of two):
# DB log2 distance buckets (the last one open: 32768 and beyond), NPB tenths of the row's context,
# then one bin for keys after the query
DB = tl.constexpr(N_DISTANCE_BUCKETS)  # 17
DB_PAD = tl.constexpr(triton.next_power_of_2(N_DISTANCE_BUCKETS))  # 32
NPB = tl.constexpr(N_POSITION_BINS)  # 10
PB_PAD = tl.constexpr(triton.next_power_of_2(N_POSITION_BINS + 1))  # 16
# a distance / scaled key position above any a sequence has (the open end of the last bucket or bin)
OPEN_END = tl.constexpr(2147483647)


@triton.jit
def _key_block(
    acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i,  #
    q, pos, start_n, lo_m, hi_m, K_ptr, V_ptr, Valid_ptr, Class_ptr,  #
    stride_kl, stride_kd, stride_vl, stride_vd, stride_ml, stride_cl,  #
    sm_scale, L, D, n_classes, offs_d, FMIN,  #
    BLOCK_N: tl.constexpr, C_PAD: tl.constexpr, MASKED: tl.constexpr, ANY_ORDER: tl.constexpr,  #
    SINGLE_TILE: tl.constexpr, ENTROPY: tl.constexpr, ARGMAX: tl.constexpr, IS_FP32: tl.constexpr,  #
    CLASS_DOT: tl.constexpr, DISTANCE_MASS: tl.constexpr, MEAN_DISTANCE: tl.constexpr,  #
    POSITION_MASS: tl.constexpr,
):
    """One key block of the softmax for a tile of (stacked) query rows; every row statistic
    that is summed over keys is updated here, once for every layout.

    The block knows where it is: `pos` (BLOCK_M,) are its rows' query positions and `offs_n`
    (BLOCK_N,) its key positions, so a position-dependent statistic (mass by query-key
    distance, pos[:, None] - offs_n[None, :]) is written in this function only.
    MASKED: the block holds keys outside some row's band [lo_m, hi_m] (they get the padding
    fill, as eager's visibility mask gives them); unmasked blocks are inside every row's band.
    ANY_ORDER: blocks may come out of key order (the banded kernel visits the band's unmasked
    middle first), so argmax ties are settled by index. SINGLE_TILE: this is the row's only
    block, p is normalised here (acc and cls_i come back divided by l_i); otherwise the
    epilogue divides.

    The position-dependent sums (spec.py's `_distance_mass`, `_mean_distance`, `_position_mass`)
    are online sums like the class mass: rescaled by alpha, divided by l_i in the epilogue.
    dist_i (BLOCK_M, DB_PAD) the mass in each log2 bucket of |i - j|, dsum_i (BLOCK_M,)
    sum_j p_j |i - j|, pmass_i (BLOCK_M, PB_PAD) the mass in each bin floor(NPB j / (i + 1)) of
    keys j <= i, then bin NPB for j > i. The buckets and bins are exact integer comparisons
    (no log of a float), one masked row sum per bucket the block can touch: the block's
    distances lie in [d_lo, d_hi] and its bins in [b_lo, b_hi], a few of each (one or two far
    from the diagonal)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
    s, kv, n_in = key_block_scores(q, K_ptr, Valid_ptr, offs_n, offs_d, stride_kl, stride_kd, stride_ml,
                                   sm_scale, L, D, FMIN, IS_FP32)  # (BLOCK_M, BLOCK_N)
    if MASKED:
        seen = (offs_n[None, :] >= lo_m[:, None]) & (offs_n[None, :] <= hi_m[:, None])  # (BLOCK_M, BLOCK_N)
        s = tl.where(seen | (offs_n >= L)[None, :], s, FMIN)  # past the row end stays -inf
    # -- update m_i; e = exp(s - m_new); rescale factor alpha
    m_blk = tl.max(s, 1)  # (BLOCK_M,)
    m_new = tl.maximum(m_i, m_blk)
    alpha = tl.exp(m_i - m_new)  # 0 on the first block (m_i = -inf)
    e = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N); 0 past the row end
    if ARGMAX:
        # -- first key with the block's max; a later block wins with a strictly larger score, or, when
        # blocks come in any order, with an equal one at a lower index
        arg_blk = tl.min(tl.where(s == m_blk[:, None], offs_n[None, :], 2147483647), 1)  # (BLOCK_M,)
        if ANY_ORDER:
            take = (m_blk > m_i) | ((m_blk == m_i) & (arg_blk < arg_i))
        else:
            take = m_blk > m_i
        arg_i = tl.where(take, arg_blk, arg_i)
    if ENTROPY:
        # -- t = sum_j e_j (s_j - m); guard 0 * -inf past the row end
        ds = tl.where(n_in[None, :], s - m_new[:, None], 0.0)  # (BLOCK_M, BLOCK_N)
        # move the old t from m_i to m_new; when the old terms vanish (alpha = 0: the first block, or
        # a row that saw only filled keys so far, m_i = FMIN) the shift would be -inf * 0
        shift = tl.where(alpha > 0, (m_i - m_new) * l_i, 0.0)
        t_i = alpha * (t_i + shift) + tl.sum(e * ds, 1)
    l_i = l_i * alpha + tl.sum(e, 1)
    m_i = m_new
    if SINGLE_TILE:
        p = e * (1.0 / l_i)[:, None]  # exact softmax: the whole row is in this tile
    else:
        p = e
    # -- class mass and P V, both rescaled to the new max first
    cls = tl.load(Class_ptr + offs_n * stride_cl, mask=n_in, other=-1)  # (BLOCK_N,); -1: no class
    v = tl.load(V_ptr + offs_n[:, None] * stride_vl + offs_d[None, :] * stride_vd,
                mask=n_in[:, None] & (offs_d < D)[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
    cls_i = cls_i * alpha[:, None]
    acc = acc * alpha[:, None]
    cidx = tl.arange(0, C_PAD)  # (C_PAD,)
    if IS_FP32:
        pv = p  # (BLOCK_M, BLOCK_N) fp32
    else:
        # P in the input dtype, as FlashAttention's P V takes it; every p_j >= 0, so a class
        # sum keeps the relative rounding of its terms (2^-12 fp16, 2^-9 bf16): no more than
        # storing the class mass in that dtype costs
        pv = p.to(v.dtype)
    if CLASS_DOT:
        # one dot with the block's one-hot classes; fp32 stays exact ("ieee": tf32 would
        # keep 10 bits of p), half runs on tensor cores with fp32 accumulation
        # (built through fp32: Triton's interpreter casts a bool to bf16 as raw bits)
        onehot = tl.where(cls[:, None] == cidx[None, :], 1.0, 0.0).to(pv.dtype)  # (BLOCK_N, C_PAD)
        if IS_FP32:
            cls_i = tl.dot(pv, onehot, cls_i, input_precision="ieee")  # (BLOCK_M, C_PAD)
        else:
            cls_i = tl.dot(pv, onehot, cls_i)
    else:
        # one masked pass over the block per class, in fp32
        for c in range(0, n_classes):
            mass = tl.sum(tl.where(cls[None, :] == c, p, 0.0), 1)  # (BLOCK_M,)
            cls_i = tl.where(cidx[None, :] == c, cls_i + mass[:, None], cls_i)  # (BLOCK_M, C_PAD)
    if IS_FP32:
        acc = tl.dot(pv, v, acc, input_precision="ieee")  # (BLOCK_M, BLOCK_D)
    else:
        acc = tl.dot(pv, v, acc)
    # -- position-dependent sums, in fp32 from p: the block's rows are at pos, its keys at offs_n
    if DISTANCE_MASS or MEAN_DISTANCE:
        dist = tl.abs(pos[:, None] - offs_n[None, :])  # (BLOCK_M, BLOCK_N) |i - j|
    if MEAN_DISTANCE:
        dsum_i = dsum_i * alpha + tl.sum(p * dist.to(tl.float32), 1)
    if DISTANCE_MASS:
        # the block's distances lie in [d_lo, d_hi]: their buckets, one masked row sum each
        i_lo = tl.min(pos, 0)
        i_hi = tl.max(pos, 0)
        d_lo = tl.maximum(tl.maximum(start_n - i_hi, i_lo - (start_n + BLOCK_N - 1)), 0)
        d_hi = tl.maximum(i_hi - start_n, start_n + BLOCK_N - 1 - i_lo)
        didx = tl.arange(0, DB_PAD)  # (DB_PAD,)
        dist_i = dist_i * alpha[:, None]
        for b in range(_distance_bucket(d_lo), _distance_bucket(d_hi) + 1):
            lo, hi = _bucket_edges(b)
            mass = tl.sum(tl.where((dist >= lo) & (dist < hi), p, 0.0), 1)  # (BLOCK_M,)
            dist_i = tl.where(didx[None, :] == b, dist_i + mass[:, None], dist_i)  # (BLOCK_M, DB_PAD)
    if POSITION_MASS:
        # bin b < NPB holds keys with b (i + 1) <= NPB j < (b + 1)(i + 1), i.e. floor(NPB j / (i + 1)) = b
        # (so j <= i); bin NPB holds NPB j >= NPB (i + 1), i.e. j > i
        i_lo = tl.min(pos, 0)
        i_hi = tl.max(pos, 0)
        j_lo = tl.min(offs_n, 0)  # (tensors first: the interpreter keeps constexpr * int a constexpr)
        j_hi = tl.max(offs_n, 0)
        b_lo = tl.minimum((j_lo * NPB) // (i_hi + 1), NPB)
        b_hi = tl.where(j_hi > i_lo, NPB, (j_hi * NPB) // (i_lo + 1))
        tj = offs_n * NPB  # (BLOCK_N,)
        pidx = tl.arange(0, PB_PAD)  # (PB_PAD,)
        pmass_i = pmass_i * alpha[:, None]
        for b in range(b_lo, b_hi + 1):
            edge = b * (pos + 1)  # (BLOCK_M,) the bin's first scaled key position
            hi = tl.where(b == NPB, OPEN_END, edge + pos + 1)
            inside = (tj[None, :] >= edge[:, None]) & (tj[None, :] < hi[:, None])  # (BLOCK_M, BLOCK_N)
            mass = tl.sum(tl.where(inside, p, 0.0), 1)  # (BLOCK_M,)
            pmass_i = tl.where(pidx[None, :] == b, pmass_i + mass[:, None], pmass_i)  # (BLOCK_M, PB_PAD)
    return acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i


@triton.jit
def _distance_bucket(d):
    """The log2 bucket of a distance d >= 0: the number of spec.DISTANCE_EDGES (1, 2, 4, ...,
    2^(DB - 2)) that are <= d, by comparisons."""
    b = (d >= 1).to(tl.int32)
    for e in tl.static_range(1, DB - 1):
        b += (d >= (1 << e)).to(tl.int32)
    return b


@triton.jit
def _bucket_edges(b):
    """(lo, hi): distance bucket b holds lo <= d < hi; lo = 2^b / 2 (0 for b = 0), hi = 2^b, open
    for the last bucket (2^(DB - 2) and beyond)."""
    return (1 << b) >> 1, tl.where(b == DB - 1, OPEN_END, 1 << b)


@triton.jit
def _attn_stats_fwd(
    Q, K, V, KeyValid, KeyClass, GateXi, GateUniform, Offsets,  #
    Out, Lse, Entropy, OffsetMass, ClassMass, Argmax, DistanceMass, MeanDistance, PositionMass,  #
    sm_scale,  #
    stride_qb, stride_qh, stride_ql, stride_qd,  #
    stride_kb, stride_kh, stride_kl, stride_kd,  #
    stride_vb, stride_vh, stride_vl, stride_vd,  #
    stride_ob, stride_oh, stride_ol, stride_od,  #
    stride_mb, stride_ml, stride_cb, stride_cl,  #
    H, L, D, n_offsets, n_classes, G, win_left, win_right,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, C_PAD: tl.constexpr,  #
    ENTROPY: tl.constexpr, ARGMAX: tl.constexpr, DISTANCE_MASS: tl.constexpr, MEAN_DISTANCE: tl.constexpr,  #
    POSITION_MASS: tl.constexpr,  #
    BANDED: tl.constexpr, SINGLE_TILE: tl.constexpr, IS_FP32: tl.constexpr, CLASS_DOT: tl.constexpr,  #
    UNIFORM: tl.constexpr,
):
    """One program: BLOCK_M stacked query rows of the G query heads that share one key/value
    head, f = i * G + g (position i, head g of the group), against that head's keys.
    BANDED (causal or windowed layouts): only the key blocks that meet the rows' band
    [i - win_left, i + win_right] are visited, its edges masked; off, every key block is
    visited in order without a mask (the plain layout only: G = 1, which Triton's launcher
    specialises, so the stacking folds away). SINGLE_TILE: one key block holds the whole row
    (plain layout, short rows)."""
    start_m = tl.program_id(0)
    off_bkv = tl.program_id(1)  # b * H_kv + key/value head
    H_kv = H // G
    off_b = (off_bkv // H_kv).to(tl.int64)
    off_kv = (off_bkv % H_kv).to(tl.int64)
    K_ptr = K + off_b * stride_kb + off_kv * stride_kh
    V_ptr = V + off_b * stride_vb + off_kv * stride_vh
    Valid_ptr = KeyValid + off_b * stride_mb
    Class_ptr = KeyClass + off_b * stride_cb
    offs_f = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) stacked rows
    f_in = offs_f < L * G
    pos = offs_f // G  # (BLOCK_M,) query positions
    g = offs_f % G  # (BLOCK_M,) query head within the group
    # int64 scalar bases + int32 row offsets (int64 vectors would be kept in registers through the loop)
    bh0 = off_b * H + off_kv * G  # (b, first query head of the group) in the (B, H) flat index
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    d_in = offs_d < D
    q = tl.load(Q + off_b * stride_qb + (off_kv * G) * stride_qh + (g * stride_qh + pos * stride_ql)[:, None]
                + offs_d[None, :] * stride_qd, mask=f_in[:, None] & d_in[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    lo_m = pos - win_left  # (BLOCK_M,) each row's band, inclusive (BANDED only)
    hi_m = pos + win_right
    # -- running state
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    t_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    arg_i = tl.zeros([BLOCK_M], dtype=tl.int32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    cls_i = tl.zeros([BLOCK_M, C_PAD], dtype=tl.float32)
    dist_i = tl.zeros([BLOCK_M, DB_PAD], dtype=tl.float32)  # carried only when the switches are on
    dsum_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    pmass_i = tl.zeros([BLOCK_M, PB_PAD], dtype=tl.float32)
    if BANDED:
        # -- the tile's key range, and its blocks inside every row's band (no mask needed there)
        first = (start_m * BLOCK_M) // G
        last = tl.minimum((start_m * BLOCK_M + BLOCK_M - 1) // G, L - 1)
        start_lo = (tl.maximum(first - win_left, 0) // BLOCK_N) * BLOCK_N
        end = tl.cdiv(tl.minimum(last + win_right + 1, L), BLOCK_N) * BLOCK_N
        full_lo = tl.maximum(tl.cdiv(tl.maximum(last - win_left, 0), BLOCK_N) * BLOCK_N, start_lo)
        full_hi = tl.maximum(tl.minimum(((first + win_right + 1) // BLOCK_N) * BLOCK_N, end), full_lo)
        for start_n in range(full_lo, full_hi, BLOCK_N):  # inside every row's band
            acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i = _key_block(
                acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i,  #
                q, pos, start_n, lo_m, hi_m, K_ptr, V_ptr, Valid_ptr, Class_ptr,  #
                stride_kl, stride_kd, stride_vl, stride_vd, stride_ml, stride_cl,  #
                sm_scale, L, D, n_classes, offs_d, FMIN,  #
                BLOCK_N, C_PAD, False, True, False, ENTROPY, ARGMAX, IS_FP32, CLASS_DOT,  #
                DISTANCE_MASS, MEAN_DISTANCE, POSITION_MASS)
        n_left = (full_lo - start_lo) // BLOCK_N
        for blk in range(0, n_left + (end - full_hi) // BLOCK_N):  # the band's edges: left, then right
            start_n = tl.where(blk < n_left, start_lo + blk * BLOCK_N, full_hi + (blk - n_left) * BLOCK_N)
            acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i = _key_block(
                acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i,  #
                q, pos, start_n, lo_m, hi_m, K_ptr, V_ptr, Valid_ptr, Class_ptr,  #
                stride_kl, stride_kd, stride_vl, stride_vd, stride_ml, stride_cl,  #
                sm_scale, L, D, n_classes, offs_d, FMIN,  #
                BLOCK_N, C_PAD, True, True, False, ENTROPY, ARGMAX, IS_FP32, CLASS_DOT,  #
                DISTANCE_MASS, MEAN_DISTANCE, POSITION_MASS)
    else:
        start_lo = 0
        if SINGLE_TILE:
            end = BLOCK_N
        else:
            end = L
        for start_n in range(0, end, BLOCK_N):  # every key, in order
            acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i = _key_block(
                acc, l_i, m_i, t_i, arg_i, cls_i, dist_i, dsum_i, pmass_i,  #
                q, pos, start_n, lo_m, hi_m, K_ptr, V_ptr, Valid_ptr, Class_ptr,  #
                stride_kl, stride_kd, stride_vl, stride_vd, stride_ml, stride_cl,  #
                sm_scale, L, D, n_classes, offs_d, FMIN,  #
                BLOCK_N, C_PAD, False, False, SINGLE_TILE, ENTROPY, ARGMAX, IS_FP32, CLASS_DOT,  #
                DISTANCE_MASS, MEAN_DISTANCE, POSITION_MASS)
    # -- epilogue: normalise (the online path), row statistics
    if not SINGLE_TILE:
        acc = acc / l_i[:, None]
        cls_i = cls_i / l_i[:, None]
        if DISTANCE_MASS:
            dist_i = dist_i / l_i[:, None]
        if MEAN_DISTANCE:
            dsum_i = dsum_i / l_i
        if POSITION_MASS:
            pmass_i = pmass_i / l_i[:, None]
    row = g * L + pos  # (BLOCK_M,) rows of the (B, H, L, ...) statistics, from the group's first
    Lse += bh0 * L
    tl.store(Lse + row, m_i + tl.log(l_i), mask=f_in)
    if ENTROPY:
        tl.store(Entropy + bh0 * L + row, tl.log(l_i) - t_i / l_i, mask=f_in)
    if ARGMAX:
        tl.store(Argmax + bh0 * L + row, arg_i.to(tl.int64), mask=f_in)
    cidx = tl.arange(0, C_PAD)  # (C_PAD,)
    tl.store(ClassMass + bh0 * L * n_classes + row[:, None] * n_classes + cidx[None, :], cls_i,
             mask=f_in[:, None] & (cidx[None, :] < n_classes))
    if DISTANCE_MASS:
        didx = tl.arange(0, DB_PAD)  # (DB_PAD,)
        tl.store(DistanceMass + bh0 * L * DB + row[:, None] * DB + didx[None, :], dist_i,
                 mask=f_in[:, None] & (didx[None, :] < DB))
    if MEAN_DISTANCE:
        tl.store(MeanDistance + bh0 * L + row, dsum_i, mask=f_in)
    if POSITION_MASS:
        pidx = tl.arange(0, PB_PAD)  # (PB_PAD,)
        tl.store(PositionMass + bh0 * L * (NPB + 1) + row[:, None] * (NPB + 1) + pidx[None, :], pmass_i,
                 mask=f_in[:, None] & (pidx[None, :] <= NPB))
    # -- offset mass: p_{i, i+o} = exp(s_{i, i+o} - m_i) / l_i from a shifted K tile, 0 outside the row's band
    qf = q.to(tl.float32)
    for o in range(0, n_offsets):
        off = tl.load(Offsets + o)
        kr = pos + off  # (BLOCK_M,)
        inside = (kr >= 0) & (kr < L)
        if BANDED:
            inside = inside & (kr >= lo_m) & (kr <= hi_m)
        k_o = tl.load(K_ptr + kr[:, None] * stride_kl + offs_d[None, :] * stride_kd,
                      mask=inside[:, None] & d_in[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
        s_o = tl.sum(qf * k_o.to(tl.float32), 1) * sm_scale  # (BLOCK_M,)
        kv_o = tl.load(Valid_ptr + kr * stride_ml, mask=inside, other=0) != 0
        s_o = tl.where(kv_o, s_o, FMIN)
        p_o = tl.where(inside, tl.exp(s_o - m_i) / l_i, 0.0)
        tl.store(OffsetMass + bh0 * L * n_offsets + row * n_offsets + o, p_o, mask=f_in)
    # -- head gates: xi per row's head; a uniform head's rows get the mean of V over the valid keys they see
    xi = tl.load(GateXi + bh0 + g, mask=f_in, other=1.0)  # (BLOCK_M,)
    O_ptrs = (Out + off_b * stride_ob + (off_kv * G) * stride_oh + (g * stride_oh + pos * stride_ol)[:, None]
              + offs_d[None, :] * stride_od)  # (BLOCK_M, BLOCK_D)
    if not UNIFORM:  # no uniform gate in this call (compiled apart: the common case carries no second pass)
        tl.store(O_ptrs, (acc * xi[:, None]).to(Out.dtype.element_ty), mask=f_in[:, None] & d_in[None, :])
    else:
        uniform = tl.load(GateUniform + bh0 + g, mask=f_in, other=0)  # (BLOCK_M,) int8
        tl.store(O_ptrs, (acc * xi[:, None]).to(Out.dtype.element_ty),
                 mask=f_in[:, None] & d_in[None, :] & (uniform == 0)[:, None])
        if tl.max(uniform.to(tl.int32), 0) > 0:  # a second pass over the keys, only for tiles with a uniform row
            u = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
            n_vis = tl.zeros([BLOCK_M], dtype=tl.float32)
            for start_n in range(start_lo, end, BLOCK_N):  # the keys the tile's rows see
                offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
                n_in = offs_n < L
                kv = tl.load(Valid_ptr + offs_n * stride_ml, mask=n_in, other=0) != 0  # (BLOCK_N,)
                seen = (kv & n_in)[None, :] & (pos >= 0)[:, None]  # (BLOCK_M, BLOCK_N)
                if BANDED:
                    seen = seen & (offs_n[None, :] >= lo_m[:, None]) & (offs_n[None, :] <= hi_m[:, None])
                w = tl.where(seen, 1.0, 0.0)  # (BLOCK_M, BLOCK_N)
                v = tl.load(V_ptr + offs_n[:, None] * stride_vl + offs_d[None, :] * stride_vd,
                            mask=n_in[:, None] & d_in[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
                if IS_FP32:
                    u = tl.dot(w, v, u, input_precision="ieee")
                else:
                    u = tl.dot(w.to(v.dtype), v, u)  # 0 / 1 are exact in any dtype; fp32 accumulation
                n_vis += tl.sum(w, 1)
            u = u / tl.maximum(n_vis, 1.0)[:, None] * xi[:, None]  # a row that sees no key: 0
            tl.store(O_ptrs, u.to(Out.dtype.element_ty), mask=f_in[:, None] & d_in[None, :] & (uniform != 0)[:, None])


# True when this module was imported under TRITON_INTERPRET=1 (the kernel runs on CPU tensors)
INTERPRETED = not isinstance(_attn_stats_fwd, triton.runtime.jit.JITFunction)


def kernel_config(L: int, D: int, dtype=torch.float32, single_tile: bool | None = None,
                  uniform: bool = False, positions: bool = False) -> dict:
    """Code path, block sizes, warps and stages for rows of length L, head dimension D.

    The shipped configurations are those `triton_aot` compiles for sm_80 and sm_90 with no
    register spill with Triton 3.6 and 3.7 (ptxas -v, D = 32 and 64, 4 to 32 key classes;
    the tables are in bench/results_triton.md). bf16 takes fp16's (same tile shapes and
    tensor-core dots, fp32 accumulation):
        fp16  single-tile for L <= 128: BLOCK_M 32 x BLOCK_N 128, 8 warps
              online:                   64 x 32, 8 warps, 2 stages
        fp32  single-tile for L <= 32:  16 x 32, 4 warps
              online:                   32 x 32, 8 warps, 2 stages
    fp32 dots are exact ("ieee"): FMA loops instead of tensor cores, which need far more
    registers, so fp32 tiles are small and fp32 rows longer than 32 take the online path
    (a 32 x 64 single tile already spills, and 4 warps on 32 x 32 online blocks spill at
    D = 64 on sm_80). Half-precision online blocks of 64 x 64 spill on sm_80 with the class
    dot (255 registers); 64 x 32 hold about 180. single_tile=True/False forces a path (the tests
    run both on the same inputs); a forced single tile longer than the shipped one is for
    the interpreter and is not register-checked.

    Register cap: fp32 online blocks at D <= 32 and half-precision single tiles at D = 64
    launch with `maxnreg` = 128 (MAXNREG_PLAIN), unless the call has uniform head gates
    (`uniform`: the epilogue's second pass needs ~185 registers). Left to itself, ptxas picked
    a higher occupancy step on sm_80 for some of them (64 or 80 registers) and spilled 4 bytes,
    since the plain and layout kernels became one; with the cap none spills, in 96-128
    registers (two or more CTAs of 8 warps per SM). Elsewhere a cap does harm: a 128 cap spills
    the D = 32 single tiles (150-205 registers), a 255 cap makes ptxas take all 255 for fp32
    online blocks at D = 64 and spill on sm_90. The cap is a launch option, in the dict only
    where it applies.

    positions: the call asks for a statistic of POSITION_STATS, whose accumulators (BLOCK_M x 32
    and x 16 fp32) and bucket loops need more registers (Triton 3.7, ptxas -v): no cap (capped at
    128, the fp16 single tile at D = 64 spilled 4 / 40 bytes on sm_80 / sm_90, the fp32 online
    block at D = 32 20 / 24; uncapped they take 179 and 166-170 registers, no spill), and fp32
    rows take the online path (the fp32 single tile at D = 64 already takes 255 registers and
    spilled 20 bytes on sm_90; the online block at D = 64 takes 249-251, no spill).
    """
    fp16 = dtype in HALF_DTYPES  # fp16 or bf16
    max_single = SINGLE_TILE_MAX_L if fp16 else SINGLE_TILE_MAX_L_FP32
    if single_tile is None:
        single_tile = L <= max_single and (fp16 or not positions)
    block_d = max(16, triton.next_power_of_2(D))
    if single_tile:
        block_n = max(max_single, triton.next_power_of_2(L))
        block_m = 32 if fp16 and block_n <= 128 else 16
        num_warps, num_stages = (8 if fp16 else 4), 1
        capped = fp16 and block_d == 64
    elif fp16:
        block_m, block_n, num_warps, num_stages = 64, 32, 8, 2
        capped = False
    else:
        block_m, block_n, num_warps, num_stages = 32, 32, 8, 2
        capped = block_d <= 32
    cfg = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, SINGLE_TILE=single_tile, num_warps=num_warps,
               num_stages=num_stages)
    if capped and not uniform and not positions:
        cfg["maxnreg"] = MAXNREG_PLAIN
    return cfg


def c_pad(n_classes: int, class_dot: bool = True) -> int:
    """The class accumulator's width: a power of two >= n_classes, and >= 16 for the one-hot
    dot (tl.dot's smallest N)."""
    return max(16 if class_dot else 2, triton.next_power_of_2(n_classes))


def fused_attention(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None, single_tile=None,
                    stats_dtype=None, class_dot=True):
    """One launch for the plain (encoder) layout: attention output, row statistics and row log-sum-exp.

    q, k, v:    (B, H, L, D) fp32, fp16 or bf16, any strides (read in place)
    key_valid:  (B, L) bool, False for padding keys
    key_class:  (B, L) integer class ids in [0, spec.n_key_classes)
    gates:      `LayerGates` (xi and uniform (H,) or (B, H): float, bool), or None
    single_tile: force the single-tile (True) or online (False) path; None picks by L
    stats_dtype: dtype of entropy / offset_mass / class_mass (default: the input dtype)
    class_dot:  class masses by one one-hot dot per key block (True), or C masked passes
    Returns (out (B, L, H, D) contiguous in the input dtype, dict of the statistics the
    kernel writes (`kernel_outputs`) that the spec asks for: "entropy" (B, H, L),
    "offset_mass" (B, H, L, O), "class_mass" (B, H, L, C), "argmax" (B, H, L) int64,
    "distance_mass" (B, H, L, DB), "mean_distance" (B, H, L), "position_mass" (B, H, L, PB),
    lse (B, H, L) fp32). The class masses are computed whether asked for or not (no switch).
    Statistics of padding-query rows are left as computed (finite); out of a gated head
    is gated, statistics never are.
    """
    _check_dtypes(q, k, v)
    B, H, L, D = q.shape
    uniform = gates is not None and gates.uniform is not None
    positions = any(STAT[name].asked(spec) for name in POSITION_STATS)
    return _launch(q, k, v, key_valid, key_class, spec, PLAIN,
                   kernel_config(L, D, q.dtype, single_tile, uniform, positions), gates, scale, stats_dtype, class_dot)


def fused_attention_layout(q, k, v, key_valid, key_class, spec: StatsSpec, layout: AttentionLayout, gates=None,
                           scale=None, stats_dtype=None, blocks: dict | None = None):
    """`fused_attention` for any `AttentionLayout`, with `layout_kernel_config`'s blocks: causal
    and windowed bands (key blocks outside every row's band are never visited, blocks inside
    it run without a mask), and grouped-query attention (one program per (query block, batch,
    key/value head) whose BLOCK_M rows stack the G query heads that share the head: each K / V
    tile is loaded once for all of them). The same kernel as the plain layout's, other switches.

    q: (B, H, L, D); k, v: (B, H_kv, L, D), H_kv = layout.n_key_value_heads or H; any strides.
    blocks: override `layout_kernel_config` (BLOCK_M / BLOCK_N / num_warps ..., for tests).
    Returns (out (B, L, H, D), statistics dict, lse (B, H, L) fp32) as `fused_attention`; the
    lse of a row that sees no key (a padding query under left padding) is finite.
    """
    _check_dtypes(q, k, v)
    B, H, L, D = q.shape
    cfg = {**layout_kernel_config(L, D, q.dtype), "SINGLE_TILE": False, **(blocks or {})}
    return _launch(q, k, v, key_valid, key_class, spec, layout, cfg, gates, scale, stats_dtype)


def _check_dtypes(q, k, v):
    if q.dtype not in DTYPES:
        raise TypeError(f"the triton backend takes float32, float16 or bfloat16 inputs, not {q.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError("q, k and v must have the same dtype")


def _launch(q, k, v, key_valid, key_class, spec: StatsSpec, layout: AttentionLayout, cfg: dict, gates, scale,
            stats_dtype, class_dot=True):
    """The one launch of `_attn_stats_fwd` behind both entry points: its outputs and switches
    from the table (`kernel_outputs`, `allocate_outputs`), its layout switches from `layout`
    (`triton_maps.band_args`: G, the band, BANDED) and its blocks from `cfg`."""
    B, H, L, D = q.shape
    G = layout.group_size(H)
    if k.shape != (B, H // G, L, D) or v.shape != k.shape:
        raise ValueError(f"k and v must be (B, H_kv, L, D) = {(B, H // G, L, D)}; got {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    band = triton_maps.band_args(layout, H, L)  # G, win_left, win_right (L: no limit), BANDED
    if band["BANDED"] and cfg["SINGLE_TILE"]:
        raise ValueError("the single-tile path is for the plain layout only")
    scale = D**-0.5 if scale is None else float(scale)
    dev = q.device
    C, O = spec.n_key_classes, len(spec.offsets)
    stats_dtype = q.dtype if stats_dtype is None else stats_dtype
    valid = (key_valid.to(device=dev).view(torch.int8) if key_valid.dtype == torch.bool
             else key_valid.to(dev, torch.int8))
    classes = key_class.to(device=dev, dtype=torch.int32)  # (B, L), a small copy
    xi, uniform = gate_operands(gates, B, H, dev)
    offsets = torch.tensor(spec.offsets if O else [0], dtype=torch.int32, device=dev)
    out = torch.empty(B, L, H, D, dtype=q.dtype, device=dev)  # written as (B, H, L, D) through strides
    lse = torch.empty(B, H, L, dtype=torch.float32, device=dev)
    # -- one output per statistic of the table the kernel writes (`kernel_outputs`)
    outputs, flags = allocate_outputs(spec, {"B": B, "H": H, "L": L, "O": O, "C": C}, lse, stats_dtype)
    stats = {stat.name: outputs[arg] for stat, arg, _ in kernel_outputs() if stat.asked(spec)}
    if out.numel() == 0:
        return out, stats, lse
    grid = (triton.cdiv(L * G, cfg["BLOCK_M"]), B * (H // G))
    _attn_stats_fwd[grid](
        q, k, v, valid, classes, xi, uniform, offsets, out, lse,  #
        **outputs, sm_scale=scale,  #
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_ql=q.stride(2), stride_qd=q.stride(3),  #
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_kl=k.stride(2), stride_kd=k.stride(3),  #
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vl=v.stride(2), stride_vd=v.stride(3),  #
        stride_ob=out.stride(0), stride_oh=out.stride(2), stride_ol=out.stride(1), stride_od=out.stride(3),  #
        stride_mb=valid.stride(0), stride_ml=valid.stride(1), stride_cb=classes.stride(0),
        stride_cl=classes.stride(1),  #
        H=H, L=L, D=D, n_offsets=O, n_classes=C, G=G, win_left=band["win_left"], win_right=band["win_right"],  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], C_PAD=c_pad(C, class_dot),  #
        **flags, BANDED=band["BANDED"], SINGLE_TILE=cfg["SINGLE_TILE"], IS_FP32=q.dtype == torch.float32,
        CLASS_DOT=class_dot, UNIFORM=gates is not None and gates.uniform is not None,  #
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_caps(cfg),
    )
    return out, stats, lse


def output_argument(stat) -> str:
    """The kernel's pointer argument of a statistic of the table: its name in CamelCase
    (entropy -> Entropy, offset_mass -> OffsetMass); its switch, when it has one, is the name in
    capitals (ENTROPY)."""
    return "".join(w.capitalize() for w in stat.name.split("_"))


@functools.cache
def kernel_outputs() -> tuple:
    """(RowStat, pointer argument, constexpr switch or None) for each statistic of the table
    the fused kernel writes itself: those with a pointer argument named after them
    (`output_argument`); the switch, when the kernel has one, is the name in capitals. The
    launcher, `allocate_outputs`, the statistics check (`check_computed`) and `triton_aot` all
    read this, so a statistic added to the kernel needs no plumbing elsewhere.

    A pointer argument the kernel's body never uses (an output declared and forgotten) is a
    NotImplementedError here, compiled or interpreted, before any launch: its tensor would
    come back as whatever memory it was given."""
    params = _attn_stats_fwd.arg_names
    found = []
    for stat in ROW_STATS:
        arg = output_argument(stat)
        if arg in params:
            found.append((stat, arg, stat.name.upper() if stat.name.upper() in params else None))
    used = _names_used(_attn_stats_fwd)
    unused = [f"{stat.name} ({arg})" for stat, arg, _ in found if arg not in used]
    if unused:
        raise NotImplementedError(f"the triton kernel _attn_stats_fwd takes {', '.join(unused)} but never writes it "
                                  "(see docs/contributing.md)")
    return tuple(found)


def _names_used(kernel) -> set[str]:
    """The names the body of a @triton.jit kernel reads (its source, compiled or interpreted)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn)))
    body = tree.body[0].body
    return {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def check_computed(spec: StatsSpec):
    """A NotImplementedError naming every statistic `spec` asks for that neither the fused kernel
    (`kernel_outputs`) nor `_extras` computes: raised before a launch, so a statistic added to
    the table but not to the kernel never comes back as garbage (compiled or interpreted)."""
    done = {stat.name for stat, _, _ in kernel_outputs()} | set(EXTRA_STATS)
    missing = [stat.name for stat in asked_stats(spec) if stat.name not in done]
    if missing:
        raise NotImplementedError(f"the triton backend does not compute {', '.join(missing)} "
                                  "(see docs/contributing.md); use another --backend")


def allocate_outputs(spec: StatsSpec, dims: dict, lse, stats_dtype) -> tuple[dict, dict]:
    """The kernel's output tensors, one per statistic of `kernel_outputs` (shapes from `dims` and
    the table's fixed widths, `spec.FIXED_WIDTHS`), and its constexpr switches; a statistic the
    spec does not ask for gets `lse` as a placeholder pointer the kernel never writes. Under the
    interpreter the outputs start as NaN (-2 for an index), so a value the kernel skips fails
    every comparison with eager instead of passing as stale memory; compiled, they are left
    uninitialised (no extra pass over them)."""
    outputs, flags = {}, {}
    dims = {**FIXED_WIDTHS, **dims}  # the table's fixed widths (distance buckets, position bins)
    for stat, arg, flag in kernel_outputs():
        on = stat.asked(spec)
        if flag is not None:
            flags[flag] = on
        if flag is not None and not on:
            outputs[arg] = lse
            continue
        unknown = [d for d in stat.shape if d not in dims]
        if unknown:
            raise NotImplementedError(f"{stat.name} has dimension {', '.join(unknown)}, which the triton launcher "
                                      f"does not size (it knows {', '.join(dims)}: add it in `_launch`)")
        shape, dtype = [dims[d] for d in stat.shape], torch.int64 if stat.dtype == "int64" else stats_dtype
        if INTERPRETED:
            outputs[arg] = torch.full(shape, -2 if stat.dtype == "int64" else float("nan"), device=lse.device,
                                      dtype=dtype)
        else:
            outputs[arg] = torch.empty(shape, device=lse.device, dtype=dtype)
    return outputs, flags


def gate_operands(gates, B, H, dev):
    """The kernel's gate operands: xi (B, H) fp32, one per map (a per-head xi repeated: no
    batch stride in the kernel, which keeps it under the register budget), and uniform (B, H)
    int8 the same way; fresh (so 16-byte aligned, as the AOT specialisations assume)."""
    xi = torch.ones(B, H, dtype=torch.float32, device=dev)
    uniform = torch.zeros(B, H, dtype=torch.int8, device=dev)
    if gates is not None and gates.xi is not None:
        xi.copy_(gates.xi.detach().expand(B, H))
    if gates is not None and gates.uniform is not None:
        uniform.copy_(gates.uniform.expand(B, H))
    return xi, uniform


def layout_kernel_config(L: int, D: int, dtype=torch.float32) -> dict:
    """Block sizes, warps and stages of the layout path (`_attn_stats_fwd`, BANDED on): always the
    online path (decoder rows are long; causal rows see different numbers of keys). BLOCK_M
    counts stacked query rows (G heads x BLOCK_M / G positions). The sizes `triton_aot`
    compiles for sm_80 and sm_90 with no register spill (Triton 3.6 and 3.7; D = 32 to 256,
    4 to 32 key classes; bench/results_triton_layout.md); half precision 8 warps, 2 stages:
        fp16 / bf16  64 x 32 keys for D <= 64, 32 x 32 above (64 rows spill at D = 256, and
                     at D = 128 on sm_80 with Triton 3.6)
        fp32         16 x 16 (256 scores, one per thread at 8 warps), 1 stage, at most 128
                     registers per thread (`maxnreg`); 8 warps (80-128 registers: at least 2
                     CTAs, 16 warps, per SM), 16 at D = 256 (104-124: one CTA of 16 warps),
                     where 8 warps need 118-156 registers (one CTA of 8 warps) and spill
                     12-16 bytes at a cap of 128.
    fp32 without the cap spilled 4-32 bytes in 6 (Triton 3.7) or 7 (3.6) of the 48 fp32
    specialisations at only 64, 80 or 128 registers: ptxas's own choice of a higher occupancy
    step (an explicit `.maxnreg` switches that heuristic off). No tile or warp count avoids it
    everywhere: 4 warps, 32 x 16 and 16 x 32 tiles spill in other specialisations. The cap
    is a launch option, in the dict only where it applies (the half-precision launches are
    unchanged).
    """
    block_d = max(16, triton.next_power_of_2(D))
    if dtype in HALF_DTYPES:
        return dict(BLOCK_M=64 if block_d <= 64 else 32, BLOCK_N=32, BLOCK_D=block_d, num_warps=8, num_stages=2)
    return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_D=block_d, num_warps=8 if block_d <= 128 else 16, num_stages=1,
                maxnreg=128)


def attention_stats_triton(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None,
                           pooling: WordPooling | None = None, layout: AttentionLayout = PLAIN, single_tile=None):
    """Same contract as `attention_stats_eager`: (out (B, L, H, D), RowStats), padding-query
    rows of every row statistic zeroed. Statistics are those of the un-gated attention.
    One kernel for every layout: the plain (encoder) one through `fused_attention` (its
    blocks and single-tile path, `kernel_config`), any other (causal, windowed, grouped-query)
    through `fused_attention_layout` (`layout_kernel_config`; single_tile does not apply there).

    The fused kernel gives the row statistics; what it does not compute (column mass, word
    maps, kept q/k) is added by `_extras` from the kernel's row lse. A statistic of the table
    that neither computes is a NotImplementedError before the launch (`check_computed`).
    """
    check_computed(spec)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if layout.is_plain:
        out, rows, lse = fused_attention(q, k, v, key_valid, key_class, spec, gates=gates, scale=scale,
                                         single_tile=single_tile)
    else:
        out, rows, lse = fused_attention_layout(q, k, v, key_valid, key_class, spec, layout, gates=gates,
                                                scale=scale)
    stats = RowStats(**rows, layout=layout)
    _extras(spec, stats, q, k, key_valid, lse, scale, pooling, layout)
    return out, finish_stats(stats, spec, key_valid, "triton")


def _column_mass(stats: RowStats, q, k, key_valid, lse, scale, pooling, layout):
    stats.column_mass = triton_maps.column_mass_triton(q, k, key_valid, lse, scale, out_dtype=q.dtype, layout=layout)


def _word_maps(stats: RowStats, q, k, key_valid, lse, scale, pooling, layout):
    stats.word_map, stats.word_argmax = triton_maps.word_maps_triton(
        q, k, key_valid, lse, require_pooling(pooling), scale, out_dtype=q.dtype, layout=layout)


# the statistics of the table that passes of their own compute from the fused kernel's lse
# (kernels/triton_maps.py), each with its pass (one pass may give several)
EXTRA_PASSES = {"column_mass": _column_mass, "word_map": _word_maps, "word_argmax": _word_maps}
EXTRA_STATS = tuple(EXTRA_PASSES)


def _extras(spec: StatsSpec, stats: RowStats, q, k, key_valid, lse, scale, pooling, layout: AttentionLayout = PLAIN):
    """HOOK: the statistics beyond the fused kernel's, from its row lse (B, H, L) fp32.

    Each asked statistic of `EXTRA_PASSES` runs its pass (once, however many statistics it
    gives): column mass and word maps are separate Triton passes (kernels/triton_maps.py) that
    re-derive p_ij = exp(s_ij - lse_i) tile by tile; keep_qk hands q and k on as views. A
    statistic of the table that neither the kernel nor a pass here computes fails loudly before
    the launch (`check_computed`) and again in `finish_stats`, rather than coming back as a
    silently missing statistic.
    """
    done = []
    for stat in asked_stats(spec):
        run = EXTRA_PASSES.get(stat.name)
        if run is not None and run not in done:
            run(stats, q, k, key_valid, lse, scale, pooling, layout)
            done.append(run)
    keep_qk(stats, q, k, scale, spec)


__all__ = ["attention_stats_triton", "fused_attention", "fused_attention_layout", "kernel_config",
           "layout_kernel_config", "INTERPRETED", "SINGLE_TILE_MAX_L", "DTYPES"]
