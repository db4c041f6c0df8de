"""Difference heatmaps of `bertscope compare`: one layer x head grid per statistic.

The colour is b - a on a diverging map (PuOr, colourblind-safe) centred at 0 and
symmetric, so white is "no change" and the two hues are the two directions whatever the
range. Heads whose change is significant (BH-adjusted q < alpha) get a black frame, so
"large" and "beyond noise" read separately. The caption under the grid says all this.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

DPI = 130
ANNOTATE_MAX = 12  # write the value in each cell when layers and heads are both <= this


def plot_diff(diff: np.ndarray, path: Path, title: str, caption: str, q: np.ndarray | None = None,
              alpha: float = 0.05) -> Path:
    """Write one heatmap of `diff` (layers, H) to `path`; frame cells with q < alpha."""
    Ly, H = diff.shape
    span = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 0.0
    span = span or 1.0  # all zero: still centred, white
    width = max(6.0, 1.5 + 0.45 * H)
    lines = textwrap.wrap(caption, int(width * 15))
    fig, ax = plt.subplots(figsize=(width, 1.4 + 0.4 * max(Ly, 3) + 0.15 * len(lines)))
    im = ax.imshow(np.ma.masked_invalid(diff), cmap="PuOr", vmin=-span, vmax=span, aspect="auto")
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)])
    ax.set_yticks(range(Ly), [str(l + 1) for l in range(Ly)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="b - a")
    if Ly <= ANNOTATE_MAX and H <= ANNOTATE_MAX:
        for l in range(Ly):
            for h in range(H):
                if np.isfinite(diff[l, h]):
                    ax.text(h, l, f"{diff[l, h]:+.2f}", ha="center", va="center", fontsize=6,
                            color="white" if abs(diff[l, h]) > 0.6 * span else "black")
    if q is not None:
        for l, h in zip(*np.nonzero(np.nan_to_num(q, nan=1.0) < alpha)):
            ax.add_patch(Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.5))
    fig.tight_layout()
    fig.text(0.01, 0.0, "\n".join(lines), fontsize=7, va="top", ha="left")  # under the axes; tight bbox keeps it
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return Path(path)
