"""The figure of `bertscope heads prune` (Michel et al. 2019, section 4): the accuracy against
the fraction of heads pruned, by importance and in random orders."""
from __future__ import annotations

import numpy as np


def plot_prune(rows: list[dict], title: str, tolerance: float):
    """Accuracy against the fraction of heads pruned: the importance order, the random orders'
    mean with their min-max band, the baseline and the baseline minus `tolerance`."""
    import matplotlib  # here, not at the top: importing pyplot takes a while and only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    imp = sorted((r for r in rows if r["order"] == "importance"), key=lambda r: r["step"])
    base = imp[0]["accuracy"]
    rnd = [r for r in rows if r["order"] == "random"]
    if rnd:
        steps = sorted({r["step"] for r in rnd})
        acc = np.array([[r["accuracy"] for r in rnd if r["step"] == s] for s in steps])  # (steps, seeds)
        x = [next(r["fraction_pruned"] for r in rnd if r["step"] == s) for s in steps]
        seeds = acc.shape[1]
        ax.fill_between(x, 100 * acc.min(1), 100 * acc.max(1), color="tab:gray", alpha=0.25,
                        label=f"random order, min-max of {seeds} seeds")
        ax.plot(x, 100 * acc.mean(1), "o--", color="tab:gray", ms=3, label="random order, mean")
    ax.plot([r["fraction_pruned"] for r in imp], [100 * r["accuracy"] for r in imp], "o-", color="tab:blue",
            label="by importance (recomputed each step)")
    ax.axhline(100 * base, color="tab:orange", lw=1, label=f"baseline {100 * base:.1f}%")
    ax.axhline(100 * (base - tolerance), color="tab:orange", lw=1, ls=":",
               label=f"baseline - {100 * tolerance:g} point")
    ax.set_xlabel("fraction of heads pruned")
    ax.set_ylabel("accuracy (%)")
    ax.set_xlim(-0.02, 1.0)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(f"Iterative pruning (Michel et al. 2019, section 4)\n{title}", fontsize=9)
    return fig


def plot_lm_prune(rows: list[dict], title: str):
    """Perplexity on held-out text (log scale) against the fraction of heads pruned: the importance
    order, each random order, their mean, and the unpruned model."""
    import matplotlib  # see plot_prune

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    imp = sorted((r for r in rows if r["order"] == "importance"), key=lambda r: r["step"])
    base = imp[0]["perplexity"]
    seeds = sorted({r["seed"] for r in rows if r["order"] == "random"})
    curves = []
    for i, seed in enumerate(seeds):
        got = sorted((r for r in rows if r["order"] == "random" and r["seed"] == seed), key=lambda r: r["step"])
        curves.append([r["perplexity"] for r in got])
        ax.plot([r["fraction_pruned"] for r in got], curves[-1], "-", color="tab:gray", lw=0.8, alpha=0.6,
                label=f"random orders ({len(seeds)} seeds)" if i == 0 else None)
    if seeds:
        x = [r["fraction_pruned"] for r in sorted((r for r in rows if r["order"] == "random" and r["seed"] == seeds[0]),
                                                  key=lambda r: r["step"])]
        ax.plot(x, np.exp(np.log(np.array(curves)).mean(0)), "o--", color="tab:gray", ms=3,
                label="random, geometric mean")
    ax.plot([r["fraction_pruned"] for r in imp], [r["perplexity"] for r in imp], "o-", color="tab:blue",
            label="by importance (recomputed each step)")
    ax.axhline(base, color="tab:orange", lw=1, label=f"unpruned {base:.2f}")
    ax.set_yscale("log")
    ax.set_xlabel("fraction of query heads pruned (gated to 0)")
    ax.set_ylabel("perplexity on held-out text (log scale)")
    ax.set_xlim(-0.02, 1.0)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"Iterative pruning with the language-modelling loss (Michel et al. 2019, section 4)\n{title}",
                 fontsize=8)
    return fig
