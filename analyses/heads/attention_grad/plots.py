"""Figures of `bertscope heads attention-grad`: Clark et al. (2019) Fig. 5 (attention and
attention gradient by layer, per key class) and a layer x head view of the special classes."""
from __future__ import annotations

import numpy as np

from bertscope.report.plotting import layer_head_ticks
from bertscope.text.token_classes import KEY_CLASSES

# matplotlib is imported inside the drawing functions: `bertscope heads attention-grad` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).

LABELS = {"cls": "[CLS]", "sep": "[SEP]", "punct": ". or ,", "other": "other"}
COLORS = {"cls": "tab:red", "sep": "tab:blue", "punct": "tab:green", "other": "tab:gray"}


def _pyplot():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layers(rows: list[dict], title: str):
    """Three panels over layers, one line per key class: the mean attention mass a row puts on
    the class, the mean |dL/dP_ij| per (query, key) pair (log scale), and that gradient
    relative to the 'other' tokens' (log scale; 1 = as other tokens)."""
    plt = _pyplot()
    layers = sorted({r["layer"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = (("attention", "avg. attention (mass per row)", False),
              ("mean_abs_grad", "avg. |d loss / d attention weight|", True),
              ("grad_vs_other", "gradient relative to 'other'", True))
    for ax, (column, label, log) in zip(axes, panels):
        for c in KEY_CLASSES:
            y = [next(r[column] for r in rows if r["layer"] == lay and r["key_class"] == c) for lay in layers]
            ax.plot(layers, y, marker="o", color=COLORS[c], label=LABELS[c])
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.set_xticks(layers)
        ax.grid(alpha=0.3)
    axes[2].axhline(1, color="black", lw=0.8, ls=":")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_heads(rows: list[dict], n_layers: int, n_heads: int, title: str):
    """Layer x head, one column per special class ([CLS], [SEP], '. or ,'): the attention mass
    on the class (top) and log10 of its mean |grad| over the 'other' tokens' (bottom; red:
    smaller). A head that attends much to a class whose gradient is small uses it as a no-op."""
    plt = _pyplot()
    grid = {c: {k: np.full((n_layers, n_heads), np.nan) for k in ("mean_abs_grad", "attention")} for c in KEY_CLASSES}
    for r in rows:
        for k in ("mean_abs_grad", "attention"):
            grid[r["key_class"]][k][r["layer"] - 1, r["head"] - 1] = r[k]
    special = [c for c in KEY_CLASSES if c != "other"]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = {c: np.log10(grid[c]["mean_abs_grad"] / grid["other"]["mean_abs_grad"]) for c in special}
    finite = np.concatenate([r[np.isfinite(r)] for r in ratios.values()])
    span = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    w, h = 0.32 * n_heads + 1.6, 0.32 * n_layers + 0.9
    fig, axes = plt.subplots(2, len(special), figsize=(len(special) * w, 2 * h + 0.6), squeeze=False)
    for col, c in enumerate(special):
        for row, (data, cmap, lims, label) in enumerate((
                (grid[c]["attention"], "Blues", (0, 1), f"attention mass on {LABELS[c]}"),
                (ratios[c], "RdBu", (-span, span), f"log10 |grad| {LABELS[c]} / other"))):
            ax = axes[row, col]
            im = ax.imshow(data, cmap=cmap, vmin=lims[0], vmax=lims[1], aspect="auto")
            layer_head_ticks(ax, n_layers, n_heads, fontsize=7)
            ax.set_title(label, fontsize=9)
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
