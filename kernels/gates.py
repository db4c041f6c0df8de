"""Head gating, shared by the CPU backends (the Triton kernel does it in its epilogue)."""
from __future__ import annotations

import torch

from .spec import Gate


def apply_gates(out, v, key_valid, gates):
    """Replace the output of ZERO heads by 0 and of UNIFORM heads by the mean of V.

    out, v:    (B, H, L, D)
    key_valid: (B, L) bool
    gates:     (H,) int tensor of `Gate` values, or None (all KEEP)
    The mean runs over valid keys only: uniform attention over padding would leak it.
    """
    if gates is None or bool((gates == Gate.KEEP).all()):
        return out
    gates = gates.to(out.device)
    zero = (gates == Gate.ZERO)[None, :, None, None]  # (1, H, 1, 1)
    uniform = (gates == Gate.UNIFORM)[None, :, None, None]
    w = key_valid.to(v.dtype)  # (B, L)
    mean_v = torch.einsum("bl,bhld->bhd", w, v) / w.sum(-1).clamp_min(1)[:, None, None]  # (B, H, D)
    out = torch.where(zero, torch.zeros_like(out), out)
    return torch.where(uniform, mean_v[:, :, None, :].expand_as(out), out)
