"""Figures of `bertscope heads ablate` (Michel et al. 2019): the distribution of single-head
deltas, the per-layer "all heads but one" deltas, and importance against the ablation effect.
The layer x head heatmap is `disable_plots.plot_heads` with the zero gate."""
from __future__ import annotations

import math

import numpy as np

from bertscope.analyses.heads.ablate.stats import HALF_POINT

# matplotlib is imported inside the drawing functions: `bertscope heads ablate` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def _plt():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_histogram(deltas: np.ndarray, n_examples: int, title: str):
    """Histogram of the single-head deltas in points, one bin per example flipped (1/N) up to
    40 bins; the band of +-0.5 points (Michel's "most heads") shaded, 0 marked."""
    plt = _plt()
    d = 100 * np.asarray(deltas, float)  # (heads,) points
    step = 100 / n_examples
    lo, hi = float(d.min()), float(d.max())
    step *= max(1, math.ceil((hi - lo) / step / 40))
    bins = np.arange(lo - step / 2, hi + step, step)
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.axvspan(-100 * HALF_POINT, 100 * HALF_POINT, color="0.9", label="within 0.5 points")
    ax.hist(d, bins=bins, color="tab:purple", edgecolor="white")
    ax.axvline(0, color="tab:orange", lw=2, label="baseline")
    within = int(np.sum(np.abs(d) <= 100 * HALF_POINT + 1e-9))
    ax.set_xlabel("accuracy change with the head masked (points)")
    ax.set_ylabel("heads")
    ax.legend(fontsize=8)
    ax.set_title(f"One head masked at a time: {within} of {len(d)} heads within 0.5 points\n{title}", fontsize=9)
    return fig


def plot_but_one(rows: list[dict], table: list[dict], title: str):
    """Per layer: the delta of every "all but one" variant (grey, by kept head) and the best
    kept head's with its exact interval (level 1 - alpha, McNemar inverted); 0 is the full model."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * len(table) + 2.5), 3.6))
    rows = [r for r in rows if r["kind"] == "but-one"]
    ax.scatter([int(r["layer"]) for r in rows], [100 * float(r["delta"]) for r in rows], s=14, color="0.6",
               label="one kept head", zorder=2)
    x = [r["layer"] for r in table]
    y = np.array([100 * r["delta"] for r in table])
    err = np.array([[100 * (r["delta"] - r["ci_low"]), 100 * (r["ci_high"] - r["delta"])] for r in table]).T  # (2, L)
    ax.errorbar(x, y, yerr=err, fmt="o", color="tab:purple", capsize=4, ms=7, label="best kept head, 95% CI",
                zorder=3)
    for r in table:
        ax.annotate(str(r["best_head"]), (r["layer"], 100 * r["delta"]), textcoords="offset points",
                    xytext=(7, 3), fontsize=8, color="tab:purple")
    ax.axhline(0, color="tab:orange", lw=2, label="full model")
    ax.axhspan(-100 * HALF_POINT, 100 * HALF_POINT, color="0.92", zorder=0)
    ax.set_xticks(x)
    ax.set_xlabel("layer (label: the best kept head)")
    ax.set_ylabel("accuracy change (points)")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(f"All heads of a layer masked but one\n{title}", fontsize=9)
    return fig


def plot_importance(importance: np.ndarray, delta: np.ndarray, corr: dict, title: str, column: str = "importance"):
    """Each head: its importance (x) against the accuracy lost when it is masked, -delta (y),
    coloured by layer; Spearman's rho in the title."""
    plt = _plt()
    n_layers = importance.shape[0]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    cmap = plt.get_cmap("viridis", n_layers)
    for lay in range(n_layers):
        ax.scatter(importance[lay], -100 * delta[lay], s=18, color=cmap(lay), label=f"layer {lay + 1}")
    ax.axhline(0, color="0.5", lw=1)
    ax.set_xlabel(f"head importance ({column})")
    ax.set_ylabel("accuracy lost when masked (points)")
    ax.legend(fontsize=7, ncol=2)
    rho = "n/a (constant)" if corr["spearman"] is None else f"{corr['spearman']:+.2f} (p = {corr['p']:.2g})"
    ax.set_title(f"Importance vs ablation effect: Spearman rho {rho}, {corr['heads']} heads\n{title}", fontsize=9)
    return fig
