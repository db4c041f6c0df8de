"""Figures of `bertscope heads induction`: the layer x head grids of the three scores, the loss by
position with heads zeroed, the ablation bars and the per-head score against the loss change."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.heads.induction.stats import SCORES
from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: the command imports this module, and its --help
# and a run with --no-figures must not pay matplotlib's start-up.

TITLES = {"induction": "induction: i -> i - T + 1", "duplicate": "duplicate token: i -> i - T",
          "previous": "previous token: i -> i - 1"}


def _plt():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scores(scores: dict, title: str):
    """Three layer x head heatmaps on one 0..1 scale; the cells above 0.3 carry their value."""
    plt = _plt()
    n_layers, n_heads = scores["induction"].shape
    fig, axes = plt.subplots(1, 3, figsize=(3 * (0.42 * n_heads + 1.6) + 1.2, 0.3 * n_layers + 2.0), sharey=True,
                             constrained_layout=True)
    for ax, name in zip(axes, SCORES):
        s = scores[name]
        im = ax.imshow(s, cmap="viridis", aspect="auto", vmin=0, vmax=1)
        for lay, h in zip(*np.nonzero(s > 0.3)):
            ax.text(h, lay, f"{s[lay, h]:.2f}".removeprefix("0"), ha="center", va="center", fontsize=6,
                    color="black" if s[lay, h] > 0.6 else "white")
        layer_head_ticks(ax, n_layers, n_heads)
        ax.set_title(TITLES[name], fontsize=9)
    fig.colorbar(im, ax=axes, label="mean attention (repeated half)", shrink=0.9)
    fig.suptitle(f"Induction, duplicate-token and previous-token scores\n{title}", fontsize=9)
    return fig


def plot_loss_by_position(rows: list[dict], ks: list[int], layout, title: str):
    """Mean next-token loss by target position: as trained, the top k zeroed (each k), k random
    heads zeroed (the largest k, mean of the draws)."""
    plt = _plt()
    x = np.array([r["position"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(x, [r["none"] for r in rows], color="black", lw=1.2, label="as trained")
    reds = plt.get_cmap("Reds")
    for i, k in enumerate(ks):
        ax.plot(x, [r[f"top_{k}"] for r in rows], color=reds(0.45 + 0.5 * (i + 1) / len(ks)), lw=1.1,
                label=f"top {k} induction heads zeroed")
    k = ks[-1]
    ax.plot(x, [r[f"random_{k}"] for r in rows], color="tab:blue", lw=1.0, ls="--",
            label=f"{k} random heads zeroed (mean of draws)")
    ax.axvline(layout.first + layout.seq_len + 0.5, color="0.5", lw=0.8)
    ax.set_xlabel("target position (the repeat starts right of the grey line)")
    ax.set_ylabel("next-token loss (nats)")
    ax.legend(fontsize=7)
    ax.set_title(f"Loss by position\n{title}", fontsize=9)
    return fig


def plot_ablation(rows: list[dict], title: str):
    """The ICL score (repeated-half loss minus first-half loss) as trained, with the top k
    induction heads zeroed, and with k random heads zeroed (bar: mean of the draws; dots: draws)."""
    plt = _plt()
    ks = sorted({r["k"] for r in rows if r["k"]})
    none = next(r for r in rows if r["ablation"] == "none")
    fig, ax = plt.subplots(figsize=(1.6 * len(ks) + 2.6, 3.4))
    ax.axhline(none["icl_score"], color="black", lw=1, label=f"as trained ({none['icl_score']:+.2f})")
    for i, k in enumerate(ks):
        top = next(r for r in rows if r["ablation"] == "top" and r["k"] == k)
        rnd = [r["icl_score"] for r in rows if r["ablation"] == "random" and r["k"] == k]
        ax.bar(i - 0.2, top["icl_score"], 0.38, color="tab:red", label="top k induction heads" if i == 0 else None)
        ax.bar(i + 0.2, np.mean(rnd), 0.38, color="tab:blue", alpha=0.7, label="k random heads" if i == 0 else None)
        ax.scatter(np.full(len(rnd), i + 0.2), rnd, color="black", s=8, zorder=3)
    ax.set_xticks(range(len(ks)), [f"k = {k}" for k in ks])
    ax.set_ylabel("ICL score: loss repeated - first half")
    ax.legend(fontsize=7)
    ax.set_title(f"Heads zeroed: in-context learning score\n{title}", fontsize=9)
    return fig


def plot_per_head(induction: np.ndarray, delta: np.ndarray, corr: dict, title: str):
    """Each head's induction score against the repeated-half loss change when it alone is zeroed."""
    plt = _plt()
    n_layers = induction.shape[0]
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    layers = np.repeat(np.arange(1, n_layers + 1), induction.shape[1])
    sc = ax.scatter(induction.ravel(), delta.ravel(), c=layers, cmap="viridis", s=14)
    fig.colorbar(sc, ax=ax, label="layer")
    ax.axhline(0, color="0.6", lw=0.8)
    marked = set(np.argsort(-induction.ravel(), kind="stable")[:5]) | set(np.argsort(-delta.ravel(), kind="stable")[:5])
    for i in sorted(marked):
        lay, h = divmod(int(i), induction.shape[1])
        ax.annotate(f"{lay + 1}-{h + 1}", (induction[lay, h], delta[lay, h]), textcoords="offset points", xytext=(4, 2),
                    fontsize=6)
    ax.set_xlabel("induction score")
    ax.set_ylabel("repeated-half loss change, head zeroed (nats)")
    rho = "undefined" if corr.get("spearman") is None else f"{corr['spearman']:+.2f}"
    ax.set_title(f"One head zeroed at a time: Spearman rho {rho}\n{title}", fontsize=9)
    return fig
