"""The layer x head grid every per-head heatmap shares: rows are layers, columns heads, both
numbered from 1 as heads.csv numbers them."""
from __future__ import annotations

import numpy as np


def layer_head_ticks(ax, n_layers: int, n_heads: int, fontsize: float = 8, label_size: float | None = None) -> None:
    """Label rows as layers and columns as heads, numbered from 1 (thinned when crowded)."""
    def ticks(n):
        step = 1 if n <= 16 else -(-n // 12)
        return np.arange(0, n, step)
    rows, cols = ticks(n_layers), ticks(n_heads)
    ax.set_yticks(rows, [str(i + 1) for i in rows], fontsize=fontsize)
    ax.set_xticks(cols, [str(j + 1) for j in cols], fontsize=fontsize)
    ax.set_ylabel("layer", fontsize=label_size)
    ax.set_xlabel("head", fontsize=label_size)
    ax.tick_params(length=0)
