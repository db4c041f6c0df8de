"""Head clustering's figures: the MDS map of the heads, and JS divergence between layers."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.probes.cluster.stats import (
    BEHAVIOURS,
    MARKER_SIZE,
    MARKERS,
    head_labels,
    head_layers,
)

# matplotlib is imported inside the drawing functions: `bertscope probes cluster` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def plot_mds(xy: np.ndarray, labels: np.ndarray, n_layers: int, n_heads: int, title: str):
    """Clark Fig. 6: heads in the MDS plane, colour = layer, marker = behaviour.
    Heads are named `layer-head` beside their point when there are at most 160 of them."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    layers = head_layers(n_layers, n_heads)
    flat = np.asarray(labels).reshape(-1)
    cmap = plt.get_cmap("viridis" if n_layers > 1 else "tab10")
    colour = lambda l: cmap((l - 1) / max(1, n_layers - 1) * 0.92)  # noqa: E731 (skip viridis' pale yellow end)
    fig, ax = plt.subplots(figsize=(9, 7.5))
    for b in BEHAVIOURS:
        sel = flat == b
        if sel.any():
            ax.scatter(xy[sel, 0], xy[sel, 1], c=[colour(l) for l in layers[sel]], marker=MARKERS[b],
                       s=MARKER_SIZE.get(b, 55), edgecolors="black", linewidths=0.5, alpha=0.9, zorder=3)
    if len(xy) <= 160:
        for i, name in enumerate(head_labels(n_layers, n_heads)):
            ax.annotate(name, xy[i], xytext=(3, 3), textcoords="offset points", fontsize=6, color="0.3")
    layer_handles = [Line2D([], [], ls="", marker="o", ms=8, mfc=colour(l), mec="black", mew=0.5, label=str(l))
                     for l in range(1, n_layers + 1)]
    behaviour_handles = [Line2D([], [], ls="", marker=MARKERS[b], ms=8, mfc="0.75", mec="black", mew=0.5, label=b)
                         for b in BEHAVIOURS if (flat == b).any()]
    first = ax.legend(handles=layer_handles, title="layer (colour)", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      fontsize=8, title_fontsize=9, ncols=1 if n_layers <= 12 else 2)
    ax.add_artist(first)
    ax.legend(handles=behaviour_handles, title="behaviour (marker)", loc="lower left", bbox_to_anchor=(1.01, 0.0),
              fontsize=8, title_fontsize=9)
    ax.set_xlabel("MDS 1")
    ax.set_ylabel("MDS 2")
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(alpha=0.25)
    ax.set_title(f"{title}: heads embedded by Jensen-Shannon distance (Clark et al. Fig. 6)", fontsize=11)
    fig.tight_layout()
    return fig

def plot_layer_js(layer_js: np.ndarray, title: str):
    """Layer x layer heatmap of the mean JS per token between their heads (diagonal:
    pairs of different heads within the layer)."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(layer_js)
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * n + 1.2, 0.8 + 0.6 * n))
    im = ax.imshow(layer_js, cmap="magma_r", interpolation="nearest")
    ticks = np.arange(n)
    ax.set_xticks(ticks, [str(i + 1) for i in ticks], fontsize=8)
    ax.set_yticks(ticks, [str(i + 1) for i in ticks], fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel("layer")
    if n <= 12:
        finite = layer_js[np.isfinite(layer_js)]
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0
        for (i, j), v in np.ndenumerate(layer_js):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if v > mid else "black")
    fig.colorbar(im, ax=ax, label="mean JS per token (nats)")
    ax.set_title(f"{title}: mean JS between heads of two layers", fontsize=10)
    fig.tight_layout()
    return fig
