"""Figures of `bertscope atlas`: the grid of every head coloured by type, the per-layer profiles, and
`atlas compare`'s map of several models' heads."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.atlas import head_types as T
from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: the command imports this module, and a run with
# --no-figures must not pay matplotlib's start-up.


def _plt():
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(about: dict) -> str:
    q = f", {about['quantised']} weights" if about.get("quantised") else ""
    return (f"{about['model']} ({about['layers']} layers x {about['heads']} heads, {about['kv_heads']} KV heads{q}); "
            f"{about['segments']} segments of <= {about['max_len']} tokens")


def plot_grid(table: dict, about: dict):
    """Layer x head cells coloured by each head's first type (`head_types.RULES` order), its letters inside."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    plt = _plt()
    Ly, H = max(table["layer"]), max(table["head"])
    first = T.first_type({n: np.asarray(table[f"type_{n}"], bool) for n in T.TYPES})
    rgb = np.array([to_rgb(T.RULE[f].colour if f else T.NONE_COLOUR) for f in first]).reshape(Ly, H, 3)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.42 * H + 3.2), max(3.0, 0.32 * Ly + 1.8)), constrained_layout=True)
    ax.imshow(rgb, aspect="auto")
    for i in range(Ly * H):
        letters = "".join(T.RULE[n].letter for n in T.TYPES if table[f"type_{n}"][i])
        if letters:
            ax.text(i % H, i // H, letters, ha="center", va="center", fontsize=6 if len(letters) > 2 else 7)
    layer_head_ticks(ax, Ly, H)
    handles = [Patch(color=r.colour, label=f"{r.letter} {r.name}") for r in T.RULES]
    handles.append(Patch(color=T.NONE_COLOUR, label="none"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    ax.set_title(f"Head types\n{_title(about)}", fontsize=9)
    return fig


def plot_layers(rows: list[dict], about: dict):
    """Per layer: the masses and the entropy ratio (left), the mean distance (middle), the type counts (right)."""
    plt = _plt()
    layers = np.array([r["layer"] for r in rows])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    ax = axes[0]
    for key, label in (("sink_mass", "sink mass"), ("sink_mass_norm", "sink mass by norm"),
                       ("prev_mass", "previous token"), ("local_mass", "distance < 8"),
                       ("entropy_ratio", "entropy / uniform")):
        y = np.array([r.get(key, np.nan) for r in rows], dtype=float)
        if not np.isfinite(y).any():  # the norm-based twin: only where the run computed it
            continue
        twin = key.endswith("_norm")  # dashed, in the colour of the weight-based line before it
        ax.plot(layers, y, marker="o", ms=3, ls="--" if twin else "-", label=label,
                **({"color": ax.lines[-1].get_color()} if twin else {}))
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean over heads")
    ax.legend(fontsize=7)
    ax = axes[1]
    dist = np.array([max(r["mean_distance"], 1e-3) for r in rows])
    ax.plot(layers, dist, marker="o", ms=3, color="k")
    if dist.max() > 10 * dist.min():
        ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean query-key distance (tokens)")
    for r in rows:
        if r["attention"] != "global":
            ax.axvspan(r["layer"] - 0.5, r["layer"] + 0.5, color="0.9", zorder=0)
    ax = axes[2]
    bottom = np.zeros(len(rows))
    for rule in T.RULES:
        n = np.array([r[f"n_{rule.name}"] for r in rows], dtype=float)
        if n.any():
            ax.bar(layers, n, bottom=bottom, color=rule.colour, label=rule.name)
            bottom += n
    ax.set_xlabel("layer")
    ax.set_ylabel("heads of each type")
    ax.legend(fontsize=7)
    grey = "grey: sliding-window layers; " if any(r["attention"] != "global" for r in rows) else ""
    fig.suptitle(f"Per-layer profiles ({grey}right: a head of several types counts in each)\n{_title(about)}",
                 fontsize=9)
    return fig


def plot_compare(points: np.ndarray, models: list[str], first: list[str | None], explained: list[float]):
    """Two panels of the same PCA map of every head: coloured by first type, and by model."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), constrained_layout=True, sharex=True, sharey=True)
    ax = axes[0]
    for rule in (*T.RULES, None):
        sel = np.array([f == (rule.name if rule else None) for f in first])
        if sel.any():
            ax.scatter(points[sel, 0], points[sel, 1], s=12, alpha=0.8,
                       color=rule.colour if rule else "0.75", label=rule.name if rule else "none")
    ax.legend(fontsize=7, markerscale=1.5)
    ax.set_title("coloured by the head's first type", fontsize=9)
    ax = axes[1]
    cmap = plt.get_cmap("tab10")
    for k, m in enumerate(dict.fromkeys(models)):
        sel = np.array([x == m for x in models])
        ax.scatter(points[sel, 0], points[sel, 1], s=12, alpha=0.7, color=cmap(k % 10), label=m)
    ax.legend(fontsize=7, markerscale=1.5)
    ax.set_title("coloured by model", fontsize=9)
    for ax in axes:
        ax.set_xlabel(f"PC 1 ({100 * explained[0]:.0f}% of the variance)")
        ax.set_ylabel(f"PC 2 ({100 * explained[1]:.0f}%)")
    fig.suptitle("Every head of every model on the first two principal components of the standardised features",
                 fontsize=10)
    return fig
