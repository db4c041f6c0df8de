"""The figures of `bertscope heads positions`: each takes a `PositionStats` and returns a matplotlib figure."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from bertscope.analyses.heads.positions.stats import PositionStats, bucket_bounds
from bertscope.kernels.spec import N_POSITION_BINS, distance_bucket_names, position_bin_names


def _layer_labels(stats: PositionStats) -> list[str]:
    return [f"{i + 1}" + (" w" if w is not None else "") for i, w in enumerate(stats.windows)]


def _height(stats: PositionStats) -> float:
    return max(3.4, 1.4 + 0.22 * stats.n_layers)


def _short(name: str) -> str:
    """A distance bucket by its first distance: 0, 1, 2, 4, ..., 512, 1k, ..., 32k+."""
    lo = int(name.split("-")[0].rstrip("+"))
    return (f"{lo // 1024}k" if lo >= 1024 else str(lo)) + ("+" if name.endswith("+") else "")


def plot_distance(stats: PositionStats, title: str):
    """Layer x log2 distance bucket: the mean mass (over heads and every query), log colour scale,
    the buckets beyond the farthest any row reached left out, a red edge where a window ends;
    beside it each layer's mean distance."""
    prof = stats.distance_profile().mean(1)  # (Ly, DB)
    used = np.flatnonzero(np.nan_to_num(prof).max(0) > 0)
    last = int(used.max()) + 1 if used.size else 1  # the buckets up to the farthest any row reached
    names = distance_bucket_names()[:last]
    fig, (ax, side) = plt.subplots(1, 2, figsize=(2.0 + 0.45 * last + 2.2, _height(stats)),
                                   gridspec_kw={"width_ratios": [0.45 * last, 1.8]})
    shown = np.where(prof[:, :last] > 0, prof[:, :last], np.nan)
    im = ax.imshow(np.log10(shown), aspect="auto", cmap="viridis", vmin=-4, vmax=0, interpolation="nearest")
    ax.set_xticks(range(last))
    ax.set_xticklabels([_short(n) for n in names], rotation=60, fontsize=7)
    ax.set_yticks(range(stats.n_layers))
    ax.set_yticklabels(_layer_labels(stats), fontsize=7)
    ax.set_xlabel("query-key distance |i - j| (log2 bucket from)")
    ax.set_ylabel("layer (w: sliding window)")
    for layer, w in enumerate(stats.windows):  # where a windowed layer's window ends
        if w is not None:
            edge = next(b for b, (lo, _) in enumerate(bucket_bounds()) if lo > w)
            if edge < last:
                ax.plot([edge - 0.5, edge - 0.5], [layer - 0.5, layer + 0.5], color="red", lw=1.2)
    fig.colorbar(im, ax=ax, fraction=0.05).set_label("log10 mass (blank: 0)", fontsize=8)
    md = stats.mean_distance().mean(1)
    side.barh(range(stats.n_layers), md, color=["tab:grey" if w is not None else "tab:blue" for w in stats.windows])
    side.set_ylim(stats.n_layers - 0.5, -0.5)
    side.set_yticks([])
    side.set_xscale("symlog", linthresh=1)
    side.set_xlabel("mean distance (tokens)", fontsize=8)
    side.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{title}\nattention by query-key distance, mean over heads and every query", fontsize=9)
    fig.tight_layout()
    return fig


def plot_profile(stats: PositionStats, title: str):
    """Layer x tenth of the context: the late queries' mean mass (over heads), and the mean over
    layers with and without the first token (the attention sink) in the first tenth."""
    pos = stats.position_profile().mean(1)  # (Ly, PB)
    bidirectional = bool(np.nansum(pos[:, N_POSITION_BINS]) > 0)
    cols = N_POSITION_BINS + (1 if bidirectional else 0)
    names = position_bin_names()[:cols]
    fig, (ax, line) = plt.subplots(1, 2, figsize=(9.5, _height(stats)),
                                   gridspec_kw={"width_ratios": [1.2, 1]})
    im = ax.imshow(pos[:, :cols], aspect="auto", cmap="magma", vmin=0, interpolation="nearest")
    ax.set_xticks(range(cols))
    ax.set_xticklabels(names, rotation=60, fontsize=7)
    ax.set_yticks(range(stats.n_layers))
    ax.set_yticklabels(_layer_labels(stats), fontsize=7)
    ax.set_xlabel("key's place in the query's context (tenths)")
    ax.set_ylabel("layer (w: sliding window)")
    fig.colorbar(im, ax=ax, fraction=0.05).set_label("attention mass", fontsize=8)
    x = np.arange(N_POSITION_BINS) + 0.5
    kinds = stats.layer_kinds()
    for kind in dict.fromkeys(kinds):
        layers = [i for i, k in enumerate(kinds) if k == kind]
        line.plot(x, pos[layers, :N_POSITION_BINS].mean(0), marker="o", ms=3, label=f"{kind} layers")
    wo = stats.position_profile(without_first=True).mean((0, 1))
    line.plot(x, wo[:N_POSITION_BINS], ls="--", color="black", lw=1, label="every layer, first token left out")
    line.axhline(1 / N_POSITION_BINS, color="grey", lw=0.6, ls=":")
    line.set_yscale("log")
    line.yaxis.set_minor_formatter(NullFormatter())
    line.tick_params(axis="y", labelsize=7)
    line.set_xlabel("key's place in the context (tenths)", fontsize=8)
    line.set_ylabel("mass (log)", fontsize=8)
    line.set_xticks(range(0, N_POSITION_BINS + 1, 2))
    line.set_xticklabels([f"{10 * t}%" for t in range(0, N_POSITION_BINS + 1, 2)], fontsize=7)
    line.legend(fontsize=6)
    fig.suptitle(f"{title}\nlate queries (last {100 * stats.late:g}% of each segment): attention by the key's place "
                 "in the context, mean over heads", fontsize=9)
    fig.tight_layout()
    return fig
