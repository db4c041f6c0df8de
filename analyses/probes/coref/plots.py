"""The coreference probe's figures: heads against the baselines, and every head's accuracy."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.probes.coref.stats import COLOURS, GAP_BASELINES, GUM_BASELINES
from bertscope.report.plotting import layer_head_ticks

# matplotlib is imported inside the drawing functions: `bertscope probes coref` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def plot_bars(table_rows: list[dict], title: str):
    """One panel per dataset: per type, the best head, the All-best head and the baselines."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in table_rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 4.2), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        rows = [r for r in table_rows if r["dataset"] == dataset and r["n"]]
        baselines = GUM_BASELINES if dataset == "gum" else GAP_BASELINES
        series = [("best head", "accuracy"), ("All-best head", "overall_head_accuracy")] + [(b, b) for b in baselines]
        width = 0.8 / len(series)
        x = np.arange(len(rows))
        for k, (label, key) in enumerate(series):
            values = [100 * r[key] if isinstance(r[key], float) else np.nan for r in rows]
            bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, values, width, label=label.replace("_", " "),
                          color=COLOURS[label])
            if key == "accuracy":
                for bar, r in zip(bars, rows):
                    ax.annotate(r["best_head"], (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7, rotation=90, xytext=(0, 2),
                                textcoords="offset points")
        ax.set_xticks(x, [f"{r['type']}\n(n={r['n']})" for r in rows])
        ax.set_ylim(0, 105)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(dataset.upper() + (": antecedent selection" if dataset == "gum" else ": pronoun -> right name"))
        ax.legend(fontsize=8, loc="upper left", ncol=2)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig

def plot_heatmaps(head_rows: list[dict], title: str):
    """Layer x head accuracy, one panel per GUM mention type and one for GAP (all rows; its
    masculine/feminine split is in the CSV), cells annotated in percent."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["dataset"], r["mention_type"]) for r in head_rows
                                if r["n"] and (r["dataset"] == "gum" or r["mention_type"] == "All")))
    n_layers = max(r["layer"] for r in head_rows)
    n_heads = max(r["head"] for r in head_rows)
    cols = min(len(panels), 2)
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(0.55 * n_heads * cols + 1.5, 0.5 * n_layers * nrows + 1.2),
                             squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (dataset, kind) in zip(axes.flat, panels):
        grid = np.full((n_layers, n_heads), np.nan)
        for r in head_rows:
            if r["dataset"] == dataset and r["mention_type"] == kind:
                grid[r["layer"] - 1, r["head"] - 1] = 100 * r["accuracy"]
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        if n_layers <= 12 and n_heads <= 12:
            top = np.nanmax(grid)
            for layer, head in np.ndindex(grid.shape):
                value = grid[layer, head]
                if not np.isnan(value):
                    ax.text(head, layer, f"{value:.0f}", ha="center", va="center", fontsize=6,
                            color="black" if value > np.nanmin(grid) + 0.6 * (top - np.nanmin(grid)) else "white",
                            fontweight="bold" if value == top else "normal")
        n = next(r["n"] for r in head_rows if r["dataset"] == dataset and r["mention_type"] == kind)
        ax.set_title(f"{dataset.upper()} {kind} (n={n})", fontsize=9)
        layer_head_ticks(ax, n_layers, n_heads, fontsize=7, label_size=8)
        fig.colorbar(image, ax=ax, label="accuracy (%)", shrink=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
