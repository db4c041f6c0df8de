"""Figures of `bertscope heads importance` (Michel et al. 2019): the layer x head importance
heatmap and the rank correlation between tasks (the pruning curves are `heads prune`'s own,
in bertscope.analyses.heads.prune.plots)."""
from __future__ import annotations

import numpy as np

from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: `bertscope heads importance` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def _plt():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_importance(scores: np.ndarray, ranks: np.ndarray, title: str, normalised: bool):
    """Layer x head heatmap of I_h; each cell labelled with the head's rank (1 = most important)."""
    plt = _plt()
    n_layers, n_heads = scores.shape
    fig, ax = plt.subplots(figsize=(0.5 * n_heads + 2.4, 0.45 * n_layers + 1.5))
    im = ax.imshow(scores, cmap="viridis", aspect="auto", vmin=0)
    top = np.nanmax(scores) if np.isfinite(scores).any() else 1.0
    for lay in range(n_layers):
        for h in range(n_heads):
            if ranks[lay, h]:
                ax.text(h, lay, str(ranks[lay, h]), ha="center", va="center", fontsize=6,
                        color="black" if scores[lay, h] > 0.6 * top else "white")
    layer_head_ticks(ax, n_layers, n_heads)
    fig.colorbar(im, ax=ax, label="I_h / layer L2 norm" if normalised else "I_h = E|dL/dxi_h|")
    ax.set_title(f"Head importance (Michel et al.), cells: rank (1 = most important)\n{title}", fontsize=9)
    return fig


def plot_correlation(rho: np.ndarray, labels: list[str], title: str):
    """The Spearman rank correlation of head importance between runs, as a labelled matrix."""
    plt = _plt()
    n = len(labels)
    fig, ax = plt.subplots(figsize=(1.1 * n + 2.6, 0.9 * n + 1.6))
    im = ax.imshow(rho, cmap="RdBu_r", vmin=-1, vmax=1)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{rho[i, j]:.2f}", ha="center", va="center", fontsize=9,
                    color="white" if abs(rho[i, j]) > 0.6 else "black")
    ax.set_xticks(range(n), labels, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    fig.colorbar(im, ax=ax, label="Spearman rho")
    ax.set_title(f"Are the important heads the same across tasks?\n{title}", fontsize=9)
    return fig
