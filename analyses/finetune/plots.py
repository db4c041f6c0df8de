"""Fine-tuning's figures: how much each head's attention changed."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.finetune.outputs import COSINE_FIGURE

# matplotlib is imported inside the drawing functions: `bertscope finetune` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def cosine_figures(rows: list[dict]):
    """(figure, filename) per (task, data, input): layer x head heatmap of the mean cosine over the
    seeds (Kovaleva et al. Figure 5; darker = changed more)."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["data"], r["input"]), []).append(r)
    for (task, data, variant), rs in sorted(groups.items()):
        layers = max(int(r["layer"]) for r in rs)  # 1-based, as heads.csv
        heads = max(int(r["head"]) for r in rs)
        grid = np.zeros((layers, heads))
        count = np.zeros((layers, heads))
        for r in rs:
            grid[int(r["layer"]) - 1, int(r["head"]) - 1] += float(r["cosine"])
            count[int(r["layer"]) - 1, int(r["head"]) - 1] += 1
        grid /= np.maximum(count, 1)
        seeds = sorted({str(r["seed"]) for r in rs})
        name = task if task != "arct" else f"arct-{data}-{variant}"
        fig, ax = plt.subplots(figsize=(0.55 * heads + 1.8, 0.45 * layers + 1.4))
        im = ax.imshow(grid, cmap="Blues_r", vmin=min(grid.min(), 0.99), vmax=1.0, aspect="auto")
        for (l, h), v in np.ndenumerate(grid):
            ax.text(h, l, f"{v:.2f}", ha="center", va="center", fontsize=6,
                    color="white" if v < grid.min() + 0.5 * (1 - grid.min()) else "black")
        ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)])
        ax.set_yticks(range(layers), [str(l + 1) for l in range(layers)])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{name}: cosine(pre-trained, fine-tuned attention)\n"
                     f"mean over dev inputs, seeds {','.join(seeds)}", fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
        yield fig, COSINE_FIGURE.format(name=name)
