"""The per-head table of the surface statistics (Clark et al. 2019, section 3): `bertscope run`'s heads.csv,
the notebook API's `Scope.stats` and the viewer's statistics. The sums of a `HeadStats` in, one (layers, H)
array per column out (`head_table`; `table_rows`: the rows of heads.csv); `run_spec` is the spec a run with
the default settings computes it from. The surface analysis (`bertscope.analyses.surface`) writes it, sums it
up in the terminal and draws it.

Per head, averaged over every non-padding query token of the corpus:
    prev / self / next   mass on the token at offset -1 / 0 / +1 (Clark's Fig. 1 heads)
    cls / sep / punct    mass on [CLS], [SEP], "." or "," (Clark's Fig. 2)
    other                the rest of the mass (cls + sep + punct + other = 1)
    entropy              row entropy in nats (Clark's Fig. 4): low for focused heads,
                         near ln(L) for heads that attend broadly ("bag of vectors")
and over special rows only:
    sep_sep              mass [SEP] rows put on [SEP] keys (Clark: > 90% in many heads)
    rest_sep             mass every other row puts on [SEP] keys (Clark's "other -> [SEP]",
                         beside [SEP] -> [SEP] in his Fig. 2)
    cls_entropy          entropy of the [CLS] row (Clark: 3.89 nats in bert-base layer 12)
Mass columns are means of the attention probabilities themselves, as in the paper. Means
pool all tokens of the corpus, or with `HeadStats(average="segments")` are means over
segments of per-segment means, as Clark et al.'s notebook computed them; `n_tokens` is
the number of query tokens either way. With
wider offsets (`--max-offset`) come `offset_-2`, `offset_+2`, ... columns; with `--argmax`
the `argmax_*` columns give the share of tokens whose most-attended key is of that kind, a
stricter "this head points at X" reading (off by default: an index-tracking reduction
over every map costs several times a plain max, a few percent of the whole pass).

Decoders (and any model whose attention is not an encoder's plain one: `HeadStats.layouts`)
get a table of their own, `LAYOUT_COLUMNS`, where every number means something for rows that
see different numbers of keys:
    first                mass on the first real token of the segment (BOS where the tokenizer
                         adds one): a causal model's [CLS]-like key, every row sees it
                         (`bertscope.text.token_classes.first_token_class`); replaces cls
    uniform_entropy      mean over the rows of ln n_visible(i), the entropy of uniform attention
                         over the keys each row sees: the layer's baseline (Gemma-3's windowed
                         and global layers have different ones)
    kl_uniform           uniform_entropy - entropy: the mean over rows of KL(p_i || uniform over
                         the keys row i sees), in nats; 0 for a head that spreads evenly, large
                         for a focused one. A mean of per-row differences, so it stays exact
                         where a ratio of means would weigh long rows more and a per-row ratio
                         is undefined on rows that see one key
With `--norms` (docs/norms.md; Kobayashi et al. 2020) each mass column has a norm-based twin: cls_norm,
sep_norm, punct_norm, other_norm, prev_norm, self_norm, next_norm (a decoder's first_norm), the share of
the row's sum_j p_ij ||f(x_j)|| that those keys contribute, f(x_j) the key's value vector through the
head's slice of the output projection; and weighted_norm, the mean of sum_j p_ij ||f(x_j)|| itself.
Columns that are 0 by construction are left out rather than shown as 0: under a causal mask
next and every positive offset (a row sees no later key) and cls_entropy (the first row sees
one key: entropy 0); for any non-plain layout, a class no token of the corpus has ([SEP] for
a decoder's tokenizer without one) and the sep_sep / rest_sep columns that read it.
"""
from __future__ import annotations

import numpy as np

from bertscope.engine.accumulate import HeadStats
from bertscope.kernels.spec import StatsSpec

# the statistics the table reads (`bertscope run` adds its own offsets and --argmax: `run_spec`)
NEEDS = StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, entropy=True, class_mass=True)

COLUMNS = (
    "layer", "head", "prev", "self", "next", "cls", "sep", "punct", "other", "sep_sep", "rest_sep",
    "entropy", "cls_entropy", "n_tokens",
)
ARGMAX_COLUMNS = ("argmax_prev", "argmax_self", "argmax_next", "argmax_cls", "argmax_sep", "argmax_punct")

def run_spec(max_offset: int = 2, argmax: bool = False, norms: bool = False) -> StatsSpec:
    """The spec of `bertscope run` with `--max-offset`, `--argmax` and `--norms` (by default: offsets -2..2,
    the four key classes, entropy, no argmax, no norm-based twins): what the notebook API and the viewer
    compute by default, and what `bertscope.analyses.surface.command.RunSettings.spec` returns."""
    own = StatsSpec(offsets=tuple(range(-max_offset, max_offset + 1)), n_key_classes=4,
                    entropy=True, class_mass=True, argmax=argmax, norms=norms)
    return own.union(NEEDS)


def head_table(stats: HeadStats) -> dict[str, np.ndarray]:
    """Every column of heads.csv as a (layers, H) array, in column order."""
    if stats.layouts is not None:
        return layout_table(stats)
    return _encoder_table(stats)


def _encoder_table(stats: HeadStats) -> dict[str, np.ndarray]:
    offsets = list(stats.spec.offsets)
    cls_of = {name: i for i, name in enumerate(stats.class_names)}
    offset_mass = stats.mean("offset_mass_sum")  # (layers, H, O)
    class_mass = stats.mean("class_mass_sum")  # (layers, H, C)
    Ly, H = stats.n_layers, stats.n_heads
    table = {
        "layer": np.repeat(np.arange(1, Ly + 1)[:, None], H, axis=1),
        "head": np.repeat(np.arange(1, H + 1)[None, :], Ly, axis=0),
    }
    for col, o in (("prev", -1), ("self", 0), ("next", 1)):
        table[col] = offset_mass[..., offsets.index(o)]
    for col in ("cls", "sep", "punct", "other"):
        table[col] = class_mass[..., cls_of[col]]
    table["sep_sep"] = stats.mean("class_mass_sum", group="sep")[..., cls_of["sep"]]
    table["rest_sep"] = stats.mean("class_mass_sum", group="non_sep")[..., cls_of["sep"]]
    table["entropy"] = stats.mean("entropy_sum")
    table["cls_entropy"] = stats.mean("entropy_sum", group="cls")
    table["n_tokens"] = np.full((Ly, H), int(stats.n_tokens[0]), dtype=np.int64)
    for t, o in enumerate(offsets):
        if o not in (-1, 0, 1):
            table[f"offset_{o:+d}"] = offset_mass[..., t]
    if stats.spec.norms:  # the norm-based twins (docs/norms.md): each kind's share of sum_j p_ij ||f(x_j)||
        offset_norm = stats.norm_mean("offset_mass_sum")  # (layers, H, O)
        class_norm = stats.norm_mean("class_mass_sum")  # (layers, H, C)
        for col in ("cls", "sep", "punct", "other"):
            table[f"{col}_norm"] = class_norm[..., cls_of[col]]
        for col, o in (("prev", -1), ("self", 0), ("next", 1)):
            table[f"{col}_norm"] = offset_norm[..., offsets.index(o)]
        table["weighted_norm"] = stats.norm_mean("weighted_norm_sum")
    if stats.spec.argmax:
        argmax_offset = stats.mean("argmax_offset_count")  # (layers, H, O+1)
        argmax_class = stats.mean("argmax_class_count")  # (layers, H, C)
        for col, o in (("argmax_prev", -1), ("argmax_self", 0), ("argmax_next", 1)):
            table[col] = argmax_offset[..., offsets.index(o)]
        for col in ("cls", "sep", "punct"):
            table[f"argmax_{col}"] = argmax_class[..., cls_of[col]]
    return table


def table_rows(table: dict[str, np.ndarray]) -> list[dict]:
    """One dict per head, layer-major: the rows of heads.csv."""
    Ly, H = table["layer"].shape
    return [{c: col[l, h].item() for c, col in table.items()} for l in range(Ly) for h in range(H)]


def present_classes(stats: HeadStats) -> set[str]:
    """Key classes the corpus has tokens of: a class that is a row group counts its rows (every
    query is a key too); the others are taken as present."""
    return {c for c in stats.class_names
            if c not in stats.group_names or stats.n_tokens[stats.group_names.index(c)] > 0}


def layout_table(stats: HeadStats) -> dict[str, np.ndarray]:
    """heads.csv of a model whose attention is not plain (a decoder; see the module's docstring):
    the encoder's columns, less those that are 0 by construction, with [CLS] read as the first
    token under a causal mask, and each layer's uniform baseline beside the entropy."""
    full = _encoder_table(stats)
    causal, present = stats.causal, present_classes(stats)
    Ly, H = stats.n_layers, stats.n_heads
    out = {}
    for col, values in full.items():
        kind = col.removesuffix("_norm") if col != "weighted_norm" else col  # a norm-based twin as its base
        if causal and (kind in ("next", "argmax_next") or col.startswith("offset_+")):
            continue  # a row sees no later key
        if kind in ("sep", "punct", "argmax_sep", "argmax_punct") and kind.removeprefix("argmax_") not in present:
            continue
        if col in ("sep_sep", "rest_sep") and "sep" not in present:
            continue
        if col == "cls_entropy" and (causal or "cls" not in present):
            continue
        if kind == "cls" and not causal and "cls" not in present:
            continue
        name = {"cls": "first", "argmax_cls": "argmax_first", "cls_norm": "first_norm"}.get(col, col) if causal \
            else col
        out[name] = values
        if col == "entropy":
            uniform = np.repeat(stats.layer_uniform_entropy()[:, None], H, axis=1)  # (layers, H)
            out["uniform_entropy"] = uniform
            out["kl_uniform"] = uniform - values
    assert all(v.shape == (Ly, H) for v in out.values())
    return out
