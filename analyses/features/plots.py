"""Figures of `bertscope features`: Kovaleva et al.'s Figure 6 (layer x head score per
feature) and Figure 7 (the last layer's [CLS] row per feature)."""
from __future__ import annotations

import numpy as np

from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: `bertscope features` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).

LABELS = {"cls": "[CLS]", "sep": "[SEP]", "noun": "nouns", "verb": "verbs", "pron": "pronouns",
          "punct": "punctuation", "nsubj": "subjects (nsubj)", "obj": "objects (obj)", "neg": "negation"}


def _plt():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _annotate(ax, grid: np.ndarray, vmax: float, fmt: str = "{:.2f}"):
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=5.5,
                    color="black" if v > 0.6 * vmax else "white")


def plot_feature_heatmaps(rows: list[dict], data: str, title: str):
    """One layer x head panel per feature of one data set, all on one colour scale (0 to the
    largest score), so a feature's stripes read against [CLS]'s and [SEP]'s."""
    plt = _plt()
    rows = [r for r in rows if r["data"] == data]
    features = list(dict.fromkeys(r["feature"] for r in rows))
    layers, heads = max(r["layer"] for r in rows), max(r["head"] for r in rows)
    vmax = max(r["score"] for r in rows)
    cols = min(len(features), 3)
    nrows = -(-len(features) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(0.42 * heads * cols + 1.8, 0.48 * layers * nrows + 1.6),
                             layout="constrained",
                             squeeze=False)
    for ax in axes.flat[len(features):]:
        ax.axis("off")
    image = None
    for ax, feature in zip(axes.flat, features):
        grid = np.full((layers, heads), np.nan)
        for r in rows:
            if r["feature"] == feature:
                grid[r["layer"] - 1, r["head"] - 1] = r["score"]
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=vmax, aspect="auto", interpolation="nearest")
        if layers * heads <= 150:
            _annotate(ax, grid, vmax)
        n = next(r["n_inputs"] for r in rows if r["feature"] == feature)
        ax.set_title(f"{LABELS.get(feature, feature)} (n={n})", fontsize=9)
        layer_head_ticks(ax, layers, heads, fontsize=6, label_size=7)
    fig.colorbar(image, ax=axes, label="attention received / length (max over the feature's tokens)", shrink=0.6)
    fig.suptitle(title)
    return fig


def plot_cls_last_layer(rows: list[dict], title: str):
    """Figure 7: the last layer's [CLS] row, its mass on each feature (y) per head (x), one
    panel per data set."""
    plt = _plt()
    datas = list(dict.fromkeys(r["data"] for r in rows))
    last = max(r["layer"] for r in rows)
    heads = max(r["head"] for r in rows)
    cols = min(len(datas), 3)
    nrows = -(-len(datas) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(0.5 * heads * cols + 3, 3.4 * nrows + 0.8), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(datas):]:
        ax.axis("off")
    vmax = max(r["cls_mass"] for r in rows if r["layer"] == last)
    image = None
    for ax, data in zip(axes.flat, datas):
        mine = [r for r in rows if r["data"] == data and r["layer"] == last]
        features = list(dict.fromkeys(r["feature"] for r in mine))
        grid = np.full((len(features), heads), np.nan)
        for r in mine:
            grid[features.index(r["feature"]), r["head"] - 1] = r["cls_mass"]
        image = ax.imshow(grid, cmap="magma", vmin=0, vmax=vmax, aspect="auto", interpolation="nearest")
        _annotate(ax, grid, vmax)
        ax.set_title(data.upper(), fontsize=9)
        ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=6)
        ax.set_yticks(range(len(features)), [LABELS.get(f, f) for f in features], fontsize=7)
        ax.set_xlabel(f"head (layer {last})", fontsize=7)
    fig.colorbar(image, ax=axes, label="[CLS] row's attention on the feature's tokens", shrink=0.8)
    fig.suptitle(title)
    return fig


def plot_layer_profile(rows: list[dict], title: str):
    """Mean score over the heads of each layer, one line per feature, one panel per data set:
    the paper's "earlier layers attend to [CLS], later ones to [SEP]"."""
    plt = _plt()
    datas = list(dict.fromkeys(r["data"] for r in rows))
    fig, axes = plt.subplots(1, len(datas), figsize=(3.2 * len(datas) + 1, 3.2), squeeze=False, sharey=True)
    for ax, data in zip(axes.flat, datas):
        mine = [r for r in rows if r["data"] == data]
        layers = max(r["layer"] for r in mine)
        for feature in dict.fromkeys(r["feature"] for r in mine):
            means = [np.mean([r["score"] for r in mine if r["feature"] == feature and r["layer"] == x])
                     for x in range(1, layers + 1)]
            ax.plot(range(1, layers + 1), means, marker="o", ms=3, label=LABELS.get(feature, feature),
                    lw=2.2 if feature in ("cls", "sep") else 1)
        ax.set_title(data.upper(), fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        ax.set_xticks(range(1, layers + 1))
        ax.grid(alpha=0.3)
    axes.flat[0].set_ylabel("mean score over heads", fontsize=8)
    axes.flat[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title)
    fig.tight_layout()
    return fig
