"""Figures of `bertscope relations`: layer x head heatmaps per group, and example word maps."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertscope.analyses.relations.stats import flag_heads
from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: `bertscope relations` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def _plt():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_heatmaps(means: np.ndarray, groups: Sequence[str], n: Sequence[int], title: str, note: str = "",
                  adjacent: np.ndarray | None = None):
    """One layer x head panel per group (means: (G, layers, H)). Heads above the 99th
    percentile are boxed in red; with `adjacent` ((layers, H) bool), previous/next-token
    heads carry a white dot."""
    from matplotlib.patches import Rectangle  # see the module note

    plt = _plt()
    keep = [g for g in range(len(groups)) if n[g] > 0]
    G, (L, H) = len(keep), means.shape[1:]
    cols = min(3, max(1, G))
    rows = -(-G // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 0.42 * L * rows + 1.3 * rows + 0.6), squeeze=False,
                             layout="constrained")
    for ax in axes.flat:
        ax.set_visible(False)
    for ax, g in zip(axes.flat, keep):
        ax.set_visible(True)
        grid = means[g]
        image = ax.imshow(grid, cmap="viridis", vmin=0, aspect="auto")
        fig.colorbar(image, ax=ax, shrink=0.8)
        for layer, head in np.argwhere(flag_heads(grid)):
            ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, ec="red", lw=2))
            ax.text(head, layer, f"{grid[layer, head]:.2f}", ha="center", va="center", fontsize=6, color="white")
        if adjacent is not None:
            ys, xs = np.nonzero(adjacent)
            ax.scatter(xs, ys + 0.3, s=6, c="white", marker="o")
        ax.set_title(f"{groups[g]} (n={n[g]})", fontsize=9)
        layer_head_ticks(ax, L, H, fontsize=6, label_size=8)
    fig.suptitle(title + ("\n" + note if note else ""), fontsize=9)
    return fig


def plot_example_maps(maps: np.ndarray, words: Sequence[str], heads: Sequence[tuple[int, int]],
                      links: Sequence[tuple[int, int]], title: str, both: bool = True):
    """The word-level maps (maps: (layers, H, W, W), words first, then special tokens) of a
    few heads on one input; the gold links' cells (and their transposes with `both`) are
    boxed in red."""
    from matplotlib.patches import Rectangle  # see the module note

    plt = _plt()
    W = maps.shape[-1]
    labels = list(words) + ["[CLS]", "[SEP]", "[SEP]"][: W - len(words)]
    # the engine's units: words first, then the specials in token order ([CLS] first)
    fig, axes = plt.subplots(1, len(heads), figsize=(0.28 * W * len(heads) + 1.5, 0.28 * W + 1.6), squeeze=False,
                             layout="constrained")
    for ax, (layer, head) in zip(axes.flat, heads):
        ax.imshow(maps[layer, head], cmap="Greys", vmin=0, vmax=1)
        for a, b in links:
            cells = [(a, b), (b, a)] if both else [(a, b)]
            for r, c in cells:
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=1.2))
        ax.set_title(f"head {layer + 1}-{head + 1}", fontsize=9)
        ax.set_xticks(range(W))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_yticks(range(W))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlabel("attended word", fontsize=8)
        ax.set_ylabel("attending word", fontsize=8)
    fig.suptitle(title, fontsize=9)
    return fig
