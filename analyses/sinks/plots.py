"""The figures of `bertscope sinks`: each function takes a `SinkStats` and returns a matplotlib figure."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bertscope.analyses.sinks.stats import SinkStats, bucket_bounds


def _layer_labels(stats: SinkStats) -> list[str]:
    return [f"{i + 1}" + (" w" if w else "") for i, w in enumerate(stats.windows)]


def _layer_ticks(ax, n_layers: int):
    ax.set_xticks(np.arange(1, n_layers + 1, 1 if n_layers <= 32 else 2))
    ax.tick_params(axis="x", labelsize=7)


def _bucket_label(lo: int) -> str:
    """A bucket by its first position: 0, 1, 2, 4, ..., 512, 1k, 2k, ..., 16k."""
    return f"{lo // 1024}k" if lo >= 1024 else str(lo)


def plot_positions(stats: SinkStats, title: str):
    """Layer x log2 query-position bucket: the mean first-token mass (over heads and the rows of the bucket)."""
    V = len(stats.variants)
    used = np.flatnonzero(stats.rows_bucket.sum(0) > 0)
    last = int(used.max()) + 1 if used.size else 1
    bounds = bucket_bounds(stats.buckets)
    fig, axes = plt.subplots(1, V, figsize=(1.2 + 0.42 * stats.buckets * V + 1.5, 0.9 + 0.24 * stats.n_layers),
                             squeeze=False)
    for v, ax in enumerate(axes[0]):
        m = stats.position_mass(v).copy()
        m[:, last:] = np.nan
        im = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(stats.buckets))
        ax.set_xticklabels([_bucket_label(lo) for lo, _ in bounds], rotation=60, fontsize=7)
        ax.set_yticks(range(stats.n_layers))
        ax.set_yticklabels(_layer_labels(stats), fontsize=7)
        ax.set_xlabel("query position (log2 bucket from)")
        ax.set_ylabel("layer (w: sliding window)")
        ax.set_title(f"{stats.variants[v]}" if V > 1 else "first-token mass", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="attention on the first token")
    fig.suptitle(f"{title}: attention on the first token by layer and query position", fontsize=10)
    return fig


def plot_heads(stats: SinkStats, title: str):
    """Layer x head alpha_1 (pooled), heads over epsilon marked."""
    V = len(stats.variants)
    fig, axes = plt.subplots(1, V, figsize=(1.5 + (0.35 * stats.n_heads + 1.2) * V, 0.9 + 0.24 * stats.n_layers),
                             squeeze=False)
    for v, ax in enumerate(axes[0]):
        a = stats.alpha(v)
        im = ax.imshow(a, aspect="auto", cmap="magma", vmin=0, vmax=1, interpolation="nearest")
        ys, xs = np.nonzero(a > stats.epsilon)
        ax.scatter(xs, ys, marker=".", s=8, c="cyan")
        ax.set_xticks(range(stats.n_heads))
        ax.set_xticklabels(range(1, stats.n_heads + 1), fontsize=7)
        ax.set_yticks(range(stats.n_layers))
        ax.set_yticklabels(_layer_labels(stats), fontsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer (w: sliding window)")
        ax.set_title(f"{stats.variants[v]}: Sink^{stats.epsilon:g} = {100 * stats.sink_metric(v):.1f}%", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="alpha_1 (dot: > epsilon)")
    fig.suptitle(f"{title}: alpha_1 per head", fontsize=10)
    return fig


def plot_layers(stats: SinkStats, title: str):
    """Per layer, mean over heads: alpha_1 and the first-token mass over every query, each variant."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(1, stats.n_layers + 1)
    for i, w in enumerate(stats.windows):
        if w:
            ax.axvspan(i + 0.5, i + 1.5, color="0.92", lw=0)
    for v, name in enumerate(stats.variants):
        line, = ax.plot(x, stats.alpha(v).mean(1), marker="o", ms=3, label=f"alpha_1 ({name})")
        ax.plot(x, stats.layer_first_mass(v), ls="--", color=line.get_color(), label=f"mass over every query ({name})")
    ax.axhline(stats.epsilon, color="0.5", lw=0.8, ls=":")
    _layer_ticks(ax, stats.n_layers)
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer" + (" (grey: sliding window)" if any(stats.windows) else ""))
    ax.set_ylabel("attention on the first token")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    ax.set_title(f"{title}: first-token attention by layer", fontsize=10)
    return fig


def plot_massive(stats: SinkStats, title: str):
    """Per layer: the largest |h| at the first token, the largest elsewhere, the median |h| (log scale)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(1, stats.n_layers + 1)
    for v, name in enumerate(stats.variants):
        h = stats.hidden_means(v)
        if not h:
            continue
        suffix = f" ({name})" if len(stats.variants) > 1 else ""
        line, = ax.plot(x, h["first_max"], marker="o", ms=3, label="max |h|, first token" + suffix)
        ax.plot(x, h["rest_max"], ls="--", color=line.get_color(), label="max |h|, other tokens" + suffix)
        ax.plot(x, h["median"], ls=":", color=line.get_color(), label="median |h|" + suffix)
    ax.set_yscale("log")
    _layer_ticks(ax, stats.n_layers)
    ax.set_xlabel("layer (output of the block)")
    ax.set_ylabel("|hidden state|, mean over segments")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    ax.set_title(f"{title}: massive activations", fontsize=10)
    return fig
