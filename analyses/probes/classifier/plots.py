"""The probing classifiers' figures: training curves and the weights given to each head."""
from __future__ import annotations

import numpy as np

# matplotlib is imported inside the drawing functions: `bertscope probes classifier` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def plot_training(curves: dict[str, list[dict]], title: str):
    """Held-out UAS by epoch of every probe trained (`TrainResult.history`, by probe label).
    Returns the matplotlib figure."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4))
    colors = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7"]
    for color, (label, history) in zip(colors, curves.items()):
        ax.plot([h["epoch"] for h in history], [100 * h["heldout_uas"] for h in history], "o-", color=color,
                label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("held-out UAS (GUM, no punctuation)")
    ax.set_title(f"{title}: probe training")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    return fig

def plot_head_weights(weights: dict[str, np.ndarray], title: str):
    """The attention-only probe's per-head weights w and u, each (layers, heads), side by side
    on one symmetric colour scale. Returns the matplotlib figure."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers, n_heads = weights["w"].shape
    fig, axes = plt.subplots(1, 2, figsize=(2 + 0.55 * n_heads * 2, 1.5 + 0.45 * n_layers), squeeze=False)
    bound = max(float(np.abs(weights["w"]).max()), float(np.abs(weights["u"]).max()), 1e-6)
    titles = {"w": "w: candidate head → dependent", "u": "u: dependent → candidate head"}
    for ax, (name, array) in zip(axes[0], weights.items()):
        image = ax.imshow(array, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        ax.set_xticks(range(n_heads), [str(h + 1) for h in range(n_heads)])
        ax.set_yticks(range(n_layers), [str(l + 1) for l in range(n_layers)])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(titles[name])
        if n_layers <= 12 and n_heads <= 12:
            for l in range(n_layers):
                for h in range(n_heads):
                    ax.text(h, l, f"{array[l, h]:.1f}", ha="center", va="center", fontsize=6,
                            color="white" if abs(array[l, h]) > 0.6 * bound else "black")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="probe weight")
    fig.suptitle(f"{title}: attention-only probe weight per head")
    return fig
