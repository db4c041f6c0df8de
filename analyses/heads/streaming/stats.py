"""Streaming heads against retrieval heads (DuoAttention, Xiao et al. 2024): the pieces of
`bertscope heads streaming` that are plain arithmetic, tested on hand-built inputs.

The error. Each head's relative streaming error comes from the kernels' table in the same pass as
any other statistic (`StatsSpec.streaming = (sink, recent)`: per row ||o_i - o_L,i||^2 and ||o_i||^2,
`bertscope.kernels.streaming`), summed over every row of the corpus by `HeadStats`, and read as
sqrt(sum err^2 / sum ||o||^2) per query head or per key/value head group
(`HeadStats.streaming_error`). DuoAttention decides per key/value head (a KV cache holds key/value
heads), so the groups are what is ranked and made streaming: a group's G query heads together.

The curve. For each k the k groups of lowest error are made streaming (head gates,
`HeadGates.set_streaming`) against k random groups (seeded draws), and each variant is measured on
long text (mean next-token loss) and on the needle test of `heads retrieval` (teacher-forced: the
argmax at every answer row is the reference token). The fraction of groups that stream at no loss
is read off that curve.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def streaming_spec(loaded, sink: int, recent: int):
    """The statistics the error pass needs: the streaming error alone."""
    from bertscope.kernels.spec import StatsSpec

    return StatsSpec(streaming=(sink, recent), n_key_classes=loaded.classes.n_classes)


def rank_groups(kv_error: np.ndarray) -> list[tuple[int, int]]:
    """(layer, kv_head) pairs, lowest error first (the most streamable first); ties by position, a
    NaN (a group that saw no row) last."""
    flat = np.where(np.isnan(kv_error), np.inf, kv_error).ravel()
    order = np.lexsort((np.arange(flat.size), flat))
    n_kv = kv_error.shape[1]
    return [(int(i) // n_kv, int(i) % n_kv) for i in order]


def counts(fractions: list[float], n_groups: int) -> list[int]:
    """k = round(fraction x groups) for each fraction, distinct, ascending."""
    return sorted({int(round(f * n_groups)) for f in fractions})


def random_groups(n_layers: int, n_kv: int, k: int, draws: int, seed: int) -> list[list[tuple[int, int]]]:
    """`draws` seeded sets of k (layer, kv_head) groups drawn without replacement from all of them."""
    every = [(lay, g) for lay in range(n_layers) for g in range(n_kv)]
    rng = np.random.default_rng([seed, k, 2])
    return [sorted(every[i] for i in rng.choice(len(every), size=k, replace=False)) for _ in range(draws)]


def head_mask(groups, n_layers: int, n_heads: int, n_kv: int) -> torch.Tensor:
    """(layers, H) bool: the query heads of the given (layer, kv_head) groups (query head h reads
    key/value head h // (H / H_kv))."""
    G = n_heads // n_kv
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for lay, g in groups:
        mask[lay, g * G:(g + 1) * G] = True
    return mask


def kv_full(ranked: list[tuple[int, int]], n_streaming: int, n_layers: int, n_kv: int) -> np.ndarray:
    """(layers, H_kv) float: 1 for full attention (retrieval), 0 for the `n_streaming` groups of lowest
    error: DuoAttention's full_attention_heads values."""
    full = np.ones((n_layers, n_kv))
    for lay, g in ranked[:n_streaming]:
        full[lay, g] = 0.0
    return full


def write_pattern(folder: Path, full: np.ndarray, sink: int, recent: int, about: dict) -> Path:
    """DuoAttention's released pattern format (mit-han-lab/duo-attention, attn_patterns/...):
    full_attention_heads.tsv, one line per layer, one tab-separated value per key/value head (numpy's
    savetxt, as theirs: "%.18e"), and config.json with sink_size and recent_size (what their
    `load_attn_pattern` reads) beside what the split was made from."""
    from bertscope.analyses.heads.streaming.outputs import PATTERN_CONFIG, PATTERN_FILE

    folder.mkdir(parents=True, exist_ok=True)
    np.savetxt(folder / PATTERN_FILE, np.asarray(full, dtype=float), delimiter="\t")
    config = {"sink_size": int(sink), "recent_size": int(recent), **about}
    (folder / PATTERN_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


def read_pattern(folder: Path) -> tuple[np.ndarray, int, int]:
    """(full (layers, H_kv), sink, recent), as DuoAttention's `load_attn_pattern` reads them (values
    clipped to [0, 1])."""
    from bertscope.analyses.heads.streaming.outputs import PATTERN_CONFIG, PATTERN_FILE

    full = np.clip(np.loadtxt(folder / PATTERN_FILE, dtype=float, delimiter="\t", ndmin=2), 0, 1)
    config = json.loads((folder / PATTERN_CONFIG).read_text(encoding="utf-8"))
    return full, config["sink_size"], config["recent_size"]


def no_loss_fraction(rows: list[dict], tolerance: float, order: str = "error") -> float:
    """The largest fraction of groups streaming (by `order`) whose loss change is at most `tolerance`
    nats and whose needle token accuracy (teacher-forced answer tokens predicted) is at least the
    unablated one's, every smaller fraction too; 0.0 when the first already loses. Several rows of one
    k (random draws) count by their mean."""
    none = next(r for r in rows if r["order"] == "none")
    best = 0.0
    for k in sorted({r["k"] for r in rows if r["order"] == order}):
        at = [r for r in rows if r["order"] == order and r["k"] == k]
        loss = float(np.mean([r["delta_loss"] for r in at]))
        token = float(np.mean([r["needle_token_accuracy"] for r in at]))
        if loss <= tolerance and token >= none["needle_token_accuracy"]:
            best = at[0]["fraction"]
        else:
            break
    return best
