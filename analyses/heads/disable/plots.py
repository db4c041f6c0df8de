"""Figures of `bertscope heads disable`: Kovaleva et al.'s Figures 8 (one head disabled at a
time, layer x head) and 9 (one layer at a time), with the baseline marked and the changes
that are more than noise (BH q < alpha) framed."""
from __future__ import annotations

import numpy as np

# matplotlib is imported inside the drawing functions: `heads disable` and `heads ablate` import this module, and
# their --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).

BASELINE_COLOR = "tab:orange"  # the paper's orange baseline line


def _rows_of(rows, kind):
    return [r for r in rows if r["kind"] == kind]


def plot_heads(rows: list[dict], n_layers: int, n_heads: int, title: str, gate: str = "uniform"):
    """Layer x head heatmap of the accuracy with that head gated; the colour scale is centred on
    the baseline (marked on the colour bar), each cell is labelled with its change in points,
    and significant cells are framed."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = rows[0]["accuracy"]
    acc = np.full((n_layers, n_heads), np.nan)
    sig = np.zeros((n_layers, n_heads), dtype=bool)
    for r in _rows_of(rows, "head"):
        acc[r["layer"] - 1, r["head"] - 1] = r["accuracy"]
        sig[r["layer"] - 1, r["head"] - 1] = bool(r["significant"])
    span = max(float(np.nanmax(np.abs(acc - base))), 0.005)
    fig, ax = plt.subplots(figsize=(0.55 * n_heads + 2.5, 0.5 * n_layers + 1.6))
    im = ax.imshow(100 * acc, cmap="PuOr", vmin=100 * (base - span), vmax=100 * (base + span), aspect="auto")
    for lay in range(n_layers):
        for h in range(n_heads):
            dark = abs(acc[lay, h] - base) > 0.6 * span  # white text on the saturated ends of the scale
            ax.text(h, lay, f"{100 * (acc[lay, h] - base):+.1f}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
            if sig[lay, h]:
                ax.add_patch(plt.Rectangle((h - 0.5, lay - 0.5), 1, 1, fill=False, edgecolor="black", lw=2))
    ax.set_xticks(range(n_heads), [str(h + 1) for h in range(n_heads)])
    ax.set_yticks(range(n_layers), [str(lay + 1) for lay in range(n_layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    bar = fig.colorbar(im, ax=ax, label="accuracy (%)")
    bar.ax.axhline(100 * base, color=BASELINE_COLOR, lw=3)
    ax.set_title(f"One head {'disabled' if gate == 'uniform' else gate + '-gated'} at a time: accuracy\n"
                 f"{title}; baseline {100 * base:.1f}% (orange); cells: change in points; framed: BH q < alpha",
                 fontsize=9)
    return fig


def plot_layers(rows: list[dict], title: str, gate: str = "uniform"):
    """Accuracy with each whole layer gated (points, with the exact interval of the change around
    them: level 1 - alpha, McNemar inverted), against the baseline line; significant layers starred."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = rows[0]["accuracy"]
    layers = _rows_of(rows, "layer")
    x = [r["layer"] for r in layers]
    acc = np.array([r["accuracy"] for r in layers])
    err = np.array([[base + r["delta"] - (base + r["ci_low"]), base + r["ci_high"] - (base + r["delta"])]
                    for r in layers]).T  # (2, layers): below and above the point
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(x) + 2), 3.4))
    ax.errorbar(x, 100 * acc, yerr=100 * err, fmt="o", color="tab:purple", capsize=4, ms=7,
                label="layer disabled, 95% CI")
    ax.axhline(100 * base, color=BASELINE_COLOR, lw=2, label=f"baseline {100 * base:.1f}%")
    for r in layers:
        if r["significant"]:
            ax.text(r["layer"], 100 * (base + r["ci_high"]) + 0.5, "*", ha="center", fontsize=14)
    lo = min(100 * (base + min(r["ci_low"] for r in layers)), 100 * base) - 3
    hi = max(100 * (base + max(r["ci_high"] for r in layers)), 100 * base) + 3
    ax.set_ylim(max(0, lo), min(100, hi))
    ax.set_xticks(x)
    ax.set_xlabel("layer")
    ax.set_ylabel("accuracy (%)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"One layer {'disabled' if gate == 'uniform' else gate + '-gated'} at a time\n{title}; "
                 "* BH q < alpha", fontsize=9)
    return fig
