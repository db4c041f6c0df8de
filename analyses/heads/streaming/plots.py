"""Figures of `bertscope heads streaming`: the per-head streaming error grid, and the curve of loss
and needle accuracy as more key/value groups stream (by error against random)."""
from __future__ import annotations

import numpy as np

from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: the command imports this module, and its --help
# and a run with --no-figures must not pay matplotlib's start-up.


def _plt():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_error(error: np.ndarray, title: str):
    """Layer x head heatmap of the relative streaming error (0: sink + recent gives the head's output
    exactly; 1: nothing of it)."""
    plt = _plt()
    n_layers, n_heads = error.shape
    fig, ax = plt.subplots(figsize=(0.42 * n_heads + 2.4, 0.3 * n_layers + 1.8), constrained_layout=True)
    im = ax.imshow(error, cmap="magma_r", aspect="auto", vmin=0, vmax=max(1e-9, float(np.nanmax(error))))
    layer_head_ticks(ax, n_layers, n_heads)
    fig.colorbar(im, ax=ax, label="||o - o_L|| / ||o||")
    ax.set_title(f"Streaming error per head\n{title}", fontsize=9)
    return fig


def plot_curve(rows: list[dict], title: str):
    """Loss change (left) and needle token accuracy (right) against the fraction of key/value groups
    streaming: lowest error first (red) and random (blue: mean; dots: draws)."""
    plt = _plt()
    none = next(r for r in rows if r["order"] == "none")
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.3), constrained_layout=True)
    for ax, col, label in ((axes[0], "delta_loss", "loss change (nats)"),
                           (axes[1], "needle_token_accuracy", "needle answer tokens predicted")):
        err = sorted((r for r in rows if r["order"] == "error"), key=lambda r: r["k"])
        ax.plot([0] + [r["fraction"] for r in err], [none[col]] + [r[col] for r in err], "o-", color="tab:red",
                label="lowest error first")
        fr = sorted({r["fraction"] for r in rows if r["order"] == "random"})
        means = [np.mean([r[col] for r in rows if r["order"] == "random" and r["fraction"] == f]) for f in fr]
        if fr:
            ax.plot([0] + fr, [none[col]] + means, "s--", color="tab:blue", label="random")
        pts = [(r["fraction"], r[col]) for r in rows if r["order"] == "random"]
        if pts:
            ax.scatter(*zip(*pts), color="tab:blue", s=8, alpha=0.6)
        ax.set_xlabel("fraction of key/value groups streaming")
        ax.set_ylabel(label)
    axes[0].axhline(0, color="black", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Streaming heads (sink + recent window)\n{title}", fontsize=9)
    return fig
