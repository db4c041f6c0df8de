"""Attention-statistics kernels: one contract (`spec.py`), several backends.

    eager    materialises every map; the oracle the others are tested against
    chunked  the CPU fast path: a few heads' L x L at a time, statistics fused into the pass
    triton   the GPU kernels (separate issue; not built yet)

`attention_stats` picks one by name; "auto" takes the fastest one available for the
tensors' device.
"""
from __future__ import annotations

from . import cpu_rows
from .chunked import attention_stats_chunked
from .eager import attention_stats_eager
from .pooling import word_pooling
from .spec import Gate, RowStats, StatsSpec, WordPooling

BACKENDS = {"eager": attention_stats_eager, "chunked": attention_stats_chunked}
BACKEND_CHOICES = ("auto", "eager", "chunked", "triton")


def resolve_backend(name: str, device) -> str:
    """The backend that `name` means on `device`; raises ValueError for one not available."""
    if name == "auto":
        return "chunked"
    if name == "triton":
        raise ValueError("the triton backend is not available yet (it is being built); use chunked or eager")
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_CHOICES)}")
    return name


def describe_backend(name: str, device) -> dict:
    """What `name` runs on `device`, for run.json: the backend and, for chunked, its row pass."""
    backend = resolve_backend(name, device)
    info = {"backend": backend}
    if backend == "chunked":
        reason = cpu_rows.unavailable_reason()
        info["row_pass"] = "compiled (cpu_rows.c)" if reason is None else f"torch ({reason})"
    return info


def attention_stats(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None, backend="auto",
                    pooling: WordPooling | None = None):
    """Attention output (B, L, H, D) and `RowStats` for q, k, v of shape (B, H, L, D)."""
    fn = BACKENDS[resolve_backend(backend, q.device)]
    return fn(q, k, v, key_valid, key_class, spec, gates=gates, scale=scale, pooling=pooling)


__all__ = ["attention_stats", "describe_backend", "resolve_backend", "word_pooling", "BACKENDS", "BACKEND_CHOICES",
           "Gate", "RowStats", "StatsSpec", "WordPooling"]
