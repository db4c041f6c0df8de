"""A plain flash-attention forward without statistics: the baseline of the fused kernel's budget.

Written in the pattern of Triton's fused-attention tutorial (06-fused-attention): one program per
BLOCK_M query rows of one (batch, head), an online softmax in the exp2 domain with log2(e) folded
into the scale (one FFMA and one MUFU.EX2 per score), the causal diagonal as a constexpr stage, P
cast to the input dtype for P V. No padding, no statistics, no gates: what a flash loop costs, so
that `python -m bertscope.kernels.triton_aot --baseline` can compile it exactly as it compiles the
statistics kernel and compare their main loops (`kernels/triton_sass.py`).

    python bench/flash_baseline.py        # under TRITON_INTERPRET=1 on a CPU: checks it against SDPA

It takes (B, H, L, D) contiguous fp16 / bf16 q, k, v with L a multiple of BLOCK_M and BLOCK_N.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# the tiles the AOT report compiles it at (the tutorial's forward configurations): (BLOCK_M, BLOCK_N, warps, stages)
TILES = ((128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 4, 3), (64, 64, 4, 3))


@triton.jit
def _inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, start_m, qk_scale, lo, hi, stride_kn, stride_vn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr):
    """Key blocks [lo, hi): the unmasked ones, or (DIAGONAL) the causal diagonal's."""
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        k = tl.load(K_ptrs + start_n * stride_kn)  # (D, BLOCK_N)
        qk = tl.dot(q, k)  # (BLOCK_M, BLOCK_N) fp32
        if DIAGONAL:
            qk = qk * qk_scale + tl.where(offs_m[:, None] >= (start_n + offs_n[None, :]), 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_ptrs + start_n * stride_vn)  # (BLOCK_N, D)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def flash_fwd(Q, K, V, Out, sm_scale, stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn,
              stride_oh, stride_om, L,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch x head) map (the flattened B * H axis)."""
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :])  # (BLOCK_M, D)
    K_ptrs = K + off_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None]  # (D, BLOCK_N)
    V_ptrs = V + off_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]  # (BLOCK_N, D)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e) folded in
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = start_m * BLOCK_M if CAUSAL else L  # the unmasked stage: every key block below the diagonal
    acc, l_i, m_i = _inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, start_m, qk_scale, 0, hi, stride_kn, stride_vn,
                           BLOCK_M, BLOCK_N, False)
    if CAUSAL:  # the diagonal's blocks, masked
        acc, l_i, m_i = _inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, start_m, qk_scale, hi, hi + BLOCK_M, stride_kn,
                               stride_vn, BLOCK_M, BLOCK_N, True)
    acc = acc / l_i[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(Out.dtype.element_ty))


def flash_attention(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64, num_warps: int = 4):
    """softmax(q k^T / sqrt(D)) v for (B, H, L, D) contiguous q, k, v (L a multiple of the blocks)."""
    B, H, L, D = q.shape
    q, k, v = (t.reshape(B * H, L, D) for t in (q, k, v))
    out = torch.empty_like(q)
    grid = (triton.cdiv(L, block_m), B * H)
    flash_fwd[grid](q, k, v, out, D**-0.5, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                    v.stride(1), out.stride(0), out.stride(1), L, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=D,
                    CAUSAL=causal, num_warps=num_warps)
    return out.reshape(B, H, L, D)


def ast_source(D: int, dtype: str, causal: bool, block_m: int, block_n: int):
    """The ASTSource `triton_aot` compiles, specialised as a launch on 16-aligned tensors would be."""
    from triton.compiler import ASTSource

    sig = {"Q": f"*{dtype}", "K": f"*{dtype}", "V": f"*{dtype}", "Out": f"*{dtype}", "sm_scale": "fp32"}
    for name in flash_fwd.arg_names:
        sig.setdefault(name, "i32")
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "HEAD_DIM": D, "CAUSAL": causal}
    for name in constexprs:
        sig[name] = "constexpr"
    aligned = [n for n in flash_fwd.arg_names if n not in constexprs and n not in ("sm_scale", "L")]
    attrs = {(flash_fwd.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return ASTSource(fn=flash_fwd, signature=sig, constexprs=constexprs, attrs=attrs)


if __name__ == "__main__":
    torch.manual_seed(0)
    for causal in (False, True):
        q, k, v = (torch.randn(2, 3, 128, 32) for _ in range(3))
        got = flash_attention(q.half(), k.half(), v.half(), causal=causal).float()
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        print(f"causal={causal}: max |flash - SDPA| = {(got - want).abs().max():.2e}")
