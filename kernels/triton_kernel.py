"""The fused forward kernel: attention output and row statistics in one pass over K and V.

Written in the shape of Triton's fused-attention tutorial: one online-softmax loop in the exp2
domain over key blocks, an inner-loop helper (`_key_block`) with constexpr switches, few
accumulators, and stages chosen per block (masked or not, one helper `_stage` run twice), then an
epilogue. The host side (operands, outputs, launch) is `triton_launch.py`; tiles and warps per
architecture are `triton_config.py`.

Its arguments are grouped into tuples (`attn_stats_fwd`'s docstring, `ARGUMENT_TUPLES`): the
statistics' switches are one constexpr tuple `STATS` and their outputs one tuple of pointers
`Stats`, both in the table's order and read through indices taken from the table (`STATS[ENTROPY]`,
`Stats[Entropy]`); the tiles are the constexpr tuple `TILE`; the strides, shape and band are
runtime tuples, whose elements Triton specialises one by one as it did the separate arguments (a
unit stride or G = 1 a constant, a 16-divisible one a hint), so the compiled code is the same.

One program holds BLOCK_M query rows of one key/value head: the G query heads that share it
(grouped-query attention) stacked row by row, f = i * G + g (position i, head g of the group),
so each K / V tile is loaded once for all of them. It visits the key blocks the rows' band
[i - win_left, i + win_right] meets (`win_*` = L for no limit: the plain encoder layout), in
two stages:

- full blocks: inside every row's band, inside the sequence's valid keys (a contiguous run,
  `KeyRange`) and the row end. No mask, no select: the main loop, the one `triton_aot` budgets
  (its SASS warp-instructions per 1,000 scores against a plain flash loop);
- masked blocks: the band's edges, padding keys, the row end. Keys a row may not see get
  the most negative finite score FMIN (as `eager`: a row that sees no key is uniform, not
  NaN), keys past the row end -inf (no key at all).

The masked stage runs after the main loop, or before it (MASKED_FIRST, `triton_config`): then
what only the masks need dies before the main loop and holds no register through it, which is
what lets the widest tiles of some targets compile without a spill (sm_80 at D = 64: 128 x 128);
elsewhere the other order spills less. The online softmax does not care about the order of the
blocks (the argmax keeps the lowest index among equal maxima).

The statistics, by kind (each a constexpr switch read off the table `spec.ROW_STATS`, an element of
`STATS`):

- per score, in the softmax state `row = (m, l, T, arg)`: scores are z = c s, c = scale log2(e)
  (log2 e folded into the scale: one FFMA and one MUFU.EX2 per score), m the running max,
  l = sum_j 2^(z_j - m) and T = sum_j 2^(z_j - m) s_j with the raw scores s (one FFMA per score),
  both rescaled once per row and block, so that the entropy is H = ln 2 (log2 l - t / l) with
  t / l = c T / l - m: no log per key, and nothing kept beside p; arg the first key of the row's
  largest score. With SUMS_BY_DOT (`triton_config`) l and T come from the tensor cores instead, from
  the same rounded P that P V takes: l is the last column of the key-feature dot (a column of ones
  in U) and T = q . (P K), with P K a (BLOCK_M, D) accumulator beside the output's. No FADD or FFMA
  per score, no row reduction per block, and the raw scores need not stay live beside P: on sm_90
  that is what lets 128 x 128 tiles fit at D <= 64 (L_AND_T). At D = 128 the (BLOCK_M, D) accumulator
  does not fit; there l alone comes from the ones column and the entropy's sum stays per score as
  t = sum_j p_j (z_j - m), relative to the running max, rescaled with the ones column so far when the
  max moves (L_ONLY): an error d in the rounded l then moves the entropy by about d log2 n, not d |m|;
- per key feature, one tensor-core dot `feat += P @ U`: U (L, F) the keys' features, built once
  per batch by the launcher and loaded like V (today the one-hot key classes: class masses);
  any statistic that is a sum over keys of a per-key feature is a column of U;
- per position bucket, `posn = (dist, dsum, pmass)`: the mass by log2 bucket of |i - j|, the sum
  of p |i - j|, the mass by tenth of the row's context [0, i] (then "after the query"), exact
  integer buckets, one compare-and-select row sum per bucket or bin edge a block straddles (opt-in: they cost);
  with MEAN_BY_DOT (banded layouts, `triton_config.mean_by_dot`) the mean distance's sum_j p_j (i - j) is
  i l - P j from the key-feature dot (U's ones column and the key positions j = 256 hi + lo as two columns),
  and only the keys after the row, 2 sum_{j > i} p_j (j - i), are summed per score: none in the main loop;
- the norm-based twins (Kobayashi et al. 2020; switches WEIGHTED_NORM, CLASS_MASS_NORM, OFFSET_MASS_NORM): a second
  key-feature dot `feat_n += P @ (U n)`, U n (L, NORM_F) the one-hot key classes times each key's value norm
  n_j = ||f_h(x_j)|| and n_j itself, per query head of the group side by side (`triton_launch.norm_features`:
  G heads share a tile's K and V, not their W_O, so each stacked row reads its own head's columns in the
  epilogue). s = sum_j p_j n_j is the twins' denominator: class twins feat_n / s, the offsets' p_{i, i+o}
  n_{i+o} / s, weighted_norm s / l. No work per score. The twins of the position and token statistics take
  their bases' sums of p_j n_j beside those of p_j (a read of each row's head's n, one FMUL per score);
- epilogue: lse = ln 2 (m + log2 l) (the passes of `triton_maps` / `triton_js` reuse it), the
  entropy, p_{i, i+o} for each offset o from a shifted K row, and the xi head gates (xi scales a
  head's output). A uniform head's output, the mean of V over the keys each row sees, is no attention
  at all: the launcher writes it over those rows after the launch from running sums of V (O(L D),
  `triton_launch.uniform_rows`), so that no call carries a second pass over the keys, nor the
  registers it took (which cost the default statistics their widest tiles). Statistics are always
  those of the head's own, un-gated attention.

Inputs are (B, H, L, D) views in fp32, fp16 or bf16, read through their strides. Everything is
computed in fp32; a half-precision P V multiplies P cast to the input dtype, as FlashAttention
does; fp32 dots follow torch's float32 matmul precision (DOT_PRECISION "ieee" or "tf32").
Statistics are written in fp32. On a machine without a GPU the kernel runs on CPU tensors
through Triton's interpreter when TRITON_INTERPRET=1 is set before this module is imported.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import triton_config
from .spec import N_DISTANCE_BUCKETS, N_POSITION_BINS, ROW_STATS
from .triton_tiles import FMIN

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
# the position statistics' widths (spec.FIXED_WIDTHS) and their accumulators' (powers of two)
DB = tl.constexpr(N_DISTANCE_BUCKETS)  # 17 log2 buckets of |i - j|, the last one open
DB_PAD = tl.constexpr(triton.next_power_of_2(N_DISTANCE_BUCKETS))  # 32
NPB = tl.constexpr(N_POSITION_BINS)  # 10 tenths of [0, i], then one bin for keys after the query
PB_PAD = tl.constexpr(triton.next_power_of_2(N_POSITION_BINS + 1))  # 16
# how far `_position_sums` widens a block's first and last position bins: fp32's error on NPB j / (i + 1) < NPB is a
# few units of 2^-24 relative, far below it
BIN_SLACK = tl.constexpr(1e-3)
# the width of the slices of D in which the epilogue computes the offsets' scores
OFFSET_DK = tl.constexpr(32)
# SUMS_BY_DOT's modes, how the softmax's row sum l and the entropy's sum are taken (`triton_config`)
PER_SCORE = tl.constexpr(triton_config.PER_SCORE)
L_AND_T = tl.constexpr(triton_config.L_AND_T)
L_ONLY = tl.constexpr(triton_config.L_ONLY)

# -- the statistics' switches and outputs, as the table orders them: the entries of `spec.ROW_STATS` with kernel
# traits (`triton_launch.kernel_outputs`). `Stats`, the kernel's tuple of output pointers, holds one per entry;
# `STATS`, its constexpr tuple of switches, one per distinct `KernelTraits.switch`. The kernel reads both through
# the indices below, taken from the table, so that no order is kept by hand: a statistic's output index is
# named after it in CamelCase (`triton_launch.output_argument`), its switch's index as its traits name the switch
_WRITTEN = tuple(s for s in ROW_STATS if s.kernel is not None)
_OUT = {s.name: i for i, s in enumerate(_WRITTEN)}
_ON = {w: i for i, w in enumerate(dict.fromkeys(s.kernel.switch for s in _WRITTEN if s.kernel.switch is not None))}
Entropy = tl.constexpr(_OUT["entropy"])
OffsetMass = tl.constexpr(_OUT["offset_mass"])
ClassMass = tl.constexpr(_OUT["class_mass"])
Argmax = tl.constexpr(_OUT["argmax"])
DistanceMass = tl.constexpr(_OUT["distance_mass"])
MeanDistance = tl.constexpr(_OUT["mean_distance"])
PositionMass = tl.constexpr(_OUT["position_mass"])
DuplicateMass = tl.constexpr(_OUT["duplicate_mass"])
PrefixMatchMass = tl.constexpr(_OUT["prefix_match_mass"])
OffsetMassNorm = tl.constexpr(_OUT["offset_mass_norm"])
ClassMassNorm = tl.constexpr(_OUT["class_mass_norm"])
WeightedNorm = tl.constexpr(_OUT["weighted_norm"])
ENTROPY = tl.constexpr(_ON["ENTROPY"])
CLASS_MASS = tl.constexpr(_ON["CLASS_MASS"])
ARGMAX = tl.constexpr(_ON["ARGMAX"])
DISTANCE_MASS = tl.constexpr(_ON["DISTANCE_MASS"])
MEAN_DISTANCE = tl.constexpr(_ON["MEAN_DISTANCE"])
POSITION_MASS = tl.constexpr(_ON["POSITION_MASS"])
DUPLICATE_MASS = tl.constexpr(_ON["DUPLICATE_MASS"])
PREFIX_MATCH_MASS = tl.constexpr(_ON["PREFIX_MATCH_MASS"])
WEIGHTED_NORM = tl.constexpr(_ON["WEIGHTED_NORM"])
OFFSET_MASS_NORM = tl.constexpr(_ON["OFFSET_MASS_NORM"])
CLASS_MASS_NORM = tl.constexpr(_ON["CLASS_MASS_NORM"])
DISTANCE_MASS_NORM = tl.constexpr(_ON["DISTANCE_MASS_NORM"])
POSITION_MASS_NORM = tl.constexpr(_ON["POSITION_MASS_NORM"])
DUPLICATE_MASS_NORM = tl.constexpr(_ON["DUPLICATE_MASS_NORM"])
PREFIX_MATCH_MASS_NORM = tl.constexpr(_ON["PREFIX_MATCH_MASS_NORM"])
DistanceMassNorm = tl.constexpr(_OUT["distance_mass_norm"])
PositionMassNorm = tl.constexpr(_OUT["position_mass_norm"])
DuplicateMassNorm = tl.constexpr(_OUT["duplicate_mass_norm"])
PrefixMatchMassNorm = tl.constexpr(_OUT["prefix_match_mass_norm"])

# the kernel's other tuple arguments, element by element: the order in which `attn_stats_fwd` unpacks them, the
# launcher packs them (`triton_launch.kernel_arguments`) and `triton_aot` addresses an element (a unit stride, a
# 16-divisible one) by its path. `Stats` and `STATS` are the table's (above). tests/kernels/test_kernel_signature.py
# checks the kernel's unpacking against this
ARGUMENT_TUPLES = {
    "Keys": ("KeyValid", "KeyRange", "KeyFeatures", "KeyNorms"),
    "stride_q": ("stride_qb", "stride_qh", "stride_ql", "stride_qd"),
    "stride_k": ("stride_kb", "stride_kh", "stride_kl", "stride_kd"),
    "stride_v": ("stride_vb", "stride_vh", "stride_vl", "stride_vd"),
    "stride_o": ("stride_ob", "stride_oh", "stride_ol", "stride_od"),
    "strides": ("stride_mb", "stride_ml", "stride_fb", "stride_fl", "stride_xb", "stride_sr"),
    "dims": ("H", "L", "n_offsets", "n_classes", "G", "win_left", "win_right"),
    "TILE": ("BLOCK_M", "BLOCK_N", "BLOCK_D", "HEAD_DIM", "F_PAD", "NORM_W", "NORM_F", "CLAMP_KEYS", "MEAN_BY_DOT"),
}


@triton.jit
def _key_block(state, q, pos, start_n, keys, band, qk_scale,  #
               TILE: tl.constexpr, STATS: tl.constexpr, MASKED: tl.constexpr, BANDED: tl.constexpr,  #
               BEFORE: tl.constexpr, SUMS_BY_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key block [start_n, start_n + BLOCK_N) for the tile's rows: the softmax state, P V,
    the key-feature dot and the position sums, every statistic summed over keys written here once.

    state = (row, acc, feat, posn, tok), the running state by kind (`attn_stats_fwd`), returned updated; feat =
    (the key features' dot, the norm features' dot: the norm-based twins).
    pos (BLOCK_M,) the rows' query positions, whose bands are pos - win_left .. pos + win_right, band =
    (win_left, win_right) (BANDED only; read from pos and two scalars: no band vectors kept through the
    loop); keys = (K, V, U, KeyValid pointers of this sequence and head, their key strides, K's and V's d
    stride, the sequence length L, the norm features' pointer of this sequence and key/value head). TILE, STATS,
    BANDED, SUMS_BY_DOT, DOT_PRECISION: the kernel's (the
    statistics' switches read by their indices). MASKED: the block holds a key some row may not see (band
    edge, padding) or the row end; an unmasked block loads no mask and selects nothing. BEFORE (unmasked
    blocks only): every key of the block lies before every row of the tile (j < i; `attn_stats_fwd` makes
    it so for the position statistics and the token relations under a banded layout), so |i - j| = i - j
    and j < i need no per-score comparison: the mean distance is (i - start_n) sum_j p_j - sum_j p_j
    (j - start_n), one FFMA per score, and each token relation one compare and select per score."""
    BLOCK_N: tl.constexpr = TILE[1]
    BLOCK_D: tl.constexpr = TILE[2]
    HEAD_DIM: tl.constexpr = TILE[3]
    F_PAD: tl.constexpr = TILE[4]
    NORM_F: tl.constexpr = TILE[6]
    row, acc, feats, posn, tok = state
    feat, feat_n, n_col = feats
    win_left, win_right = band
    K_ptr, V_ptr, U_ptr, Valid_ptr, stride_kl, stride_vl, stride_fl, stride_ml, stride_kd, stride_vd, L, N_ptr = keys
    offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    CLAMP_KEYS: tl.constexpr = TILE[7]  # the config's spill workaround (`_key_rows`)
    clamp: tl.constexpr = MASKED and CLAMP_KEYS
    rows = _key_rows(offs_n, L, clamp)
    k_ptrs = K_ptr + rows[None, :] * stride_kl + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N)
    v_ptrs = V_ptr + rows[:, None] * stride_vl + offs_d[None, :] * stride_vd  # (BLOCK_N, BLOCK_D)
    n_in = offs_n < L
    if MASKED and not clamp:
        k = tl.load(k_ptrs, mask=n_in[None, :] & (offs_d < HEAD_DIM)[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=n_in[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    elif HEAD_DIM != BLOCK_D:
        k = tl.load(k_ptrs, mask=(offs_d < HEAD_DIM)[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    qk = tl.dot(q, k, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) fp32
    m_i, l_i, t_i, arg_i = row
    if MASKED:
        seen = tl.load(Valid_ptr + offs_n * stride_ml, mask=n_in, other=0) != 0  # (BLOCK_N,) padding keys
        if BANDED:
            rel = offs_n[None, :] - pos[:, None]  # (BLOCK_M, BLOCK_N) j - i
            seen = seen[None, :] & (rel >= -win_left) & (rel <= win_right)
        else:
            seen = seen[None, :]
        # (BLOCK_M, BLOCK_N) log2 units; a key the row may not see gets the finite fill, so that a row that
        # sees none (a padding query) is uniform over the sequence, as eager's; past the row end -inf,
        # no key at all (p = 0; the entropy's T multiplies p by the raw score, 0 there: no 0 * inf)
        z = tl.where(n_in[None, :], tl.where(seen, qk * qk_scale, FMIN), float("-inf"))
        m_blk = tl.max(z, 1)
        m_new = tl.maximum(m_i, m_blk)
        x = z - m_new[:, None]
        top = z == m_blk[:, None]  # (argmax) the block's largest scores
    else:
        q_max = tl.max(qk, 1)  # the raw max, scaled once per row
        m_blk = q_max * qk_scale
        m_new = tl.maximum(m_i, m_blk)
        x = qk * qk_scale - m_new[:, None]  # one FFMA per score
        top = qk == q_max[:, None]
    p = tl.math.exp2(x)  # (BLOCK_M, BLOCK_N) unnormalised; 0 for unseen keys unless the row sees none
    alpha = tl.math.exp2(m_i - m_new)  # (BLOCK_M,) 0 on a row's first block (m_i = FMIN)
    if STATS[ARGMAX]:
        # the first key with the block's max; the running one changes to a strictly larger max, or an
        # equal one at a lower index (the stages visit blocks out of key order)
        arg_blk = tl.min(tl.where(top, offs_n[None, :], 2147483647), 1)  # (BLOCK_M,)
        arg_i = tl.where((m_blk > m_i) | ((m_blk == m_i) & (arg_blk < arg_i)), arg_blk, arg_i)
    if SUMS_BY_DOT == PER_SCORE:
        if STATS[ENTROPY]:
            # T = sum_j p_j s_j, rescaled like l, with the raw scores s = q . k (finite everywhere: a key past
            # the row end reads k = 0): the epilogue's t = sum_j p_j (z_j - m) = c T - m l.
            # One FFMA per score, and nothing kept beside p. T and l are fp32 sums of the same fp32 p, so
            # c T / l - m cancels to t / l as far as fp32 goes (an l summed from P rounded to bf16 would move
            # it by |m| 2^-9: L_ONLY keeps t relative to m instead)
            t_i = t_i * alpha + tl.sum(p * qk, 1)
        l_i = l_i * alpha + tl.sum(p, 1)
    if SUMS_BY_DOT == L_ONLY and STATS[ENTROPY]:
        # t = sum_j p_j (z_j - m) itself, relative to the running max (the exp2's argument x: one FFMA per
        # score, no FADD for l). When the max moves, p scales by alpha and each z_j - m by m_old - m_new:
        # t <- alpha (t + (m_old - m_new) l_old), l_old the ones column so far (one row sum per block). alpha = 0
        # (a first block; a row that saw only filled keys) takes nothing from before, and no 0 * inf
        fidx = tl.arange(0, F_PAD)  # (F_PAD,)
        l_old = tl.sum(tl.where(fidx[None, :] == F_PAD - 1, feat, 0.0), 1)  # (BLOCK_M,)
        if MASKED:  # past the row end x = -inf and p = 0
            x = tl.where(n_in[None, :], x, 0.0)
        t_i = tl.where(alpha > 0.0, alpha * (t_i + (m_i - m_new) * l_old), 0.0) + tl.sum(p * x, 1)
    # -- P V, and the key features' dot with the same P (rescaled to the new max first)
    pv = p.to(v.dtype)  # P in the input dtype, as FlashAttention's P V takes it
    acc = tl.dot(pv, v, acc * alpha[:, None], input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_D)
    if SUMS_BY_DOT == L_AND_T and STATS[ENTROPY]:
        # T = q . (P K) on the tensor cores, from the same rounded P as l (the features' ones column)
        t_i = tl.dot(pv, tl.trans(k), t_i * alpha[:, None], input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_D)
    row = (m_new, l_i, t_i, arg_i)
    MEAN_BY_DOT: tl.constexpr = TILE[8]  # the mean distance's i l - P j from the key features' dot (`_position_sums`)
    if STATS[CLASS_MASS] or SUMS_BY_DOT != PER_SCORE or (MEAN_BY_DOT and STATS[MEAN_DISTANCE]):
        u_ptrs = U_ptr + offs_n[:, None] * stride_fl + tl.arange(0, F_PAD)[None, :]  # (BLOCK_N, F_PAD)
        if MASKED:
            u = tl.load(u_ptrs, mask=n_in[:, None], other=0.0)
        else:
            u = tl.load(u_ptrs)
        feat = tl.dot(pv, u, feat * alpha[:, None], input_precision=DOT_PRECISION)  # (BLOCK_M, F_PAD)
    if STATS[WEIGHTED_NORM]:
        # the norm-based twins (Kobayashi et al. 2020): the same dot with the key features scaled by each key's
        # value norm, U n, per query head of the group side by side, each head's last column n itself
        # (`triton_launch.norm_features`): the twins' sums ride the tensor cores, no work per score
        n_ptrs = N_ptr + offs_n[:, None] * NORM_F + tl.arange(0, NORM_F)[None, :]  # (BLOCK_N, NORM_F)
        if MASKED:
            un = tl.load(n_ptrs, mask=n_in[:, None], other=0.0)
        else:
            un = tl.load(n_ptrs)
        feat_n = tl.dot(pv, un, feat_n * alpha[:, None], input_precision=DOT_PRECISION)  # (BLOCK_M, NORM_F)
    # the norm-based twins of the statistics summed per score or bucket: the same sums of p_j n_j, n_j the row's
    # own head's value norm (its column n_col of the norm features: a (BLOCK_M, BLOCK_N) read, one FMUL per score)
    TWINS: tl.constexpr = (STATS[DISTANCE_MASS_NORM] or STATS[POSITION_MASS_NORM] or STATS[DUPLICATE_MASS_NORM]
                           or STATS[PREFIX_MATCH_MASS_NORM])
    if TWINS:
        n_ptrs = N_ptr + offs_n[None, :] * NORM_F + n_col[:, None]  # (BLOCK_M, BLOCK_N)
        if MASKED:
            p_n = p * tl.load(n_ptrs, mask=n_in[None, :], other=0.0).to(tl.float32)
        else:
            p_n = p * tl.load(n_ptrs).to(tl.float32)
    if STATS[DISTANCE_MASS] or STATS[MEAN_DISTANCE] or STATS[POSITION_MASS]:
        # the sums of p, then (their twins) of p n: one call, a static loop over the two weights
        WEIGHTS: tl.constexpr = 2 if STATS[DISTANCE_MASS_NORM] or STATS[POSITION_MASS_NORM] else 1
        dist_i, dsum_i, pmass_i, dist_n, pmass_n, bin_r = posn
        for twin in tl.static_range(WEIGHTS):
            sums = _position_sums((dist_n, dsum_i, pmass_n) if twin else (dist_i, dsum_i, pmass_i),
                                  p_n if twin else p, alpha, pos, bin_r, offs_n, start_n, BLOCK_N,
                                  STATS[DISTANCE_MASS_NORM] if twin else STATS[DISTANCE_MASS],
                                  0 if twin else ((2 if MEAN_BY_DOT else 1) if STATS[MEAN_DISTANCE] else 0),
                                  STATS[POSITION_MASS_NORM] if twin else STATS[POSITION_MASS], BEFORE and not MASKED)
            if twin:
                dist_n, _, pmass_n = sums
            else:
                dist_i, dsum_i, pmass_i = sums
        posn = (dist_i, dsum_i, pmass_i, dist_n, pmass_n, bin_r)
    if STATS[DUPLICATE_MASS] or STATS[PREFIX_MATCH_MASS]:
        # the token relations (spec.py's `_duplicate_mass`, `_prefix_match_mass`): online like the class masses
        dup_i, pre_i, qid, Ids, dup_n, pre_n = tok  # qid (BLOCK_M,) the rows' tokens; Ids the sequence's, -1 on padding
        if BEFORE and not MASKED:  # every key j < i: a token match is the relation itself
            kid = tl.load(Ids + offs_n)  # (BLOCK_N,)
            prev = tl.load(Ids + offs_n - 1, mask=offs_n >= 1, other=-1)  # (BLOCK_N,) the tokens before
            dup = kid[None, :] == qid[:, None]  # (BLOCK_M, BLOCK_N)
            dup_i = dup_i * alpha + tl.sum(tl.where(dup, p, 0.0), 1)
            pre = prev[None, :] == qid[:, None]
            pre_i = pre_i * alpha + tl.sum(tl.where(pre, p, 0.0), 1)
        else:
            kid = tl.load(Ids + offs_n, mask=n_in, other=-1)  # (BLOCK_N,)
            prev = tl.load(Ids + offs_n - 1, mask=n_in & (offs_n >= 1), other=-1)  # (BLOCK_N,) the tokens before
            before = offs_n[None, :] < pos[:, None]  # (BLOCK_M, BLOCK_N) j < i
            dup = before & (kid[None, :] == qid[:, None])
            dup_i = dup_i * alpha + tl.sum(tl.where(dup, p, 0.0), 1)
            pre = (before | (offs_n[None, :] == pos[:, None])) & (prev[None, :] == qid[:, None])  # j <= i
            pre_i = pre_i * alpha + tl.sum(tl.where(pre, p, 0.0), 1)
        if STATS[DUPLICATE_MASS_NORM]:
            dup_n = dup_n * alpha + tl.sum(tl.where(dup, p_n, 0.0), 1)
        if STATS[PREFIX_MATCH_MASS_NORM]:
            pre_n = pre_n * alpha + tl.sum(tl.where(pre, p_n, 0.0), 1)
        tok = (dup_i, pre_i, qid, Ids, dup_n, pre_n)
    return row, acc, (feat, feat_n, n_col), posn, tok


@triton.jit
def _stage(state, q, pos, keys, band, bounds, qk_scale,  #
           TILE: tl.constexpr, STATS: tl.constexpr, MASKED: tl.constexpr, BANDED: tl.constexpr,  #
           BEFORE: tl.constexpr, SUMS_BY_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One stage of the tile's key blocks through `_key_block`, bounds = (start_lo, full_lo, full_hi, end):
    the main loop over the full blocks [full_lo, full_hi), no mask; or (MASKED) the blocks of
    [start_lo, end) outside them, left of them, then right. The other arguments are `_key_block`'s."""
    BLOCK_N: tl.constexpr = TILE[1]
    start_lo, full_lo, full_hi, end = bounds
    if MASKED:  # the masked blocks, counted: n_left of them left of the full ones, the rest right
        n_left = (full_lo - start_lo) // BLOCK_N
        lo = 0
        hi = n_left + (end - full_hi) // BLOCK_N
        step: tl.constexpr = 1
    else:  # the main loop: no mask
        lo = full_lo
        hi = full_hi
        step: tl.constexpr = BLOCK_N
    for it in range(lo, hi, step):
        start_n = tl.where(it < n_left, start_lo + it * BLOCK_N, full_hi + (it - n_left) * BLOCK_N) if MASKED else it
        state = _key_block(state, q, pos, start_n, keys, band, qk_scale, TILE, STATS, MASKED, BANDED, BEFORE,
                           SUMS_BY_DOT, DOT_PRECISION)
    return state


@triton.jit
def _position_sums(posn, p, alpha, pos, bin_r, offs_n, start_n, BLOCK_N: tl.constexpr, DISTANCE: tl.constexpr,
                   MEAN: tl.constexpr, POSITION: tl.constexpr, BEFORE: tl.constexpr = False):
    """The position-dependent sums of one block (spec.py's `_distance_mass`, `_mean_distance`,
    `_position_mass`), online like the class masses: rescaled by alpha, divided by l at the end.

    dist (BLOCK_M, DB_PAD): mass per log2 bucket of |i - j|; dsum (BLOCK_M,): sum_j p_j |i - j|;
    pmass (BLOCK_M, PB_PAD): mass per bin floor(NPB j / (i + 1)) of keys j <= i, then bin NPB for
    j > i. Exact integer comparisons, one compare-and-select row sum per edge the block straddles: its
    distances lie in [d_lo, d_hi] and its bins in [b_lo, b_hi] (one or two far from the diagonal): b_lo and b_hi
    from the tile's reciprocals bin_r = (1 / (i_hi + 1), 1 / (i_lo + 1)) (`attn_stats_fwd`), widened by BIN_SLACK:
    a bound one bin too wide adds an iteration that adds 0 (a bin before the block's first gets above - beyond = 0,
    one after its last what is left: 0), where an integer division per bound took a MUFU.RCP and about 15
    instructions a block.
    DISTANCE, POSITION: which of the buckets and bins it sums (the kernel's switches of the statistics, or of
    their norm-based twins: the same sums of p_j n_j, `_key_block`); MEAN, how it sums the mean distance's: 0 not at
    all, 1 dsum = sum_j p_j |i - j|, 2 (MEAN_BY_DOT: the launcher gave the key features the key positions' columns)
    only what sum_j p_j (i - j) = i l - P j misses, the keys after the row: sum_j p_j (|i - j| - (i - j)) =
    2 sum_{j > i} p_j (j - i), nothing but its rescale in a block before every row (the epilogue adds i l - P j
    from the key features' dot, no work per score there).
    BEFORE: every key of the block lies before every row (j < i, `_key_block`): |i - j| = i - j, so the
    mean distance is (i - start_n) sum_j p_j - sum_j p_j (j - start_n) (one FFMA per score; both terms at
    most BLOCK_N apart, so no cancellation beyond the block's width), and the distances need no |.|."""
    dist_i, dsum_i, pmass_i = posn
    i_lo = tl.min(pos, 0)
    i_hi = tl.max(pos, 0)
    if BEFORE:
        if DISTANCE:
            dist = pos[:, None] - offs_n[None, :]  # (BLOCK_M, BLOCK_N) |i - j| = i - j
    elif DISTANCE or MEAN == 1:
        dist = tl.abs(pos[:, None] - offs_n[None, :])  # (BLOCK_M, BLOCK_N) |i - j|
    if MEAN == 2:  # (MEAN_BY_DOT) the keys after the row alone; none in a block before every row
        dsum_i = dsum_i * alpha
        if not BEFORE:
            after = tl.maximum(offs_n[None, :] - pos[:, None], 0)  # (BLOCK_M, BLOCK_N) j - i where j > i, else 0
            dsum_i += 2.0 * tl.sum(p * after.to(tl.float32), 1)
    if MEAN == 1:
        if BEFORE:
            t = tl.arange(0, BLOCK_N).to(tl.float32)  # (BLOCK_N,) j - start_n
            dsum_i = dsum_i * alpha + (pos - start_n).to(tl.float32) * tl.sum(p, 1) - tl.sum(p * t[None, :], 1)
        else:
            dsum_i = dsum_i * alpha + tl.sum(p * dist.to(tl.float32), 1)
    if DISTANCE:
        d_lo = tl.maximum(tl.maximum(start_n - i_hi, i_lo - (start_n + BLOCK_N - 1)), 0)
        d_hi = tl.maximum(i_hi - start_n, start_n + BLOCK_N - 1 - i_lo)
        didx = tl.arange(0, DB_PAD)  # (DB_PAD,)
        dist_i = dist_i * alpha[:, None]
        # from the block's nearest bucket out: `above` is the mass at distances >= bucket b's low edge (at b_lo the
        # whole block's), and bucket b's mass is that less the mass at >= the next bucket's low edge, 2^b: one
        # compare and select per score and edge the block straddles, none for a block inside one bucket
        b_lo = _distance_bucket(d_lo)
        b_hi = _distance_bucket(d_hi)
        above = tl.sum(p, 1)  # (BLOCK_M,)
        for b in range(b_lo, b_hi):
            beyond = tl.sum(tl.where(dist >= (1 << b), p, 0.0), 1)  # (BLOCK_M,) at >= bucket b + 1's low edge
            dist_i = tl.where(didx[None, :] == b, dist_i + (above - beyond)[:, None], dist_i)
            above = beyond
        dist_i = tl.where(didx[None, :] == b_hi, dist_i + above[:, None], dist_i)
    if POSITION:
        # bin b < NPB holds keys with b (i + 1) <= NPB j < (b + 1)(i + 1); bin NPB holds j > i
        j_lo = tl.min(offs_n, 0)
        j_hi = tl.max(offs_n, 0)
        r_hi, r_lo = bin_r
        b_lo = tl.minimum(((j_lo * NPB).to(tl.float32) * r_hi - BIN_SLACK).to(tl.int32), NPB)
        b_hi = tl.where(j_hi > i_lo, NPB,
                        tl.minimum(((j_hi * NPB).to(tl.float32) * r_lo + BIN_SLACK).to(tl.int32), NPB))
        tj = offs_n * NPB  # (BLOCK_N,)
        pidx = tl.arange(0, PB_PAD)  # (PB_PAD,)
        pmass_i = pmass_i * alpha[:, None]
        # as the distance buckets: from the block's first bin on, bin b's mass is the mass in bins >= b less the mass
        # from bin b + 1's first scaled key position, (b + 1)(i + 1), on
        above = tl.sum(p, 1)  # (BLOCK_M,) the block's mass in bins >= b_lo: all of it
        for b in range(b_lo, b_hi):
            beyond = tl.sum(tl.where(tj[None, :] >= ((b + 1) * (pos + 1))[:, None], p, 0.0), 1)  # (BLOCK_M,)
            pmass_i = tl.where(pidx[None, :] == b, pmass_i + (above - beyond)[:, None], pmass_i)
            above = beyond
        pmass_i = tl.where(pidx[None, :] == b_hi, pmass_i + above[:, None], pmass_i)
    return dist_i, dsum_i, pmass_i


@triton.jit
def _key_rows(offs_n, L, CLAMP: tl.constexpr):
    """The key rows a block reads: offs_n itself (a masked block then loads K and V under the mask n < L), or with
    CLAMP those past the sequence's end clamped to its last row: finite values, given no weight (their scores are
    -inf: p = 0), so exact either way. A spill workaround, chosen by the config (`triton_config.Entry.clamp_keys`):
    which of the two lets a tile compile without a spill is ptxas's call (Triton 3.7.1: the clamp for sm_90's
    plain D = 128 tile of the default statistics, with L_ONLY; the masked load everywhere else; docs/kernels.md)."""
    return tl.minimum(offs_n, L - 1) if CLAMP else offs_n


@triton.jit
def _after_loops(x, l_i):
    """x, computed from the loops' result: l_i (a sum of exponentials, or NaN) is never negative, so
    this is x itself; but the compiler cannot know it, so it neither computes from x before the loops
    what the epilogue needs (the rows' 64-bit output addresses, their 64-bit statistics rows) nor holds
    those through the loops, where registers are short: on sm_80 at 128 x 128 tiles (D = 64, causal)
    and 128 x 32 (D = 128, causal) that is what spilled (a comparison NaN < 0 is false as well: a NaN
    row still writes its own row). Used with the masked stage first only: in the other order the
    same dependency made ptxas spill other specialisations."""
    return tl.where(l_i < 0.0, 0, x)


@triton.jit
def _distance_bucket(d):
    """The log2 bucket of a distance d >= 0: the number of spec.DISTANCE_EDGES (1, 2, 4, ...,
    2^(DB - 2)) that are <= d, which is d's bit length capped at DB - 1, read off the exponent of d as a
    float: floor(log2 d) + 1 for d >= 1, exact below 2^24 (a larger d rounds, but lies in the last bucket
    either way), and 0 for d = 0 (0.0's exponent bits are 0). A conversion and three integer operations,
    where a compare and an add per edge took the main loop about 90 instructions a block (twice 16 edges,
    on the scalar path)."""
    e = (d.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 126  # (biased exponent) - 127 + 1
    return tl.minimum(tl.maximum(e, 0), DB - 1)


@triton.jit
def attn_stats_fwd(
    Q, K, V, Keys, GateXi, Offsets, Out, Lse, Stats, TokenIds, sm_scale,  #
    stride_q, stride_k, stride_v, stride_o, strides, dims,  #
    TILE: tl.constexpr, BANDED: tl.constexpr, DOT_PRECISION: tl.constexpr,  #
    SUMS_BY_DOT: tl.constexpr, MASKED_FIRST: tl.constexpr, GROUP: tl.constexpr, STATS: tl.constexpr,
):
    """One program: BLOCK_M stacked rows (f = i * G + g) of the G query heads that share one
    key/value head, against that head's keys.

    The tuple arguments, element by element in `ARGUMENT_TUPLES`' order (the launcher packs them from it):
    Keys = (KeyValid, KeyRange, KeyFeatures, KeyNorms), the batch's per-key operands; GateXi (B or 1, H) the
    heads' xi gates; Stats, the statistics' output pointers, one per entry of the table with kernel traits
    (`triton_launch.kernel_outputs`) in the table's order, read by their indices (`Entropy`, `OffsetMass`,
    ...); stride_q / stride_k / stride_v / stride_o = (b, h, l, d) strides of Q, K, V and Out (Out's h and l
    those of its (B, L, H, D) tensor); strides = (KeyValid's b and l, KeyFeatures' b and l, GateXi's b (0: one
    gate per head), the statistics buffer's row stride); dims = (H, L, n_offsets, n_classes, G, win_left,
    win_right); TILE = (BLOCK_M, BLOCK_N, BLOCK_D, HEAD_DIM, F_PAD, NORM_W, NORM_F, CLAMP_KEYS, MEAN_BY_DOT): the
    tiles, the feature widths, the config's key-row clamp (`_key_rows`) and whether the key features hold the key
    positions' columns (the mean distance by dot, `_position_sums`); STATS, the statistics'
    constexpr switches, one per distinct switch of those entries in the table's order, read by their indices
    (`ENTROPY`, `ARGMAX`, ...). Both index sets are taken from the table (module constants above). Flattened,
    the arguments are in the order they had as separate ones, but for KeyNorms (the norm-based twins' features,
    added since), which moves the constant-bank offsets of the parameters after it and no SASS count of the
    budget (`triton_aot --budget`).

    BANDED: the rows' bands are compared in masked blocks (causal, windowed layouts); off (the plain
    layout: win_left = win_right = L, G = 1, which Triton's launcher specialises to a constant) only
    padding and the row end are masked. GROUP > 0: G compiled in (= GROUP, `triton_config`): the stacked
    rows' divisions by G are then a multiply and a shift, and no runtime G, H // G or divisor is held
    through the loops; that is what lets the decoders' widest tiles at D = 128 compile without a spill. 0:
    G read at run time. KeyRange (B, 2): the sequence's valid keys [lo, hi) when they are one contiguous
    run, else (0, 0): blocks inside it (and inside every row's band) take the unmasked stage. TokenIds
    (B, L) int32, contiguous, -1 on padding: the token ids the token relations compare (DUPLICATE_MASS,
    PREFIX_MATCH_MASS, switched on together)."""
    KeyValid, KeyRange, KeyFeatures, KeyNorms = Keys
    stride_qb, stride_qh, stride_ql, stride_qd = stride_q
    stride_kb, stride_kh, stride_kl, stride_kd = stride_k
    stride_vb, stride_vh, stride_vl, stride_vd = stride_v
    stride_ob, stride_oh, stride_ol, stride_od = stride_o
    stride_mb, stride_ml, stride_fb, stride_fl, stride_xb, stride_sr = strides
    H, L, n_offsets, n_classes, G, win_left, win_right = dims
    band = (win_left, win_right)
    BLOCK_M: tl.constexpr = TILE[0]
    BLOCK_N: tl.constexpr = TILE[1]
    BLOCK_D: tl.constexpr = TILE[2]
    HEAD_DIM: tl.constexpr = TILE[3]
    F_PAD: tl.constexpr = TILE[4]
    NORM_W: tl.constexpr = TILE[5]
    NORM_F: tl.constexpr = TILE[6]
    MEAN_BY_DOT: tl.constexpr = TILE[8]
    if GROUP > 0:
        G = GROUP
    start_m = tl.program_id(0)
    off_bkv = tl.program_id(1)  # b * H_kv + key/value head
    H_kv = H // G
    off_b = (off_bkv // H_kv).to(tl.int64)
    off_kv = (off_bkv % H_kv).to(tl.int64)
    offs_f = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) stacked rows
    f_in = offs_f < L * G
    pos = offs_f // G  # (BLOCK_M,) query positions
    g = offs_f % G  # (BLOCK_M,) query head within the group
    bh0 = off_b * H + off_kv * G  # (b, first query head of the group) in the (B, H) flat index
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    d_in = offs_d < HEAD_DIM
    Q_rows = Q + off_b * stride_qb + (off_kv * G) * stride_qh  # the group's first query head
    q = tl.load(Q_rows + (g * stride_qh + pos * stride_ql)[:, None] + offs_d[None, :] * stride_qd,
                mask=f_in[:, None] & d_in[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    keys = (K + off_b * stride_kb + off_kv * stride_kh, V + off_b * stride_vb + off_kv * stride_vh,
            KeyFeatures + off_b * stride_fb, KeyValid + off_b * stride_mb,
            stride_kl, stride_vl, stride_fl, stride_ml, stride_kd, stride_vd, L,
            KeyNorms + (off_b * H_kv + off_kv) * L * NORM_F)  # the norm features: (B, H_kv, L, NORM_F) contiguous
    qk_scale = sm_scale * LOG2E
    # -- running state, by kind: softmax (m, l, T, arg), output, key features, position sums
    if SUMS_BY_DOT == L_AND_T and STATS[ENTROPY]:
        t_init = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    else:
        t_init = tl.zeros([BLOCK_M], dtype=tl.float32)
    row = (tl.full([BLOCK_M], FMIN, dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
           t_init, tl.zeros([BLOCK_M], dtype=tl.int32))
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # (the key features' dot, the norm features' dot, each row's column of its head's n in the norm features)
    feat = (tl.zeros([BLOCK_M, F_PAD], dtype=tl.float32), tl.zeros([BLOCK_M, NORM_F], dtype=tl.float32),
            g * NORM_W + NORM_W - 1)
    # (distance buckets, mean distance's sum, position bins, the twins of the buckets and the bins, and the
    # reciprocals of the tile's last and first rows' i + 1: the position bins' bounds, `_position_sums`)
    BINS: tl.constexpr = STATS[POSITION_MASS] or STATS[POSITION_MASS_NORM]
    posn = (tl.zeros([BLOCK_M, DB_PAD], dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
            tl.zeros([BLOCK_M, PB_PAD], dtype=tl.float32), tl.zeros([BLOCK_M, DB_PAD], dtype=tl.float32),
            tl.zeros([BLOCK_M, PB_PAD], dtype=tl.float32),
            (1.0 / (tl.max(pos, 0) + 1).to(tl.float32), 1.0 / (tl.min(pos, 0) + 1).to(tl.float32)) if BINS else 0)
    TOKENS: tl.constexpr = STATS[DUPLICATE_MASS] or STATS[PREFIX_MATCH_MASS]
    # (duplicate and prefix-match sums, the rows' tokens, the sequence's ids, the two sums' twins)
    tok = (tl.zeros([BLOCK_M], dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
           tl.load(TokenIds + off_b * L + pos, mask=f_in, other=-1) if TOKENS else 0, TokenIds + off_b * L,
           tl.zeros([BLOCK_M], dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32))
    # -- the tile's key blocks [start_lo, end): those its band meets; the unmasked ones [full_lo, full_hi)
    first = (start_m * BLOCK_M) // G
    last = tl.minimum((start_m * BLOCK_M + BLOCK_M - 1) // G, L - 1)
    start_lo = (tl.maximum(first - win_left, 0) // BLOCK_N) * BLOCK_N
    end = tl.cdiv(tl.minimum(last + win_right + 1, L), BLOCK_N) * BLOCK_N
    valid_lo = tl.load(KeyRange + off_b * 2)
    valid_hi = tl.load(KeyRange + off_b * 2 + 1)
    full_lo = tl.maximum(tl.cdiv(tl.maximum(tl.maximum(last - win_left, 0), valid_lo), BLOCK_N) * BLOCK_N, start_lo)
    full_hi = (tl.minimum(tl.minimum(first + win_right + 1, L), valid_hi) // BLOCK_N) * BLOCK_N
    full_hi = tl.maximum(full_hi, full_lo)
    # the position statistics and the token relations under a banded layout: the unmasked blocks hold only keys
    # before every row (`_key_block`'s BEFORE). A causal layout's already do but for the block of the tile's first
    # row's own key; a bidirectional window's keys after the rows go to the masked stage
    BEFORE: tl.constexpr = BANDED and (STATS[MEAN_DISTANCE] or STATS[DISTANCE_MASS] or TOKENS)
    if BEFORE:
        full_hi = tl.maximum(tl.minimum(full_hi, (first // BLOCK_N) * BLOCK_N), full_lo)
    # the two stages, the masked blocks before the main loop (MASKED_FIRST, module docstring) or after it
    state = (row, acc, feat, posn, tok)
    bounds = (start_lo, full_lo, full_hi, end)
    for stage in tl.static_range(2):
        state = _stage(state, q, pos, keys, band, bounds, qk_scale, TILE, STATS, (stage == 0) == MASKED_FIRST,
                       BANDED, BEFORE, SUMS_BY_DOT, DOT_PRECISION)
    row, acc, feats, posn, tok = state
    feat, feat_n, n_col = feats
    # -- epilogue, from the final state; statistics stored in fp32
    m_i, l_i, t_i, arg_i = row
    if SUMS_BY_DOT != PER_SCORE:
        fidx = tl.arange(0, F_PAD)  # (F_PAD,)
        l_i = tl.sum(tl.where(fidx[None, :] == F_PAD - 1, feat, 0.0), 1)  # the ones column: sum_j P_j
        if SUMS_BY_DOT == L_AND_T and STATS[ENTROPY]:
            # T = q . (P K), q again from memory: neither q nor its addresses kept through the loop
            # (the address written per query head, not as the prologue's, so that the compiler does not keep
            # the prologue's 64-bit pointers live through both loops to reuse them here)
            q_t = tl.load(Q + off_b * stride_qb + ((off_kv * G + g) * stride_qh + pos * stride_ql)[:, None]
                          + offs_d[None, :] * stride_qd,
                          mask=f_in[:, None] & d_in[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
            t_i = tl.sum(q_t.to(tl.float32) * t_i, 1)
    inv_l = 1.0 / l_i
    log2_l = tl.math.log2(l_i)
    if MASKED_FIRST:  # (`_after_loops`)
        row_out = bh0 * L + _after_loops(g * L + pos, l_i)
    else:
        row_out = bh0 * L + g * L + pos  # (BLOCK_M,) flat (b, h, i) of the (B, H, L, ...) statistics
    stat_row = row_out * stride_sr  # (BLOCK_M,) their rows in the statistics buffer (B, H, L, F)
    # padding queries' statistics are the table's padding value, 0: written here, not by a pass after
    q_ok = tl.load(KeyValid + off_b * stride_mb + pos * stride_ml, mask=f_in, other=0) != 0  # (BLOCK_M,)
    K_ptr, V_ptr, U_ptr, Valid_ptr, stride_kl, stride_vl, stride_fl, stride_ml, stride_kd, stride_vd, L, N_ptr = keys
    # -- the output first, so that acc's registers are free for the statistics: xi scales each row's
    # head (a uniform head's rows are written after the launch: `triton_launch.uniform_rows`)
    head = off_kv * G + g  # (BLOCK_M,) the rows' query heads
    # (BLOCK_M,) per head, or per sequence and head
    xi = tl.load(GateXi + off_b * stride_xb + head, mask=f_in, other=1.0)
    o_rows = g * stride_oh + pos * stride_ol  # (BLOCK_M,)
    if MASKED_FIRST:  # (`_after_loops`)
        o_rows = _after_loops(o_rows, l_i)
    O_ptrs = Out + off_b * stride_ob + (off_kv * G) * stride_oh + o_rows[:, None] + offs_d[None, :] * stride_od
    o_in = f_in[:, None] & d_in[None, :]
    acc = acc * (inv_l * xi)[:, None]
    tl.store(O_ptrs, acc.to(Out.dtype.element_ty), mask=o_in)
    # -- the row statistics
    tl.store(Lse + row_out, (m_i + log2_l) * LN2, mask=f_in)
    if STATS[ENTROPY]:
        if SUMS_BY_DOT == L_ONLY:  # H = ln 2 (log2 l - t / l)
            entropy = (log2_l - t_i * inv_l) * LN2
        else:  # H = ln 2 (log2 l - t / l), t / l = c T / l - m
            entropy = (log2_l + m_i - qk_scale * t_i * inv_l) * LN2
        tl.store(Stats[Entropy] + stat_row, tl.where(q_ok, entropy, 0.0), mask=f_in)
    if STATS[ARGMAX]:
        tl.store(Stats[Argmax] + row_out, tl.where(q_ok, arg_i, 0).to(tl.int64), mask=f_in)
    if STATS[CLASS_MASS]:
        cidx = tl.arange(0, F_PAD)  # (F_PAD,)
        tl.store(Stats[ClassMass] + stat_row[:, None] + cidx[None, :],
                 tl.where(q_ok[:, None], feat * inv_l[:, None], 0.0), mask=f_in[:, None] & (cidx[None, :] < n_classes))
    if STATS[WEIGHTED_NORM]:
        # the norm-based twins: each row's own query head's columns of the norm features, g NORM_W + c; the last,
        # s = sum_j p_j n_j, is the twins' denominator (weighted_norm = s / l). A row whose keys all have a zero
        # value vector has s = 0 and twins 0, as eager's `norm_weights`
        nidx = tl.arange(0, NORM_F)  # (NORM_F,)
        col = nidx % NORM_W  # (NORM_F,) the column within its head's group
        own = (nidx[None, :] // NORM_W) == g[:, None]  # (BLOCK_M, NORM_F) the row's head's columns
        s_n = tl.sum(tl.where(own & (col == NORM_W - 1)[None, :], feat_n, 0.0), 1)  # (BLOCK_M,)
        inv_s = tl.where(s_n > 0.0, 1.0 / s_n, 0.0)
        tl.store(Stats[WeightedNorm] + stat_row, tl.where(q_ok, s_n * inv_l, 0.0), mask=f_in)
        if STATS[CLASS_MASS_NORM]:
            tl.store(Stats[ClassMassNorm] + stat_row[:, None] + col[None, :],
                     tl.where(q_ok[:, None], feat_n * inv_s[:, None], 0.0),
                     mask=f_in[:, None] & own & (col < n_classes)[None, :])
    if STATS[DISTANCE_MASS] or STATS[MEAN_DISTANCE] or STATS[POSITION_MASS]:
        dist_i, dsum_i, pmass_i, dist_n, pmass_n, _ = posn
        if STATS[DISTANCE_MASS]:
            didx = tl.arange(0, DB_PAD)  # (DB_PAD,)
            tl.store(Stats[DistanceMass] + stat_row[:, None] + didx[None, :],
                     tl.where(q_ok[:, None], dist_i * inv_l[:, None], 0.0), mask=f_in[:, None] & (didx[None, :] < DB))
        if STATS[MEAN_DISTANCE]:
            if MEAN_BY_DOT:  # sum_j p_j |i - j| = i l - P j + the keys after the row (`_position_sums`); l and P j from
                # the key features' dot with the same rounded P: its ones column, and j = 256 hi + lo (both exact in
                # bf16) in the two columns before it (`triton_launch.OperandCache.keys`)
                fidx = tl.arange(0, F_PAD)  # (F_PAD,)
                l_dot = tl.sum(tl.where(fidx[None, :] == F_PAD - 1, feat, 0.0), 1)  # (BLOCK_M,)
                pj = tl.sum(tl.where(fidx[None, :] == F_PAD - 2, feat, 0.0)
                            + tl.where(fidx[None, :] == F_PAD - 3, feat * 256.0, 0.0), 1)  # (BLOCK_M,) sum_j p_j j
                dsum_i = pos.to(tl.float32) * l_dot - pj + dsum_i
            tl.store(Stats[MeanDistance] + stat_row, tl.where(q_ok, dsum_i * inv_l, 0.0), mask=f_in)
        if STATS[POSITION_MASS]:
            pidx = tl.arange(0, PB_PAD)  # (PB_PAD,)
            tl.store(Stats[PositionMass] + stat_row[:, None] + pidx[None, :],
                     tl.where(q_ok[:, None], pmass_i * inv_l[:, None], 0.0),
                     mask=f_in[:, None] & (pidx[None, :] <= NPB))
        if STATS[DISTANCE_MASS_NORM]:  # the twins: over s = sum_j p_j n_j (`inv_s`, with the weighted norm's)
            didx = tl.arange(0, DB_PAD)  # (DB_PAD,)
            tl.store(Stats[DistanceMassNorm] + stat_row[:, None] + didx[None, :],
                     tl.where(q_ok[:, None], dist_n * inv_s[:, None], 0.0), mask=f_in[:, None] & (didx[None, :] < DB))
        if STATS[POSITION_MASS_NORM]:
            pidx = tl.arange(0, PB_PAD)  # (PB_PAD,)
            tl.store(Stats[PositionMassNorm] + stat_row[:, None] + pidx[None, :],
                     tl.where(q_ok[:, None], pmass_n * inv_s[:, None], 0.0),
                     mask=f_in[:, None] & (pidx[None, :] <= NPB))
    if STATS[DUPLICATE_MASS]:
        tl.store(Stats[DuplicateMass] + stat_row, tl.where(q_ok, tok[0] * inv_l, 0.0), mask=f_in)
    if STATS[PREFIX_MATCH_MASS]:
        tl.store(Stats[PrefixMatchMass] + stat_row, tl.where(q_ok, tok[1] * inv_l, 0.0), mask=f_in)
    if STATS[DUPLICATE_MASS_NORM]:
        tl.store(Stats[DuplicateMassNorm] + stat_row, tl.where(q_ok, tok[4] * inv_s, 0.0), mask=f_in)
    if STATS[PREFIX_MATCH_MASS_NORM]:
        tl.store(Stats[PrefixMatchMassNorm] + stat_row, tl.where(q_ok, tok[5] * inv_s, 0.0), mask=f_in)
    # -- offset mass: p_{i, i+o} = 2^(z_{i, i+o} - m) / l from a shifted K row, 0 outside the row's band
    for o in range(0, n_offsets):
        off = tl.load(Offsets + o)
        kr = pos + off  # (BLOCK_M,) key positions
        # the offset's window test is a scalar: a select, not `&` (Triton 3.9's interpreter turns a block mask
        # & a scalar condition into int32, which tl.load refuses as a mask; compiled, both are one predicate)
        inside = tl.where((off >= -win_left) & (off <= win_right), (kr >= 0) & (kr < L), False)
        # q . k_{i+o} in slices of OFFSET_DK columns, q again from memory: a whole (BLOCK_M, BLOCK_D) fp32 q
        # and K row would take 2 BLOCK_M BLOCK_D / (32 num_warps) registers (128 at D = 128), or q's kept
        # through the loop 32 more
        z_o = tl.zeros([BLOCK_M], dtype=tl.float32)
        for d0 in tl.static_range(0, BLOCK_D, OFFSET_DK):
            offs_dk = d0 + tl.arange(0, OFFSET_DK)
            dk_in = offs_dk < HEAD_DIM
            q_o = tl.load(Q_rows + (g * stride_qh + pos * stride_ql)[:, None] + offs_dk[None, :] * stride_qd,
                          mask=f_in[:, None] & dk_in[None, :], other=0.0)  # (BLOCK_M, OFFSET_DK)
            k_o = tl.load(K_ptr + kr[:, None] * stride_kl + offs_dk[None, :] * stride_kd,
                          mask=inside[:, None] & dk_in[None, :], other=0.0)  # (BLOCK_M, OFFSET_DK)
            z_o += tl.sum(q_o.to(tl.float32) * k_o.to(tl.float32), 1)
        z_o = tl.where(tl.load(Valid_ptr + kr * stride_ml, mask=inside, other=0) != 0, z_o * qk_scale, FMIN)
        p_o = tl.math.exp2(z_o - m_i)  # (BLOCK_M,) unnormalised
        tl.store(Stats[OffsetMass] + stat_row + o, tl.where(inside & q_ok, p_o * inv_l, 0.0), mask=f_in)
        if STATS[OFFSET_MASS_NORM]:  # its twin p_{i, i+o} n_{i+o} / s; n_{i+o} in the row's head's norm column
            n_o = tl.load(N_ptr + kr * NORM_F + g * NORM_W + NORM_W - 1, mask=inside, other=0.0).to(tl.float32)
            tl.store(Stats[OffsetMassNorm] + stat_row + o, tl.where(inside & q_ok, p_o * n_o * inv_s, 0.0),
                     mask=f_in)


# True when this module was imported under TRITON_INTERPRET=1 (the kernel runs on CPU tensors)
INTERPRETED = not isinstance(attn_stats_fwd, triton.runtime.jit.JITFunction)
