"""Figures of `bertscope heads retrieval`: the needle-in-a-haystack map (depth x length), the
layer x head grid of retrieval scores, and the needle test as more heads are zeroed."""
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


def plot_needle(cell_rows: list[dict], title: str):
    """The classic needle-in-a-haystack map, one panel per needle: depth (rows) x length
    (columns), colored by the token accuracy (the fraction of answer rows whose prediction is the
    reference token, teacher forced), each cell annotated with the answer's log-probability and a
    star where the model copies the whole answer (greedy decoding gives the reference).

    Rows with "recall" (--answer greedy: the teacher-forced answer is the model's own, so its token
    accuracy is 1 by construction) are colored and annotated by the word recall of the reference
    answer instead, a star where the haystack counts as answered (recall above 0.5)."""
    plt = _plt()
    greedy = bool(cell_rows) and "recall" in cell_rows[0]
    needles = sorted({r["needle"] for r in cell_rows})
    lengths = sorted({r["length"] for r in cell_rows})
    depths = sorted({r["depth"] for r in cell_rows})
    fig, axes = plt.subplots(1, len(needles), figsize=(len(needles) * (0.9 * len(lengths) + 2.2) + 0.8,
                                                       0.4 * len(depths) + 1.8), squeeze=False,
                             constrained_layout=True)
    for ax, needle in zip(axes[0], needles):
        grid = np.full((len(depths), len(lengths)), np.nan)
        logp = np.full_like(grid, np.nan)
        copied = np.zeros(grid.shape, dtype=bool)
        for r in cell_rows:
            if r["needle"] == needle:
                i, j = depths.index(r["depth"]), lengths.index(r["length"])
                if greedy:
                    grid[i, j], logp[i, j], copied[i, j] = r["recall"], r["recall"], bool(r["answered"])
                else:
                    grid[i, j], logp[i, j], copied[i, j] = r["token_accuracy"], r["answer_logprob"], bool(r["copied"])
        im = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        for i, j in zip(*np.nonzero(np.isfinite(logp))):
            ax.text(j, i, f"{logp[i, j]:.{2 if greedy else 1}f}" + (" *" if copied[i, j] else ""), ha="center",
                    va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in lengths],
                      fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths], fontsize=8)
        ax.set_xlabel("haystack length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(needle, fontsize=9)
    if greedy:
        fig.colorbar(im, ax=axes[0].tolist(), label="word recall of the reference answer", shrink=0.8)
        fig.suptitle("Needle in a haystack, the model's own greedy answer: word recall of the reference answer "
                     f"(color and value), * = answered (recall > 0.5)\n{title}", fontsize=9)
    else:
        fig.colorbar(im, ax=axes[0].tolist(), label="token accuracy (teacher forced)", shrink=0.8)
        fig.suptitle("Needle in a haystack: answer tokens predicted right (color), answer log-probability (nats), "
                     f"* = exact copy\n{title}", fontsize=9)
    return fig


def plot_heads(grid, title: str):
    """Layer x head retrieval scores (over the answered haystacks; over all of them, said in the
    title, when none was answered); cells above 0.1 carry their value."""
    plt = _plt()
    answered = grid.n_answered > 0
    s = grid.answered if answered else grid.all
    n_layers, n_heads = s.shape
    fig, ax = plt.subplots(figsize=(0.42 * n_heads + 2.4, 0.3 * n_layers + 1.8), constrained_layout=True)
    im = ax.imshow(s, cmap="viridis", aspect="auto", vmin=0, vmax=max(1e-9, float(s.max()), 0.5))
    for lay, h in zip(*np.nonzero(s > 0.1)):
        ax.text(h, lay, f"{s[lay, h]:.2f}".removeprefix("0"), ha="center", va="center", fontsize=6,
                color="black" if s[lay, h] > 0.6 * s.max() else "white")
    layer_head_ticks(ax, n_layers, n_heads)
    fig.colorbar(im, ax=ax, label="retrieval score", shrink=0.9)
    over = (f"{grid.n_answered} answered haystacks" if answered
            else f"all {grid.n_cells} haystacks (none answered)")
    ax.set_title(f"Retrieval score per head (Wu et al. 2024), mean over {over}\n{title}", fontsize=9)
    return fig


def plot_ablation(rows: list[dict], title: str):
    """Fraction copied and mean answer log-probability against k: the top-k heads zeroed (red)
    against k random heads (blue: mean of the draws; dots: each draw); k = 0 is the model as trained."""
    plt = _plt()
    none = next(r for r in rows if r["ablation"] == "none")
    ks = sorted({r["k"] for r in rows if r["k"]})
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.2), constrained_layout=True)
    for ax, col, label in ((axes[0], "accuracy", "fraction copied"),
                           (axes[1], "answer_logprob", "mean answer log-prob (nats)")):
        top = [none[col]] + [next(r[col] for r in rows if r["ablation"] == "top" and r["k"] == k) for k in ks]
        rnd = [[r[col] for r in rows if r["ablation"] == "random" and r["k"] == k] for k in ks]
        ax.plot([0, *ks], top, "o-", color="tab:red", label="top-k retrieval heads zeroed")
        ax.plot([0, *ks], [none[col]] + [float(np.mean(v)) for v in rnd], "s--", color="tab:blue",
                label="k random heads zeroed (mean)")
        for k, v in zip(ks, rnd):
            ax.scatter([k] * len(v), v, color="tab:blue", s=10, alpha=0.5)
        ax.set_xlabel("k heads zeroed")
        ax.set_ylabel(label)
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Needle test with heads zeroed ({none['cells']} haystacks)\n{title}", fontsize=9)
    return fig
