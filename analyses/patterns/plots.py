"""The pattern types' figures: shares per data set, per layer, and example maps with their types."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.patterns.stats import COLORS, TYPES, PatternCounts

# matplotlib is imported inside the drawing functions: `bertscope patterns` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def plot_overall(shares: dict[str, dict[str, float]], title: str):
    """Stacked bars, one per data set, as the paper's Figure 2 (Heterogeneous on top)."""
    import matplotlib.pyplot as plt  # see the module note

    names = list(shares)
    fig, ax = plt.subplots(figsize=(1.4 * len(names) + 2.6, 4.2))
    bottom = np.zeros(len(names))
    for t in TYPES:
        v = np.array([100 * shares[n][t] for n in names])
        ax.bar(names, v, bottom=bottom, color=COLORS[t], label=t, width=0.6)
        for x, (b, h) in enumerate(zip(bottom, v)):
            if h >= 4:
                ax.text(x, b + h / 2, f"{h:.0f}", ha="center", va="center", fontsize=8, color="white")
        bottom += v
    ax.set_ylabel("% of (example, head) maps")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return fig


def plot_layers(by_data: dict[str, PatternCounts], title: str):
    """Per-layer stacked bars, one panel per data set."""
    import matplotlib.pyplot as plt  # see the module note

    names = list(by_data)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1.5, 3.4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        acc = by_data[name]
        per_layer = acc.counts.sum(1)  # (layers, 5)
        share = per_layer / np.maximum(1, per_layer.sum(-1, keepdims=True))
        layers = np.arange(1, acc.n_layers + 1)
        bottom = np.zeros(acc.n_layers)
        for k, t in enumerate(TYPES):
            ax.bar(layers, 100 * share[:, k], bottom=bottom, color=COLORS[t], label=t)
            bottom += 100 * share[:, k]
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("layer")
        ax.set_xticks(layers)
    axes[0][0].set_ylabel("% of maps")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_examples(examples: list[dict], title: str):
    """One real map per type, as the paper's Figure 1. Each example: type, map (L, L), tokens, layer, head, features."""
    import matplotlib.pyplot as plt  # see the module note

    fig, axes = plt.subplots(1, len(examples), figsize=(3.1 * len(examples), 3.6), squeeze=False)
    for ax, ex in zip(axes[0], examples):
        ax.imshow(ex["map"], cmap="Greys", vmin=0, vmax=max(1e-9, float(ex["map"].max())))
        ticks = [i for i, tok in enumerate(ex["tokens"]) if tok in ("[CLS]", "[SEP]", "<s>", "</s>")]
        ax.set_xticks(ticks, [ex["tokens"][i] for i in ticks], rotation=90, fontsize=6)
        ax.set_yticks(ticks, [ex["tokens"][i] for i in ticks], fontsize=6)
        f = ex["features"]
        ax.set_title(f"{ex['type']}\nhead {ex['layer']}-{ex['head']}  spec {f['special']:.2f} diag "
                     f"{f['diagonal']:.2f}\nown {f['own']:.2f} spread {f['spread']:.2f}", fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
