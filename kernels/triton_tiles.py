"""Pieces every bertscope Triton kernel shares: which (b, h) map a program owns, the masked
scores of one key block, a tile's probabilities from the row lse (`tile_probs`), the padding
fill FMIN and the int8 key mask the kernels read. Kept apart so the kernels agree on both by construction
(`eager`'s conventions: padding keys at the most negative finite float, so a sequence with
no valid key gets uniform rows; keys past the row end at -inf, so they are no key at all).
"""
import torch
import triton
import triton.language as tl

# the input dtypes every kernel takes (scores, probabilities and sums are fp32 whatever they are)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# the most negative finite float32, torch.finfo(torch.float32).min: the score of a padding key
FMIN = tl.constexpr(-3.4028234663852886e38)


@triton.jit
def map_base(Q, K, KeyValid, stride_qb, stride_qh, stride_kb, stride_kh, stride_mb, H):
    """Program axis 1 is one (b, h) map: its flat index b*H + h, b, h, and the base pointers
    of its queries, keys and key mask."""
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    Q_ptr = Q + off_b * stride_qb + off_h * stride_qh
    K_ptr = K + off_b * stride_kb + off_h * stride_kh
    return off_bh, off_b, off_h, Q_ptr, K_ptr, KeyValid + off_b * stride_mb


@triton.jit
def key_block_scores(q, K_ptr, Valid_ptr, offs_n, offs_d, stride_kl, stride_kd, stride_ml, sm_scale, L, D, FMIN,
                     IS_FP32: tl.constexpr):
    """Scaled scores (BLOCK_M, BLOCK_N) of the query tile q (BLOCK_M, BLOCK_D) against keys
    offs_n, with the keys' validity kv and range n_in (BLOCK_N,)."""
    n_in = offs_n < L
    k = tl.load(K_ptr + offs_n[None, :] * stride_kl + offs_d[:, None] * stride_kd,
                mask=n_in[None, :] & (offs_d < D)[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
    if IS_FP32:
        s = tl.dot(q, k, input_precision="ieee")  # (BLOCK_M, BLOCK_N); exact fp32, not tf32
    else:
        s = tl.dot(q, k, out_dtype=tl.float32)  # (BLOCK_M, BLOCK_N), fp16 / bf16 in, fp32 out
    kv = tl.load(Valid_ptr + offs_n * stride_ml, mask=n_in, other=0) != 0  # (BLOCK_N,)
    s = tl.where(kv[None, :], s * sm_scale, FMIN)  # padding keys: finite fill, as eager
    s = tl.where(n_in[None, :], s, float("-inf"))  # past the row end: no key at all
    return s, kv, n_in


@triton.jit
def tile_probs(q, k, lse, kv, n_in, sm_scale, L, FMIN, IS_FP32: tl.constexpr):
    """p = exp(s - lse) of one tile from q (BLOCK_M, BLOCK_D), k (BLOCK_D, BLOCK_N), the
    rows' lse (BLOCK_M,), the keys' validity kv and range n_in (BLOCK_N,)."""
    if IS_FP32:
        s = tl.dot(q, k, input_precision="ieee")  # (BLOCK_M, BLOCK_N)
    else:
        s = tl.dot(q, k, out_dtype=tl.float32)  # (BLOCK_M, BLOCK_N), fp16 / bf16 in, fp32 out
    s = tl.where(kv[None, :], s * sm_scale, FMIN)  # padding keys: finite fill, as eager
    p = tl.exp(s - lse[:, None])
    # -- a sequence with no valid key: uniform rows (lse = FMIN + ln L rounds to FMIN)
    p = tl.where((lse < 0.5 * FMIN)[:, None], 1.0 / L, p)
    return tl.where(n_in[None, :], p, 0.0)  # (BLOCK_M, BLOCK_N); 0 past the row end


@triton.jit
def in_band(offs_m, offs_n, win_left, win_right):
    """(BLOCK_M, BLOCK_N): query offs_m sees key offs_n by position, i - win_left <= j <= i + win_right
    (`AttentionLayout.key_band`; the kernels take L for a side without limit)."""
    return (offs_n[None, :] >= offs_m[:, None] - win_left) & (offs_n[None, :] <= offs_m[:, None] + win_right)


def mask_int8(key_valid, dev):
    """(B, L) key mask as int8 without a copy when it is already bool on the device."""
    key_valid = key_valid.to(dev)
    return key_valid.view(torch.int8) if key_valid.dtype == torch.bool else (key_valid != 0).view(torch.int8)


def launch_caps(cfg: dict) -> dict:
    """The launch options beyond warps and stages that a kernel's config may carry: `maxnreg`,
    ptxas's register cap per thread (a config without it launches exactly as before)."""
    return {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") is not None else {}


@triton.jit
def sliced_probs(Q_ptr, K_ptr, offs_m, offs_n, m_in, n_in, lse, kv, sm_scale, L, D, FMIN, stride_ql, stride_qd,
                 stride_kl, stride_kd, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DK: tl.constexpr):
    """`tile_probs` for fp32 q, k read from memory: the scores q . k (BLOCK_M, BLOCK_N) summed over
    D in BLOCK_DK-wide slices, each slice of q and k loaded where it is used, so that an exact
    FMA dot holds 2 x BLOCK_DK operand values per thread instead of 2 x BLOCK_D (see
    triton_maps.word_map_config)."""
    s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_D, BLOCK_DK):
        offs_d = d0 + tl.arange(0, BLOCK_DK)
        d_in = offs_d < D
        q = tl.load(Q_ptr + offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
                    mask=m_in[:, None] & d_in[None, :], other=0.0)  # (BLOCK_M, BLOCK_DK)
        k = tl.load(K_ptr + offs_n[None, :] * stride_kl + offs_d[:, None] * stride_kd,
                    mask=n_in[None, :] & d_in[:, None], other=0.0)  # (BLOCK_DK, BLOCK_N)
        s = tl.dot(q, k, s, input_precision="ieee")
    s = tl.where(kv[None, :], s * sm_scale, FMIN)  # padding keys: finite fill, as eager
    p = tl.exp(s - lse[:, None])
    p = tl.where((lse < 0.5 * FMIN)[:, None], 1.0 / L, p)  # no valid key: uniform rows
    return tl.where(n_in[None, :], p, 0.0)  # (BLOCK_M, BLOCK_N); 0 past the row end
