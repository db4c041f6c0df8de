"""The reference: attention maps and the statistics read off them, by their definitions.

One module for the oracle's arithmetic, so that the eager backend, the tests, the tools and
the benchmarks read statistics off a map the same way and none of them re-derives one:

    visible_probs(q, k, key_valid, layout, scale)   the (B, H, L, L) probability maps, keys a row
                                                    may not see (padding, outside its band) at 0
    stats_from_probs(p, key_valid, key_class, spec, layout, pooling)
                                                    every statistic `spec` asks for, as `RowStats`

A per-row statistic is defined once, by its table entry's `from_probs` (`kernels/spec.py`),
called here on each sequence's whole map (i0 = k0 = 0); the whole-map statistics (column mass,
word maps) are defined here. Written for obvious correctness, not speed: it holds every map.
"""
from __future__ import annotations

import torch

from . import spec as _spec
from .common import finish_stats, require_pooling
from .pooling import pool_map, word_argmax
from .spec import PLAIN, AttentionLayout, KeyBlock, RowStats, StatsSpec, WordPooling, padded_ids, visible_mask


def visible_probs(q, k, key_valid, layout: AttentionLayout = PLAIN, scale=None) -> torch.Tensor:
    """softmax(q k^T * scale) over the keys each query sees: (B, H, L, L).

    q: (B, H, L, D); k: (B, H_kv, L, D) (query head h reads key head h // (H / H_kv)); key_valid: (B, L).
    Keys a row may not see get the most negative finite score, not -inf, so that a row that sees
    no key at all (a padding query, or one under causal left padding) is uniform, not NaN; every
    other row gives them exactly 0.
    """
    D = q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    k_h = k.repeat_interleave(layout.group_size(q.shape[1]), dim=1)  # (B, H, L, D): head h's keys
    s = torch.matmul(q, k_h.transpose(-1, -2)) * scale  # (B, H, L, L)
    return torch.softmax(s.masked_fill(~visible_mask(key_valid, layout), torch.finfo(s.dtype).min), dim=-1)


def stats_from_probs(p, key_valid, key_class, spec: StatsSpec, layout: AttentionLayout = PLAIN,
                     pooling: WordPooling | None = None, backend: str = "eager", token_ids=None,
                     norms=None) -> RowStats:
    """Every statistic of the table that `spec` asks for, read off the maps p (B, H, L, L).

    key_valid: (B, L) bool; key_class: (B, L) int64; pooling: needed when spec.word_maps;
    token_ids: (B, L) int64, needed when spec.token_relations; norms: (B, H, L) each key's value norm
    per head, needed when spec.norms (the twins are their bases' definitions on p_ij n_j / sum_j p_ij n_j).
    Rows of padding queries hold the table's `padding` value; a statistic of the table with no
    definition (neither `from_probs` nor a whole-map one below) is a NotImplementedError.
    """
    B, H, L, _ = p.shape
    stats = RowStats(layout=layout)
    ids = None if token_ids is None else padded_ids(token_ids, key_valid)  # (B, L), padding -1
    for stat in _spec.ROW_STATS:
        if stat.from_probs is None or not stat.asked(spec):
            continue
        rows = [stat.from_probs(p[b], 0, 0, KeyBlock(key_valid[b], key_class[b], L, spec, _row(ids, b),
                                                                _row(norms, b)))
                for b in range(B)]
        setattr(stats, stat.name, torch.stack(rows))  # (B, H, L, ...)
    if spec.column_mass:
        stats.column_mass = (p * key_valid[:, None, :, None]).sum(-2)  # (B, H, L): over valid query rows
    if spec.word_maps:
        stats.word_map = pool_map(p, require_pooling(pooling))  # (B, H, W, W)
        stats.word_argmax = word_argmax(stats.word_map, pooling.candidate)  # (B, H, W)
    return finish_stats(stats, spec, key_valid, backend)


def _row(t, b):
    return None if t is None else t[b]
