"""The triton backend: the fused forward kernel and the passes that reuse its row log-sum-exp.

One kernel serves every `AttentionLayout` (`triton_kernel.attn_stats_fwd`: plain encoders,
causal, windowed and grouped-query decoders); its host side is `triton_launch.py` (operands built
once per batch, no device sync per call) and its tiles per target `triton_config.py`. The
statistics that need a second look at the attention map (column mass, word maps) are passes of
their own over the keys (`triton_maps.py`) that reuse the forward's lse instead of a row pass;
they stay opt-in. The kernel has no backward: with a gradient to compute,
`bertscope.models.attention` takes the output from SDPA instead.

On a machine without a GPU the kernels run on CPU tensors through Triton's interpreter when
TRITON_INTERPRET=1 is set before this module is imported.
"""
from __future__ import annotations

import torch

from . import triton_maps
from .common import finish_stats, keep_qk, require_pooling
from .gates import gated_sdpa
from .spec import PLAIN, ROW_STATS, AttentionLayout, RowStats, StatsSpec, WordPooling, asked_stats, refuse_unsupported
from .streaming import add_streaming_stats
from .triton_config import HALF_DTYPES, POSITION_STATS, forward_config
from .triton_kernel import INTERPRETED, attn_stats_fwd
from .triton_launch import check_computed as _check_computed
from .triton_launch import fused_forward, kernel_outputs, output_argument
from .triton_tiles import DTYPES


def fused_attention(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None,
                    blocks: dict | None = None):
    """One launch for the plain (encoder) layout: (out (B, L, H, D), {statistic: fp32 tensor}, lse
    (B, H, L) fp32); see `triton_launch.fused_forward`."""
    return fused_forward(q, k, v, key_valid, key_class, spec, PLAIN, gates, scale, blocks)


def fused_attention_layout(q, k, v, key_valid, key_class, spec: StatsSpec, layout: AttentionLayout, gates=None,
                           scale=None, blocks: dict | None = None):
    """One launch for any `AttentionLayout` (causal and windowed bands, grouped-query heads
    stacked in a tile's rows): (out (B, L, H, D), statistics, lse (B, H, L) fp32); the lse of a
    row that sees no key (a padding query under left padding) is finite."""
    return fused_forward(q, k, v, key_valid, key_class, spec, layout, gates, scale, blocks)


def check_computed(spec: StatsSpec):
    """A NotImplementedError, before any launch, for a statistic `spec` asks for that neither the
    kernel nor a pass of `EXTRA_PASSES` computes."""
    _check_computed(spec, EXTRA_STATS)


def attention_stats_triton(q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None,
                           pooling: WordPooling | None = None, layout: AttentionLayout = PLAIN,
                           blocks: dict | None = None, token_ids=None, norms=None):
    """Same contract as `attention_stats_eager`: (out (B, L, H, D), RowStats), padding-query
    rows of every row statistic zeroed. Statistics are those of the un-gated attention.
    One kernel for every layout (`triton_kernel.attn_stats_fwd`); blocks overrides its tiles
    (tests run several on the same inputs).

    The fused kernel gives the row statistics; what it does not compute (column mass, word
    maps, kept q/k) is added by `_extras` from the kernel's row lse. A statistic of the table
    that neither computes is a NotImplementedError before the launch (`check_computed`); so is a
    statistic the table says the kernel does not compute yet (`refuse_unsupported`: the norm-based
    twins of the distance, position and token statistics). norms: (B, H, L) the keys' value norms,
    needed when spec.norms (the twins of the class and offset masses, `weighted_norm`).
    """
    refuse_unsupported(spec, "triton")
    check_computed(spec)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    need_lse = any(stat.switch in EXTRA_PASSES for stat in asked_stats(spec))  # a pass after the kernel reads it
    out, rows, lse = fused_forward(q, k, v, key_valid, key_class, spec, layout, gates, scale, blocks, need_lse,
                                   token_ids, norms)
    stats = RowStats(**rows, layout=layout)
    _extras(spec, stats, q, k, key_valid, lse, scale, pooling, layout)
    if spec.streaming:  # from the un-gated output: the kernel's when no gate changed it, else SDPA's (no map)
        gated = gates is not None and (gates.xi is not None or gates.uniform is not None)
        o = gated_sdpa(q, k, v, key_valid, None, scale, layout=layout) if gated else out
        add_streaming_stats(stats, spec, q, k, v, o.transpose(1, 2), key_valid, layout, scale)
    return out, finish_stats(stats, spec, key_valid, "triton", rows_zeroed=True)  # the kernel wrote padding rows


def _column_mass(stats: RowStats, q, k, key_valid, lse, scale, pooling, layout):
    stats.column_mass = triton_maps.column_mass_triton(q, k, key_valid, lse, scale, out_dtype=torch.float32,
                                                       layout=layout)


def _word_maps(stats: RowStats, q, k, key_valid, lse, scale, pooling, layout):
    stats.word_map, stats.word_argmax = triton_maps.word_maps_triton(
        q, k, key_valid, lse, require_pooling(pooling), scale, out_dtype=torch.float32, layout=layout)


# the passes of their own that compute the table's whole-map statistics (`pass_kind` "maps") from the fused
# kernel's lse (kernels/triton_maps.py), by the StatsSpec switch that asks for them (one pass may give several)
EXTRA_PASSES = {"column_mass": _column_mass, "word_maps": _word_maps}
# the statistics they give, and those computed after the kernel from its output (`pass_kind` "streaming",
# `kernels.streaming`: the gathered sink + recent keys)
EXTRA_STATS = tuple(s.name for s in ROW_STATS if s.pass_kind in ("maps", "streaming"))


def _extras(spec: StatsSpec, stats: RowStats, q, k, key_valid, lse, scale, pooling, layout: AttentionLayout = PLAIN):
    """HOOK: the statistics beyond the fused kernel's, from its row lse (B, H, L) fp32.

    Each pass of `EXTRA_PASSES` whose switch the spec turns on runs once, however many statistics it
    gives: column mass and word maps are separate Triton passes (kernels/triton_maps.py) that
    re-derive p_ij = exp(s_ij - lse_i) tile by tile; keep_qk hands q and k on as views. A
    statistic of the table that neither the kernel nor a pass here computes fails loudly before
    the launch (`check_computed`) and again in `finish_stats`, rather than coming back as a
    silently missing statistic.
    """
    for switch, run in EXTRA_PASSES.items():
        if getattr(spec, switch):
            run(stats, q, k, key_valid, lse, scale, pooling, layout)
    keep_qk(stats, q, k, scale, spec)


__all__ = ["attention_stats_triton", "fused_attention", "fused_attention_layout", "forward_config", "kernel_outputs",
           "output_argument", "check_computed", "attn_stats_fwd", "INTERPRETED", "DTYPES", "HALF_DTYPES",
           "POSITION_STATS"]
