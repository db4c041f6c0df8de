"""Figures for the surface-level attention analysis (Clark et al. 2019, section 3).

`plot_surface` turns the per-head table of `bertscope.analyses.surface.stats` (every column a
(n_layers, n_heads) array) into five PNGs:

    fig_tokens_by_layer.png   attention to [CLS] / [SEP] / ". or ," by layer, and to [SEP]
                              from other tokens and from [SEP] itself         (Clark Fig. 2)
    fig_entropy_by_layer.png  attention entropy by layer, all rows and [CLS]    (Clark Fig. 4)
    fig_offsets_heatmap.png   layer x head mass on previous / same / next token
                              (the numbers behind Clark 3.1 "relative position"; no paper figure)
    fig_special_heatmap.png   layer x head mass on [CLS], [SEP], ". or ,", and [SEP] -> [SEP]
                              (Clark Fig. 2 head by head, plus the ">90% [SEP]->[SEP]" claim)
    fig_entropy_heatmap.png   layer x head mean attention entropy in nats (Clark Fig. 4 head by head)

A decoder's table (`stats.layout_table`: a `first` column for the first token, each layer's
`uniform_entropy`, no `next`, no class its tokenizer lacks) gets the same five files: panels
of columns the table lacks are left out, the first token takes [CLS]'s panels, and the
entropy figures draw each layer's own uniform baseline (ln n_visible(i), per layer) and the
KL divergence from it (`kl_uniform`) instead of the [CLS] row, whose entropy is 0 under a
causal mask.

Heads are labelled `<layer>-<head>` from 1, as in the paper. Colours are the Okabe-Ito
palette for points and viridis / magma for heatmaps, all colourblind-safe. Heatmap
cells show their value when the grid is at most 12 x 12; NaN cells are left blank.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np

from bertscope.analyses.surface.outputs import (
    ENTROPY_BY_LAYER_FIGURE,
    ENTROPY_HEATMAP_FIGURE,
    OFFSETS_HEATMAP_FIGURE,
    SPECIAL_HEATMAP_FIGURE,
    TOKENS_BY_LAYER_FIGURE,
)
from bertscope.report.plotting import layer_head_ticks

DPI = 150
ANNOTATE_MAX = 12  # annotate heatmap cells when both layers and heads are <= this
# Okabe-Ito colours (colourblind-safe).
BLUE, ORANGE, GREEN, VERMILLION = "#0072B2", "#E69F00", "#009E73", "#D55E00"


# Every figure, with its drawing time relative to the others (measured on the 6 x 12 MiniLM;
# the annotated heatmaps cost most), so that figure helpers get equal shares (bertscope.report.figure_pool).
FIGURES = {TOKENS_BY_LAYER_FIGURE: 3, ENTROPY_BY_LAYER_FIGURE: 2, OFFSETS_HEATMAP_FIGURE: 4,
           SPECIAL_HEATMAP_FIGURE: 5, ENTROPY_HEATMAP_FIGURE: 2}


def new_figure(**kwargs):
    """A matplotlib Figure drawn by Agg, outside pyplot: no global backend switch (safe in a
    notebook), nothing to close, and matplotlib is imported only when a figure is drawn, so
    that a run's main process never imports it (its figure helpers do)."""
    from matplotlib.figure import Figure  # see the docstring

    return Figure(**kwargs)


def colormaps():
    from matplotlib import colormaps as registry  # as in new_figure: only where a figure is drawn

    return registry


def warm_up():
    """Import matplotlib and load the fonts by drawing a tiny figure: what a figure helper
    does while it waits for its job (bertscope.report.figure_pool)."""
    fig = new_figure(figsize=(1, 1))
    fig.text(0.5, 0.5, "0.12")
    fig.savefig(io.BytesIO(), format="png", dpi=10)


def plot_surface(table: dict[str, np.ndarray], out_dir: Path, title: str,
                 uniform_entropy: float | None = None,
                 cls_uniform_entropy: float | None = None, names=tuple(FIGURES)) -> list[Path]:
    """Write the surface-pattern figures `names` (default: all five) into `out_dir`; return their paths.

    `title` names the model and prefixes every figure title. `uniform_entropy` and
    `cls_uniform_entropy` are the entropies of uniform attention over the same tokens
    (drawn as dashed baselines in the entropy-by-layer figure when given).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if "first" in table:
        draw = _decoder_figures(table, title)
    else:
        draw = {
            TOKENS_BY_LAYER_FIGURE: lambda path: _tokens_by_layer(table, path, title),
            ENTROPY_BY_LAYER_FIGURE: lambda path: _entropy_by_layer(table, path, title, uniform_entropy,
                                                                    cls_uniform_entropy),
            OFFSETS_HEATMAP_FIGURE: lambda path: _heatmaps(
                table, [("prev", "previous token"), ("self", "current token"), ("next", "next token")], path,
                f"{title}: average attention to relative positions", "average attention"),
            SPECIAL_HEATMAP_FIGURE: lambda path: _heatmaps(
                table, [("cls", "[CLS]"), ("sep", "[SEP]"), ("punct", '". or ,"'),
                        ("sep_sep", "[SEP] → [SEP] (from [SEP] rows)")], path,
                f"{title}: average attention to special tokens", "average attention"),
            ENTROPY_HEATMAP_FIGURE: lambda path: _heatmaps(
                table, [("entropy", "")], path, f"{title}: average attention entropy per head", "entropy (nats)",
                vmin=None, vmax=None, cmap="magma"),
        }
    unknown = set(names) - set(draw)
    if unknown:
        raise ValueError(f"no surface figure named {', '.join(sorted(unknown))}")
    return [draw[name](out_dir / name) for name in names]


def _decoder_figures(table, title: str) -> dict:
    """The five figures of a decoder's table: the columns it has, the first token for [CLS],
    each layer's uniform baseline and the KL divergence from it for the [CLS] row's entropy."""
    special = [(c, label) for c, label in (("first", "first token"), ("sep", "[SEP]"), ("punct", '". or ,"'),
                                           ("sep_sep", "[SEP] → [SEP] (from [SEP] rows)")) if c in table]
    offsets = [(c, label) for c, label in (("prev", "previous token"), ("self", "current token"),
                                           ("next", "next token")) if c in table]
    return {
        TOKENS_BY_LAYER_FIGURE: lambda path: _tokens_by_layer(table, path, title),
        ENTROPY_BY_LAYER_FIGURE: lambda path: _decoder_entropy_by_layer(table, path, title),
        OFFSETS_HEATMAP_FIGURE: lambda path: _heatmaps(
            table, offsets, path, f"{title}: average attention to relative positions", "average attention"),
        SPECIAL_HEATMAP_FIGURE: lambda path: _heatmaps(
            table, special, path, f"{title}: average attention to the first token and special tokens",
            "average attention"),
        ENTROPY_HEATMAP_FIGURE: lambda path: _heatmaps(
            table, [("entropy", "entropy"), ("kl_uniform", "below uniform (KL)")], path,
            f"{title}: average attention entropy per head, and its distance from uniform", "nats",
            vmin=0.0, vmax=None, cmap="magma"),
    }


def _decoder_entropy_by_layer(table, path: Path, title: str) -> Path:
    """Entropy by layer against each layer's own uniform baseline (mean ln n_visible(i)), and
    the KL divergence from that baseline (`kl_uniform`), one dot per head."""
    rng = np.random.default_rng(0)
    fig = new_figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    entropy = np.asarray(table["entropy"], dtype=float)
    baseline = np.asarray(table["uniform_entropy"], dtype=float)[:, 0]  # (layers,) the same for every head
    _by_layer(axes[0], entropy, BLUE, rng)
    layers = np.arange(1, len(baseline) + 1)
    axes[0].plot(layers, baseline, ls="--", color="grey", lw=1.2, label="uniform over the visible keys")
    top = 1.1 * max(_finite_max(entropy), _finite_max(baseline)) or 1.0
    axes[0].set_ylim(-0.02 * top, top)
    axes[0].set_title("attention entropy")
    axes[0].set_ylabel("average entropy (nats)")
    kl = np.asarray(table["kl_uniform"], dtype=float)
    _by_layer(axes[1], kl, VERMILLION, rng)
    top = 1.1 * _finite_max(kl) or 1.0
    axes[1].set_ylim(-0.02 * top, top)
    axes[1].set_title("below uniform: KL(p || uniform over visible keys)")
    axes[1].set_ylabel("nats")
    fig.suptitle(f"{title}: attention entropy by layer, against uniform attention over the keys each row sees")
    return _save(fig, path, legend_axes=axes)


# ---------------------------------------------------------------------------- by layer

def _by_layer(ax, values: np.ndarray, color: str, rng: np.random.Generator, label: str = "head",
              mean_color: str = "black") -> None:
    """One jittered point per head at its layer, plus the per-layer mean as a line."""
    n_layers, n_heads = values.shape
    layers = np.arange(1, n_layers + 1)
    jitter = 0.15 if n_heads > 1 else 0.0
    x = np.repeat(layers[:, None], n_heads, axis=1) + rng.uniform(-jitter, jitter, values.shape)
    ax.scatter(x.ravel(), values.ravel(), s=14, color=color, alpha=0.6, linewidths=0, label=label)
    with warnings.catch_warnings():  # an all-NaN layer gives a NaN mean, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(values, axis=1)
    ax.plot(layers, mean, color=mean_color, lw=1.5, marker="o", ms=3,
            label="layer mean" if mean_color == "black" else None)
    ax.set_xlabel("layer")
    ax.set_xticks(layers if n_layers <= 16 else layers[::2])
    ax.set_xlim(0.5, n_layers + 0.5)
    ax.grid(axis="y", alpha=0.3)


def _tokens_by_layer(table, path: Path, title: str) -> Path:
    """Clark Fig. 2: per-head average attention to [CLS], [SEP] and ". or ," by layer, and
    (his middle panel) the attention to [SEP] from other tokens beside [SEP] -> [SEP]."""
    rng = np.random.default_rng(0)
    panels = [("cls", "[CLS]", BLUE), ("sep", "[SEP]", ORANGE), ("punct", '". or ,"', GREEN)]
    decoder = "first" in table  # a decoder's table: the first token for [CLS], only the classes it has
    if decoder:
        panels = [p for p in [("first", "the first token", BLUE)] + panels[1:] if p[0] in table]
    from_sep = [c for c in ("rest_sep", "sep_sep") if c in table]
    fig = new_figure(figsize=(4 * (len(panels) + bool(from_sep)), 3.8))
    axes = fig.subplots(1, len(panels) + bool(from_sep), sharey=False, squeeze=False)[0]
    for ax, (col, label, color) in zip(axes, panels):
        values = np.asarray(table[col], dtype=float)
        _by_layer(ax, values, color, rng)
        _mass_axis(ax, values, f"attention to {label}")
    if from_sep:
        ax = axes[-1]
        series = {"rest_sep": ("other → [SEP]", VERMILLION), "sep_sep": ("[SEP] → [SEP]", BLUE)}
        for col in from_sep:
            label, color = series[col]
            _by_layer(ax, np.asarray(table[col], dtype=float), color, rng, label=label, mean_color=color)
        _mass_axis(ax, np.concatenate([np.asarray(table[c], dtype=float).ravel() for c in from_sep]),
                   "attention to [SEP], by query")
    fig.suptitle(f"{title}: average attention to the first token and special tokens by layer" if decoder
                 else f"{title}: average attention to special tokens by layer (Clark et al. Fig. 2)")
    return _save(fig, path, legend_axes=axes)


def _mass_axis(ax, values: np.ndarray, title: str) -> None:
    top = min(1.02, max(0.05, 1.1 * _finite_max(values)))
    ax.set_ylim(-0.02 * top, top)  # a little room so points at 0 are not clipped
    ax.set_title(title)
    ax.set_ylabel("average attention")


def _entropy_by_layer(table, path: Path, title: str, uniform: float | None,
                      cls_uniform: float | None) -> Path:
    """Clark Fig. 4: per-head attention entropy by layer, over all rows and the [CLS] row,
    with the entropy of uniform attention as a dashed baseline."""
    rng = np.random.default_rng(0)
    panels = [("entropy", "all tokens", BLUE, uniform),
              ("cls_entropy", "[CLS] token", VERMILLION, cls_uniform)]
    fig = new_figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    for ax, (col, label, color, base) in zip(axes, panels):
        values = np.asarray(table[col], dtype=float)
        _by_layer(ax, values, color, rng)
        if base is not None:
            ax.axhline(base, ls="--", color="grey", lw=1.2, label="uniform attention")
        top = 1.1 * max(_finite_max(values), base or 0.0) or 1.0
        ax.set_ylim(-0.02 * top, top)
        ax.set_title(f"attention entropy from {label}")
        ax.set_ylabel("average entropy (nats)")
    fig.suptitle(f"{title}: attention entropy by layer (Clark et al. Fig. 4)")
    return _save(fig, path, legend_axes=axes)


# ---------------------------------------------------------------------------- heatmaps

def _heatmaps(table, panels: list[tuple[str, str]], path: Path, suptitle: str, cbar_label: str,
              vmin: float | None = 0.0, vmax: float | None = 1.0, cmap: str = "viridis") -> Path:
    """Layer x head heatmaps, one panel per column, on one shared colour scale.

    Cells carry their value (2 decimals) when the grid is at most 12 x 12. `vmin`/`vmax`
    of None means the data range over all panels.
    """
    grids = [np.asarray(table[col], dtype=float) for col, _ in panels]
    n_layers, n_heads = grids[0].shape
    finite = np.concatenate([g[np.isfinite(g)] for g in grids])
    lo = vmin if vmin is not None else (finite.min() if finite.size else 0.0)
    hi = vmax if vmax is not None else (finite.max() if finite.size else 1.0)
    if hi <= lo:
        hi = lo + 1.0
    annotate = n_layers <= ANNOTATE_MAX and n_heads <= ANNOTATE_MAX

    cell = 0.36 if annotate else 0.2
    pw, ph = max(2.6, cell * n_heads + 0.8), max(2.2, cell * n_layers + 0.7)
    # Fill a full grid of panels, picking the one closest to a 1.6:1 landscape page.
    ncols = min((c for c in range(1, len(panels) + 1) if len(panels) % c == 0),
                key=lambda c: abs(np.log(c * pw / (-(-len(panels) // c) * ph) / 1.6)))
    nrows = -(-len(panels) // ncols)
    fig = new_figure(figsize=(ncols * pw + 1.0, nrows * ph + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    cm = colormaps()[cmap]
    for ax, grid, (_, label) in zip(axes.flat, grids, panels):
        im = ax.imshow(grid, cmap=cm, vmin=lo, vmax=hi, aspect="auto", interpolation="nearest")
        if label:
            ax.set_title(label, fontsize=10)
        layer_head_ticks(ax, n_layers, n_heads)
        if annotate:
            size = 7 if max(n_layers, n_heads) > 6 else 9
            for (i, j), v in np.ndenumerate(grid):
                if np.isfinite(v):
                    r, g, b, _ = cm((v - lo) / (hi - lo))
                    ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=size, color=ink,
                            in_layout=False)  # inside the axes: the layout need not measure them
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    fig.colorbar(im, ax=axes, shrink=0.9 if nrows > 1 else 1.0, label=cbar_label)
    fig.suptitle(suptitle)
    return _save(fig, path, tight=False)


# ---------------------------------------------------------------------------- helpers

def _finite_max(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else 1.0


def _save(fig, path: Path, tight: bool = True, legend_axes=()) -> Path:
    """Write `fig` to `path`; one shared legend below `legend_axes` if given."""
    if len(legend_axes):
        entries = {}
        for ax in legend_axes:
            for h, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, h)
        fig.legend(entries.values(), entries.keys(), loc="lower center", ncols=len(entries),
                   fontsize=9, frameon=False)
    if tight:
        fig.tight_layout(rect=(0, 0.07 if len(legend_axes) else 0, 1, 1))
    fig.savefig(path, dpi=DPI)
    return path

