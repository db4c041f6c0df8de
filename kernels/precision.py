"""Which precision the Triton kernels' float32 dot products run at: torch's own setting.

A float32 `tl.dot` is exact IEEE arithmetic (input_precision="ieee") or TF32 (10 bits of
mantissa kept of each operand, about 3x faster on tensor cores). bertscope does what torch does
for a float32 matmul: `torch.set_float32_matmul_precision("highest")` (torch's default) gives
exact dots, "high" or "medium" TF32; torch's per-backend setting
(`torch.backends.cuda.matmul.fp32_precision = "tf32"`, torch 2.9 on) is read when that one was
used (the legacy getter then refuses to answer). The launcher passes `fp32_dot_precision()` to
its fp32 dots; run.json records it beside the backend (`kernels.describe_backend`).
Half-precision inputs are unaffected: their dots run on tensor cores with fp32 accumulation.
"""
from __future__ import annotations

import torch

IEEE, TF32 = "ieee", "tf32"  # Triton's names (tl.dot's input_precision)


def fp32_dot_precision() -> str:
    """"ieee" (exact float32 dots) or "tf32", as torch's float32 matmul precision says now:
    "highest" -> "ieee", "high" / "medium" -> "tf32"."""
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # the new API was used (torch.backends...fp32_precision): it decides
        legacy = None
    if legacy is not None:
        return IEEE if legacy == "highest" else TF32
    matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
    if matmul == "none":  # inherits the generic setting
        matmul = getattr(torch.backends, "fp32_precision", "none")
    return TF32 if matmul == TF32 else IEEE
