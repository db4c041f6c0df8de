"""The surface analysis in the report (Clark et al. section 3), and the per-example output of
`bertscope run --per-example`."""
from __future__ import annotations

import warnings
import zipfile

import numpy as np

from bertscope.analyses.probes.cluster.stats import Thresholds
from bertscope.analyses.surface import paper
from bertscope.analyses.surface.outputs import (
    ENTROPY_BY_LAYER_FIGURE,
    ENTROPY_HEATMAP_FIGURE,
    HEADS_FILE,
    OFFSETS_HEATMAP_FIGURE,
    SPECIAL_HEATMAP_FIGURE,
    STATS_FILE,
    TOKENS_BY_LAYER_FIGURE,
)
from bertscope.engine.accumulate import HeadStats
from bertscope.report.page import RunFiles, Section, Table, heads_str, num, pct

PREV_NEXT_CUT = 0.5  # "> 50% of attention on the previous / next token" (Clark 3.1)
SEP_SEP_CUT = 0.9  # "[SEP] attends to [SEP] with > 90%" (Clark 3.2)

SURFACE_FIGURES = {
    TOKENS_BY_LAYER_FIGURE: (
        "Average attention to [CLS], [SEP] and '. or ,' by layer (Clark et al. Fig. 2). Each dot is one head, "
        "the line the layer mean; the last panel separates [SEP] rows attending to [SEP] from all other rows. "
        "Read it for where each special token takes the attention: in bert-base, [CLS] early, [SEP] in layers "
        "6-10, punctuation at the end."),
    ENTROPY_BY_LAYER_FIGURE: (
        "Mean attention entropy in nats by layer, over all rows and over [CLS] rows only (Clark et al. Fig. 4). "
        "Dots are heads; the dashed line is the entropy of uniform attention over the same tokens. Heads near "
        "it attend broadly (a bag of vectors), low values mean focused heads."),
    OFFSETS_HEATMAP_FIGURE: (
        "Layer x head attention mass on the previous, same and next token. A bright cell above 0.5 is a "
        "positional head (Clark et al. section 3.1: four previous-token and five next-token heads in bert-base)."),
    SPECIAL_HEATMAP_FIGURE: (
        "Layer x head attention mass on [CLS], [SEP], '. or ,' and, for [SEP] rows, on [SEP]. Bright "
        "columns of a layer show which special token that layer's heads lean on."),
    ENTROPY_HEATMAP_FIGURE: (
        "Layer x head mean attention entropy in nats (Clark et al. Fig. 4, head by head). Bright: broad heads, "
        "dark: heads that put their attention on a few tokens."),
}


DECODER_FIGURES = {
    TOKENS_BY_LAYER_FIGURE: (
        "Average attention to the first token of the segment (BOS where the tokenizer adds one), and to '. or ,' "
        "where the tokenizer has them, by layer. Each dot is one head, the line the layer mean. Under a causal "
        "mask every row sees the first token, and heads that have nothing to attend to park their attention "
        "there (an attention sink): a high layer mean says the layer's heads mostly do."),
    ENTROPY_BY_LAYER_FIGURE: (
        "Left: mean attention entropy in nats by layer, one dot per head; the dashed line is each layer's own "
        "uniform baseline, the mean over rows of ln n_visible(i), the entropy of uniform attention over the keys "
        "row i sees (i + 1 keys under a causal mask, at most the window in a windowed layer). Right: the distance "
        "from that baseline, the mean over rows of KL(p_i || uniform over the visible keys) = baseline - entropy: "
        "0 for a head that spreads evenly over what it sees, large for a focused one."),
    OFFSETS_HEATMAP_FIGURE: (
        "Layer x head attention mass on the previous and the same token (the next token is never visible "
        "under a causal mask, so it is left out). A bright cell above 0.5 is a positional head."),
    SPECIAL_HEATMAP_FIGURE: (
        "Layer x head attention mass on the first token and on '. or ,' (and [SEP] where the tokenizer has one). "
        "Bright cells on the first token are attention-sink heads."),
    ENTROPY_HEATMAP_FIGURE: (
        "Layer x head mean attention entropy, and its distance from uniform attention over the visible keys "
        "(KL, nats), on one scale. Read the second: raw entropy grows with the number of keys a row sees, so "
        "it is lower in windowed layers and early positions whatever the head does."),
}


def _grid(rows: list[dict], col: str, layers: int, heads: int) -> np.ndarray:
    g = np.full((layers, heads), np.nan)
    for r in rows:
        v = num(r.get(col))
        if v is not None:
            g[int(r["layer"]) - 1, int(r["head"]) - 1] = v
    return g


def _over(grid: np.ndarray, cut: float) -> list[str]:
    return [f"{i + 1}-{j + 1}" for i, j in zip(*np.nonzero(np.nan_to_num(grid, nan=-np.inf) > cut))]


def _uniform_entropy(run: RunFiles) -> float | None:
    """Entropy of uniform attention over the run's rows, from stats.npz (exact), else None."""
    if not run.has(STATS_FILE):
        return None
    try:
        return HeadStats.load(run.dir / STATS_FILE).uniform_entropy()
    # an unreadable checkpoint only costs the broad-head finding
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


def _layer_n_visible(run: RunFiles) -> np.ndarray | None:
    """(layers,) mean keys a row sees, from a decoder's stats.npz, else None."""
    if not run.has(STATS_FILE):
        return None
    try:
        return HeadStats.load(run.dir / STATS_FILE).layer_n_visible()
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # it only costs the column
        return None


@np.errstate(invalid="ignore")
def surface_findings(rows: list[dict], uniform: float | None) -> tuple[list[str], Table]:
    """The findings list and the per-layer table of the surface analysis. A layer whose heads
    were all removed (bertscope.models.head_removal) is NaN throughout: its means are NaN, quietly."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        return _surface_findings(rows, uniform)


def _surface_findings(rows: list[dict], uniform: float | None) -> tuple[list[str], Table]:
    layers = max(int(r["layer"]) for r in rows)
    heads = max(int(r["head"]) for r in rows)
    g = {c: _grid(rows, c, layers, heads) for c in ("prev", "next", "cls", "sep", "punct", "entropy",
                                                    "sep_sep", "rest_sep", "cls_entropy")}
    S, T = paper.SURFACE_NUMBERS, paper.SURFACE_TEXT
    out = []
    for col, name in (("prev", "previous"), ("next", "next")):
        hits = _over(g[col], PREV_NEXT_CUT)
        out.append(f"{len(hits)} {name}-token heads (more than {pct(PREV_NEXT_CUT)} of their attention on the "
                   f"{name} token): {heads_str(hits)}. Paper: {T[col + '_heads']} [{S[col + '_heads'].source.short}].")
    if uniform:
        cut = Thresholds.broad * uniform
        broad = _over(g["entropy"], cut)
        out.append(f"{len(broad)} broad heads (mean entropy above {Thresholds.broad:.0%} of uniform attention's "
                   f"{uniform:.2f} nats): {heads_str(broad)}.")
    flat = np.nan_to_num(g["entropy"], nan=np.inf).ravel()
    low = [f"{i // heads + 1}-{i % heads + 1} ({g['entropy'].ravel()[i]:.2f})" for i in np.argsort(flat)[:3]]
    out.append(f"Most focused heads (lowest entropy, nats): {', '.join(low)}.")
    layer_sep = np.nanmean(g["sep"], axis=1)
    layer_cls = np.nanmean(g["cls"], axis=1)
    sep_layers = [str(i + 1) for i in np.nonzero(layer_sep > paper.SURFACE_NUMBERS["sep_layers_half"].value)[0]]
    out.append(f"Attention to [SEP] per layer ranges from {pct(np.nanmin(layer_sep))} to "
               f"{pct(np.nanmax(layer_sep))} (highest in layer {int(np.nanargmax(layer_sep)) + 1}); layers with "
               f"over half of it on [SEP]: {', '.join(sep_layers) or 'none'}. Paper: {T['sep_layers']} "
               f"[{S['sep_layers_half'].source.short}].")
    out.append(f"Attention to [CLS] per layer ranges from {pct(np.nanmin(layer_cls))} to "
               f"{pct(np.nanmax(layer_cls))} (highest in layer {int(np.nanargmax(layer_cls)) + 1}).")
    sep_self = _over(g["sep_sep"], SEP_SEP_CUT)
    out.append(f"{len(sep_self)} of {layers * heads} heads have [SEP] rows putting more than {pct(SEP_SEP_CUT)} "
               f"on [SEP]. Paper: {T['sep_sep']} [{S['sep_sep'].source.short}].")
    sep_heads = _over(g["sep"], 0.5)
    noop = (f"[SEP] as a no-op: {len(sep_heads)} heads put more than half of all attention on [SEP]"
            + (f", and in {len(set(sep_heads) & set(sep_self))} of them [SEP] rows attend to [SEP] > "
               f"{pct(SEP_SEP_CUT)}, so attending to [SEP] mixes in little but [SEP]'s own state, the pattern "
               "the paper reads as a no-op" if sep_heads else ", so the no-op pattern does not show here")
            + f". The paper's evidence is a gradient test ({T['no_op']}): `bertscope heads attention-grad` "
            "measures it (section 'Attention gradients').")
    out.append(noop)
    if "cls_entropy" in rows[0]:  # runs made before the column existed lack it
        last = np.nanmean(g["cls_entropy"][-1])
        out.append(f"[CLS] entropy in the last layer: {last:.2f} nats. Paper: {T['cls_entropy_last']} "
                   f"[{S['cls_entropy_last'].source.short}].")
    table = Table("Per layer: mean over heads", ["layer", "[CLS]", "[SEP]", ". or ,", "entropy (nats)"],
                  [[i + 1, float(layer_cls[i]), float(layer_sep[i]), float(np.nanmean(g["punct"][i])),
                    float(np.nanmean(g["entropy"][i]))] for i in range(layers)],
                  shade={"[CLS]", "[SEP]", ". or ,", "entropy (nats)"})
    return out, table


@np.errstate(invalid="ignore")
def decoder_findings(rows: list[dict], n_visible: np.ndarray | None = None) -> tuple[list[str], Table]:
    """The findings and per-layer table of a decoder's heads.csv (a `first` column): Clark et al.'s
    numbers are bert-base's and are not quoted; the entropy is read against each layer's baseline.
    `n_visible`: (layers,) the mean number of keys a row sees (from stats.npz), a column when given."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        layers = max(int(r["layer"]) for r in rows)
        heads = max(int(r["head"]) for r in rows)
        cols = [c for c in ("prev", "self", "first", "punct", "sep", "entropy", "uniform_entropy", "kl_uniform")
                if c in rows[0]]
        g = {c: _grid(rows, c, layers, heads) for c in cols}
        out = []
        for col, name in (("prev", "previous-token"), ("self", "self"), ("first", "first-token")):
            hits = _over(g[col], PREV_NEXT_CUT)
            what = {"prev": "the previous token", "self": "themselves", "first": "the first token"}[col]
            out.append(f"{len(hits)} {name} heads (more than {pct(PREV_NEXT_CUT)} of their attention on {what}): "
                       f"{heads_str(hits)}.")
        layer_first = np.nanmean(g["first"], axis=1)
        out.append(f"Attention to the first token per layer ranges from {pct(np.nanmin(layer_first))} to "
                   f"{pct(np.nanmax(layer_first))} (highest in layer {int(np.nanargmax(layer_first)) + 1}). Every "
                   "row of a causal model sees the first token, so a head with nothing else to attend to can put "
                   "its attention there.")
        baseline = g["uniform_entropy"]  # (layers, H), the same for every head of a layer
        broad = _over(g["entropy"] - Thresholds.broad * baseline, 0.0)
        out.append(f"{len(broad)} broad heads (mean entropy above {Thresholds.broad:.0%} of their layer's uniform "
                   f"baseline, the mean of ln n_visible over the rows, {np.nanmin(baseline[:, 0]):.2f} to "
                   f"{np.nanmax(baseline[:, 0]):.2f} nats): {heads_str(broad)}.")
        flat = np.nan_to_num(g["kl_uniform"], nan=-np.inf).ravel()
        top = [f"{i // heads + 1}-{i % heads + 1} ({g['kl_uniform'].ravel()[i]:.2f})"
               for i in np.argsort(-flat, kind="stable")[:3]]
        out.append(f"Most focused heads (largest KL divergence from uniform attention over the visible keys, "
                   f"nats): {', '.join(top)}.")
        seen = n_visible is not None and len(n_visible) == layers
        columns = ["layer", "first token", "previous", "self"] + (["'. or ,'"] if "punct" in g else []) \
            + ["entropy (nats)", "uniform (nats)", "KL from uniform"] + (["keys seen"] if seen else [])
        table = Table("Per layer: mean over heads (uniform: the mean over rows of ln n_visible(i); keys seen: the "
                      "mean of n_visible(i))", columns,
                      [[i + 1, float(layer_first[i]), float(np.nanmean(g["prev"][i])), float(np.nanmean(g["self"][i]))]
                       + ([float(np.nanmean(g["punct"][i]))] if "punct" in g else [])
                       + [float(np.nanmean(g["entropy"][i])), float(baseline[i, 0]),
                          float(np.nanmean(g["kl_uniform"][i]))]
                       + ([round(float(n_visible[i]), 1)] if seen else []) for i in range(layers)],
                      shade=set(columns) - {"layer", "uniform (nats)", "keys seen"})
    return out, table


def build(run: RunFiles) -> Section | None:
    rows = run.csv(HEADS_FILE)
    if not rows:
        return None
    if "first" in rows[0]:
        return build_decoder(run, rows)
    findings, per_layer = surface_findings(rows, _uniform_entropy(run))
    cols = [c for c in rows[0] if c != "n_tokens"]
    shaded = set(cols) - {"layer", "head"}
    table = Table("Per head (heads.csv): mean attention mass and entropy", cols,
                  [[int(r[c]) if c in ("layer", "head") else num(r[c]) for c in cols] for r in rows], shade=shaded)
    figures = [f for name, cap in SURFACE_FIGURES.items() if (f := run.figure(name, cap))]
    return Section("Surface-level attention patterns (Clark et al. 2019, section 3)",
                   intro="Where each head's attention goes on average over the corpus: relative positions, "
                   "special tokens, and how broad it is.",
                   findings=findings, tables=[per_layer, table], figures=figures)

def build_decoder(run: RunFiles, rows: list[dict]) -> Section:
    """The section of a causal model's run (heads.csv has `first`, `uniform_entropy`, `kl_uniform`)."""
    findings, per_layer = decoder_findings(rows, _layer_n_visible(run))
    cols = [c for c in rows[0] if c != "n_tokens"]
    table = Table("Per head (heads.csv): mean attention mass, entropy, its uniform baseline and the KL from it", cols,
                  [[int(r[c]) if c in ("layer", "head") else num(r[c]) for c in cols] for r in rows],
                  shade=set(cols) - {"layer", "head", "uniform_entropy"})
    figures = [f for name, cap in DECODER_FIGURES.items() if (f := run.figure(name, cap))]
    return Section("Surface-level attention patterns of a causal model",
                   intro="Where each head's attention goes on average over the corpus, over the keys each row can "
                   "see: row i of a causal model sees tokens 1..i only (a windowed layer the last few). The first "
                   "token takes [CLS]'s place (the model has no [CLS]); the next token and any class the tokenizer "
                   "lacks are left out, being 0 by construction; entropy is read against each layer's uniform "
                   "baseline ln n_visible(i).",
                   findings=findings, tables=[per_layer, table], figures=figures)


def build_per_example(run: RunFiles) -> Section | None:
    info = run.record.get("per_example")
    if not info or not run.has(info.get("file", "")):
        return None
    return Section("Per-example statistics", intro=f"{info['file']}: {info.get('rows')} rows, one per (segment, "
                   "layer, head), for significance tests across runs (bertscope compare).")
