"""The backends of the attention statistics, and the one entry point that picks between them.

bertscope.kernels is a folder of modules, not a package with an `__init__`: the contract
is `spec.py`, and each backend has its own module:

    eager    materialises every map; the oracle the others are tested against (`eager.py`)
    chunked  the CPU fast path: one loop over blocks of scores (whole maps of a few heads for an
             encoder, query blocks against their key band under a causal / windowed /
             grouped-query layout), statistics fused into the row pass (`chunked.py`)
    triton   the fused GPU kernel (`triton_attention.py`); on a CPU only through Triton's
             interpreter (TRITON_INTERPRET=1, slow: for tests)

`attention_stats` picks one by name; "auto" takes the fastest one available for the
tensors' device: triton on CUDA when triton is installed, chunked otherwise. Why the folder
has no `__init__.py`: docs/architecture.md ("The top-level folders").
"""
from __future__ import annotations

import importlib.util
import os

import torch

from . import cpu_rows
from .chunked import attention_stats_chunked
from .eager import attention_stats_eager
from .gates import check_layer_gates, gated_sdpa, needs_grad
from .precision import fp32_dot_precision
from .spec import PLAIN, AttentionLayout, StatsSpec, WordPooling, refuse_unsupported
from .streaming import apply_streaming


def attention_stats_triton(*args, **kwargs):
    """The triton backend, imported on first use: @triton.jit decides between compiled and
    interpreted kernels when the module runs, so TRITON_INTERPRET must be set before."""
    from .triton_attention import attention_stats_triton as fn  # optional triton; see the docstring

    return fn(*args, **kwargs)


BACKENDS = {"eager": attention_stats_eager, "chunked": attention_stats_chunked, "triton": attention_stats_triton}
BACKEND_CHOICES = ("auto", *BACKENDS)  # every backend computes every `AttentionLayout`


def _triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _device_type(device) -> str:
    return torch.device(device).type


def triton_unavailable_reason(device) -> str | None:
    """Why the triton backend cannot run on `device`, or None when it can."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'bertscope[gpu]')"
    if _device_type(device) != "cuda" and not _triton_interpret():
        return (f"it needs a CUDA device, not {_device_type(device)} "
                "(TRITON_INTERPRET=1 runs it on the CPU through Triton's interpreter, slowly: for tests)")
    return None


def resolve_backend(name: str, device) -> str:
    """The backend that `name` means on `device`; raises ValueError for one not available."""
    if name == "auto":
        is_cuda = _device_type(device) == "cuda"
        return "triton" if is_cuda and triton_unavailable_reason(device) is None else "chunked"
    if name == "triton":
        reason = triton_unavailable_reason(device)
        if reason is not None:
            raise ValueError(f"the triton backend is not available here: {reason}; use chunked or eager")
        return name
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_CHOICES)}")
    return name


def describe_backend(name: str, device) -> dict:
    """What `name` runs on `device`, for run.json: the backend and, for chunked, its row pass; for
    triton its mode, version and the precision of its float32 dots (`fp32_dot_precision`: "ieee"
    or "tf32", as torch's float32 matmul precision says when the run starts)."""
    backend = resolve_backend(name, device)
    info = {"backend": backend}
    if backend == "chunked":
        reason = cpu_rows.unavailable_reason()
        info["row_pass"] = "compiled (cpu_rows.c)" if reason is None else f"torch ({reason})"
    if backend == "triton":
        import triton  # as in attention_stats_triton: optional, and imported after TRITON_INTERPRET is set

        from . import triton_attention

        info["mode"] = "interpreter (TRITON_INTERPRET=1)" if triton_attention.INTERPRETED else "compiled"
        info["triton"] = triton.__version__
        info["fp32_dot"] = fp32_dot_precision()
    return info


def attention_stats(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None, backend="auto",
                    pooling: WordPooling | None = None, layout: AttentionLayout = PLAIN, token_ids=None,
                    norms=None):
    """Attention output (B, L, H, D) and `RowStats` for q, k, v of shape (B, H, L, D).

    gates: the layer's `LayerGates` (head scale xi, uniform heads, streaming heads), or None.
    They change the output only; the statistics describe the un-gated heads. Streaming heads
    (`kernels.streaming.apply_streaming`) are applied here, after whichever backend ran.

    The output has q's dtype; the statistics are float32 whatever it is (half-precision
    backends' statistics are cast here, before any accumulator sees them).

    Gradients: the fast paths cannot be differentiated (chunked writes with out= and its C
    row pass; the Triton kernel has no backward). When autograd needs the output
    (`needs_grad`), the backend computes the statistics without grad and the output comes
    from `gated_sdpa`, so d loss / d (q, k, v, xi) is exact; `output_path` names the choice.

    layout: which keys each query may see and how q and k heads pair up (`AttentionLayout`);
    k and v have layout.n_key_value_heads heads (H without grouped-query attention).

    token_ids: (B, L) int64 token ids of the batch, needed when spec.token_relations (queries and
    keys are the same tokens: one tensor per batch, handed to every layer).

    norms: (B, H, L) each key's value norm per query head, needed when spec.norms (the norm-based
    twins, computed by eager and chunked only: `refuse_unsupported` says so in one line for triton).
    """
    name = resolve_backend(backend, q.device)
    refuse_unsupported(spec, name)
    check_layout(layout, q, k)
    check_layer_gates(gates, q.shape[0], q.shape[1])
    fn = BACKENDS[name]
    if not needs_grad(q, k, v, gates):
        out, stats = fn(q, k, v, key_valid, key_class, spec, gates=gates, scale=scale, pooling=pooling, layout=layout,
                        token_ids=token_ids, norms=norms)
        if gates is not None and gates.streaming is not None:  # streaming heads: after every backend, in one place
            out = apply_streaming(out.transpose(1, 2), q, k, v, key_valid, gates, scale, layout).transpose(1, 2)
        return out, stats.as_float32()
    with torch.no_grad():
        _, stats = fn(q.detach(), k.detach(), v.detach(), key_valid, key_class, spec, scale=scale, pooling=pooling,
                      layout=layout, token_ids=token_ids, norms=norms)
    return gated_sdpa(q, k, v, key_valid, gates, scale, layout=layout), stats.as_float32()


def check_layout(layout: AttentionLayout, q, k):
    """A ValueError unless `layout` fits q (B, H, L, D) and k (B, H_kv, L, D): k must have
    layout.n_key_value_heads heads (H without grouped-query attention), a divisor of H."""
    H, H_kv = q.shape[1], k.shape[1]
    expected = layout.n_key_value_heads or H
    if H_kv != expected:
        raise ValueError(f"k has {H_kv} heads; the layout says {expected} key/value heads for {H} query heads")
    layout.group_size(H)  # a ValueError when they do not divide evenly


def output_path(backend: str, grad: bool) -> str:
    """Where `attention_stats` takes the output from (for run.json): the backend's fused
    pass, or, when a gradient is needed, SDPA with autograd beside statistics without grad."""
    if grad:
        return f"sdpa with autograd (statistics: {backend}, without grad)"
    return f"{backend} (output fused with the statistics)"


__all__ = ["BACKENDS", "BACKEND_CHOICES", "attention_stats", "attention_stats_triton", "check_layout",
           "describe_backend", "output_path", "resolve_backend", "triton_unavailable_reason"]
