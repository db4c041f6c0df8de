"""The syntax probe's figures: best head per relation, and every head's accuracy per relation."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertscope.analyses.probes.syntax.stats import (
    ALL,
    DIRECTIONS,
    HEATMAP_RELATIONS,
    SD_LABELS,
)
from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: `bertscope probes syntax` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def plot_best_heads(table_rows: Sequence[dict], title: str, min_count: int = 100):
    """Bars per relation: best head's accuracy in each direction next to the fixed-offset
    baseline. Returns the matplotlib figure."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {}
    for row in table_rows:
        if row["n"] >= min_count:
            rows.setdefault(row["relation"], {})[row["direction"]] = row
    names = list(rows)
    x = np.arange(len(names))
    width = 0.27
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(names) + 2), 4.6))
    colours = ("#0072B2", "#E69F00", "#999999")
    for j, d in enumerate(DIRECTIONS):
        acc = [100 * rows[r][d]["accuracy"] for r in names]
        ax.bar(x + (j - 1) * width, acc, width, label=f"best head, {d}", color=colours[j])
    base = [100 * rows[r][DIRECTIONS[0]]["baseline_accuracy"] for r in names]
    ax.bar(x + width, base, width, label="best fixed offset", color=colours[2])
    labels = []
    for r in names:
        best = max(DIRECTIONS, key=lambda d: rows[r][d]["accuracy"])
        name = "all (non-root)" if r == ALL else r
        labels.append(f"{name}  {rows[r][best]['best_head']}")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=50, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{title}\n(tick: relation and its best head, layer-head from 1)", fontsize=10)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.1), ncol=3, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig

def plot_relation_heatmaps(head_rows: Sequence[dict], title: str, relations=HEATMAP_RELATIONS,
                           direction: str = "dep->head"):
    """Layer x head accuracy grids for a few key relations (one panel each)."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grids = {}
    for row in head_rows:
        if row["direction"] == direction and row["relation"] in relations:
            grids.setdefault(row["relation"], {})[(row["layer"], row["head"])] = row["accuracy"]
    names = [r for r in relations if r in grids]
    n_layers = max((k[0] for g in grids.values() for k in g), default=1)
    n_heads = max((k[1] for g in grids.values() for k in g), default=1)
    cols = min(4, max(1, len(names)))
    nrows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 0.35 * n_layers * nrows + 1.4 * nrows), squeeze=False,
                             layout="constrained")
    image = None
    for ax in axes.flat:
        ax.set_visible(False)
    for ax, r in zip(axes.flat, names):
        ax.set_visible(True)
        grid = np.full((n_layers, n_heads), np.nan)
        for (layer, h), acc in grids[r].items():
            grid[layer - 1, h - 1] = 100 * acc
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
        ax.set_title(f"{r} ({SD_LABELS.get(r, '-')})", fontsize=9)
        layer_head_ticks(ax, n_layers, n_heads, fontsize=6, label_size=8)
        layer, h = np.unravel_index(np.nanargmax(grid), grid.shape)
        ax.text(h, layer, f"{grid[layer, h]:.0f}", ha="center", va="center", fontsize=6, color="black",
                bbox=dict(boxstyle="round,pad=0.1", fc="white", alpha=0.7))
    fig.suptitle(f"{title}: accuracy per head ({direction}), best head labelled", fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="accuracy (%)")
    return fig
