"""Head clustering (Clark et al. 2019, section 6).

Clark et al. compare every pair of heads, across all layers, by

    D(H_a, H_b) = sum over tokens of JS(H_a(token), H_b(token)),

the Jensen-Shannon divergence between the two heads' attention distributions from the
same query token, summed over a corpus sample, and embed the heads in 2-D by
multidimensional scaling (MDS) of that distance matrix. Heads that attend alike land close
together whatever their layer, which shows at a glance which behaviours recur (broad,
previous / next token, [CLS], [SEP], punctuation) and whether heads of one layer resemble
each other.

The one pass over the corpus (`js_sums`) fills two accumulators from the same forward passes:
`JSSums`, the (N, N) JS sums with the number of query tokens they run over (N = layers x
heads, layer-major), and the surface sums (`HeadStats`) for the behaviour labels. Everything
after it takes arrays: those sums and the per-head surface table of
`bertscope.analyses.surface.stats`.

JS is in nats, so the mean per token lies in [0, ln 2]: 0 for heads that attend
identically, ln 2 = 0.693 for heads whose attention never overlaps. The sum D grows with
the corpus; the mean per token (D / number of query tokens) does not, which makes runs of
different sizes comparable. MDS gets the mean: the layout is the same up to scale.
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertscope.analyses.surface import stats as surface
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.loop import EngineOptions, fold
from bertscope.files import write_npz
from bertscope.kernels.js import pairwise_js, stack_layers
from bertscope.kernels.spec import StatsSpec

NAME = "cluster"

BEHAVIOURS = ("broad", "previous", "next", "[CLS]", "first token", "[SEP]", "punctuation", "other")
JS_COLUMNS = ("head_a", "head_b", "same_layer", "js_sum", "js_mean_per_token")
# the surface columns a behaviour label is read from, repeated in cluster_mds.csv so that
# every label can be checked against its numbers
LABEL_COLUMNS = ("prev", "next", "cls", "sep", "punct", "entropy")
MDS_COLUMNS = ("layer", "head", "x", "y", "behaviour") + LABEL_COLUMNS
# a decoder's surface table (`surface.layout_table`) has "first" (the first token, every row
# sees it: the [CLS] test reads it) in place of "cls", and no "next" (0 under a causal mask) or
# "sep" where its tokenizer has none
DECODER_LABEL_COLUMNS = ("prev", "first", "sep", "punct", "entropy")


def label_columns(table: dict) -> tuple[str, ...]:
    """The surface columns the labels of this table are read from: LABEL_COLUMNS for an
    encoder; a decoder's those of DECODER_LABEL_COLUMNS it has."""
    if "first" not in table:
        return LABEL_COLUMNS
    return tuple(c for c in DECODER_LABEL_COLUMNS if c in table)


def behaviour_names(table: dict) -> tuple[str, ...]:
    """The labels `behaviours` can give this table's heads, in BEHAVIOURS order: an encoder's
    every label but "first token"; a decoder's "first token" for "[CLS]", and "next" and "[SEP]"
    only where it has their columns."""
    if "first" not in table:
        return tuple(b for b in BEHAVIOURS if b != "first token")
    absent = {"[CLS]"} | {b for b, col in (("next", "next"), ("[SEP]", "sep")) if col not in table}
    return tuple(b for b in BEHAVIOURS if b not in absent)


def mds_columns(table: dict) -> tuple[str, ...]:
    """cluster_mds.csv's columns for a run whose surface table is `table`."""
    return MDS_COLUMNS[:5] + label_columns(table)


# ----------------------------------------------------------------------------- labels

def head_labels(n_layers: int, n_heads: int) -> list[str]:
    """`layer-head`, both from 1, layer-major: the order of the rows of the JS matrix."""
    return [f"{l}-{h}" for l in range(1, n_layers + 1) for h in range(1, n_heads + 1)]


def head_layers(n_layers: int, n_heads: int) -> np.ndarray:
    """(N,) the layer (from 1) of every head, layer-major."""
    return np.repeat(np.arange(1, n_layers + 1), n_heads)


LABEL_RULES = ("clark", "bertscope")


@dataclass(frozen=True)
class ClarkThresholds:
    """Clark et al.'s behaviour labels (the markers of the paper's Fig. 6), as the released
    notebook General_Analysis.ipynb sets them; the paper text prints no cut-offs.

      position  mean mass on the next (previous) token above 0.5: "next" ("previous");
      special   mean mass on [CLS], on [SEP], on "." and "," above 0.6: "[CLS]", "[SEP]",
                "punctuation";
      broad     mean entropy above 3.8 nats: "broad". That number was set on segments of
                about 128 tokens, where uniform attention has ln 128 = 4.85 nats; bertscope
                scales it by (uniform entropy of the run) / ln(reference_length), so it is
                3.8 nats exactly when every segment has 128 tokens and lower for shorter ones.
    The tests run in the notebook's order (next, previous, broad, [CLS], [SEP], punctuation)
    and the last test a head passes wins: a broad head with 0.7 of its mass on [CLS] is
    "[CLS]". A head that passes none is "other".
    """

    position: float = 0.5
    special: float = 0.6
    broad_nats: float = 3.8
    reference_length: int = 128

    def broad_cut(self, uniform_entropy: float) -> float:
        """The entropy above which a head is broad, for a run whose uniform entropy is given."""
        return self.broad_nats * uniform_entropy / float(np.log(self.reference_length))


@dataclass(frozen=True)
class Thresholds:
    """bertscope's own behaviour labels (`--labels bertscope`), set before Clark et al.'s
    notebook cut-offs (`ClarkThresholds`, the default) were known. They are:
      position  mean mass on the previous (next) token above this: "previous" ("next");
      special   mean mass on [CLS] ([SEP]) above this: "[CLS]" ("[SEP]");
                above 0.5 means one token gets more than all the others together;
      punct     mean mass on "." and "," above this: "punctuation". Lower than the others
                because punctuation is several keys per segment, none of them fixed, and
                even bert-base's punctuation heads give it well under half (Clark Fig. 2);
      broad     mean entropy above this fraction of the entropy of uniform attention over
                the same tokens: "broad". Relative to uniform rather than a fixed number of
                nats because the uniform entropy, ln(segment length), depends on --max-len.
    A head that passes several tests takes the first of: previous, next, [CLS], [SEP],
    punctuation, broad (two masses above 0.5 on disjoint keys cannot both happen; punctuation
    can overlap the previous / next token). A head that passes none is "other".
    """

    position: float = 0.5
    special: float = 0.5
    punct: float = 0.25
    broad: float = 0.9


def behaviours(table: dict[str, np.ndarray], uniform_entropy: float,
               thresholds: Thresholds | ClarkThresholds = ClarkThresholds()) -> np.ndarray:
    """(layers, H) behaviour label of every head, from the surface table's columns
    `prev, next, cls, sep, punct, entropy` (each (layers, H)). A decoder's table
    (`label_columns`) labels "first token" with the [CLS] test on its `first` column, and skips
    the tests of the columns it lacks (next under a causal mask, [SEP] without one).

    `ClarkThresholds` (the default): the last test passed wins; `Thresholds`: the first."""
    t = thresholds
    shape = np.shape(table["prev"])
    special = ("first token", "first") if "first" in table else ("[CLS]", "cls")
    if isinstance(t, ClarkThresholds):
        tests = [
            ("next", "next", t.position),
            ("previous", "prev", t.position),
            ("broad", "entropy", t.broad_cut(uniform_entropy)),
            (*special, t.special),
            ("[SEP]", "sep", t.special),
            ("punctuation", "punct", t.special),
        ]
        labels = np.full(shape, "other", dtype=object)
        for name, col, cut in tests:
            if col in table:
                labels[table[col] > cut] = name  # a later test overrides an earlier one
        return labels
    tests = [
        ("previous", "prev", t.position),
        ("next", "next", t.position),
        (*special, t.special),
        ("[SEP]", "sep", t.special),
        ("punctuation", "punct", t.punct),
        ("broad", "entropy", t.broad * uniform_entropy),
    ]
    labels = np.full(shape, "other", dtype=object)
    decided = np.zeros(labels.shape, dtype=bool)
    for name, col, cut in tests:
        if col in table:
            hit = table[col] > cut
            labels[hit & ~decided] = name
            decided |= hit
    return labels


# ----------------------------------------------------------------------------- distances

def thresholds_for(rules: str) -> Thresholds | ClarkThresholds:
    if rules not in LABEL_RULES:
        raise ValueError(f"label rules must be one of {', '.join(LABEL_RULES)}, not {rules!r}")
    return ClarkThresholds() if rules == "clark" else Thresholds()


def mean_per_token(js_sum: np.ndarray, n_tokens: int) -> np.ndarray:
    """(N, N) mean JS per query token, nats: the corpus-size-free version of D."""
    if n_tokens <= 0:
        raise ValueError("no tokens: the JS sums cover nothing")
    return np.asarray(js_sum, dtype=np.float64) / n_tokens


def js_rows(js_sum: np.ndarray, n_tokens: int, n_layers: int, n_heads: int) -> list[dict]:
    """Long form of the (symmetric) matrix: one row per unordered pair a < b (cluster_js.csv)."""
    labels, layers = head_labels(n_layers, n_heads), head_layers(n_layers, n_heads)
    mean = mean_per_token(js_sum, n_tokens)
    a, b = np.triu_indices(len(labels), k=1)
    return [{"head_a": labels[i], "head_b": labels[j], "same_layer": int(layers[i] == layers[j]),
             "js_sum": float(js_sum[i, j]), "js_mean_per_token": float(mean[i, j])} for i, j in zip(a, b)]


def layer_mean_js(js_mean: np.ndarray, n_layers: int, n_heads: int) -> np.ndarray:
    """(layers, layers) mean JS between a head of layer a and a head of layer b
    (a head is never paired with itself, so the diagonal is the within-layer mean)."""
    blocks = js_mean.reshape(n_layers, n_heads, n_layers, n_heads)
    out = blocks.mean(axis=(1, 3))
    if n_heads > 1:
        for l in range(n_layers):
            block = blocks[l, :, l, :]
            out[l, l] = (block.sum() - np.trace(block)) / (n_heads * (n_heads - 1))
    else:
        np.fill_diagonal(out, np.nan)
    return out


def layer_closeness(js_mean: np.ndarray, n_layers: int, n_heads: int) -> dict:
    """Are heads of the same layer closer to each other than to heads of other layers?

    within / between:  mean JS over pairs of heads in the same / in different layers;
    adjacent:          mean JS over pairs in neighbouring layers (l, l+1), the fairer
                       comparison since behaviour drifts with depth;
    nearest_same_layer: heads whose nearest head (smallest JS) is in their own layer,
                       against chance = (heads - 1) / (N - 1) for a random neighbour.
    """
    N = n_layers * n_heads
    layers = head_layers(n_layers, n_heads)
    same = layers[:, None] == layers[None, :]
    off = ~np.eye(N, dtype=bool)
    adjacent = np.abs(layers[:, None] - layers[None, :]) == 1

    def mean_over(mask):
        return float(js_mean[mask].mean()) if mask.any() else float("nan")

    masked = np.where(off, js_mean, np.inf)
    nearest = masked.argmin(axis=1)
    return {
        "within": mean_over(same & off),
        "between": mean_over(~same),
        "adjacent": mean_over(adjacent),
        "nearest_same_layer": int((layers[nearest] == layers).sum()) if N > 1 else 0,
        "n_heads_total": N,
        "nearest_chance": (n_heads - 1) / (N - 1) if N > 1 else float("nan"),
    }


def closest_pairs(js_mean: np.ndarray, n_layers: int, n_heads: int, k: int = 5,
                  across_layers: bool = True) -> list[tuple[str, str, float]]:
    """The k pairs with the smallest JS, restricted to pairs in different layers
    (`across_layers`) or in the same layer."""
    labels, layers = head_labels(n_layers, n_heads), head_layers(n_layers, n_heads)
    a, b = np.triu_indices(len(labels), k=1)
    keep = (layers[a] != layers[b]) if across_layers else (layers[a] == layers[b])
    a, b = a[keep], b[keep]
    order = np.argsort(js_mean[a, b], kind="stable")[:k]
    return [(labels[a[i]], labels[b[i]], float(js_mean[a[i], b[i]])) for i in order]


# ----------------------------------------------------------------------------- embedding

def embed(distance: np.ndarray, seed: int = 0) -> np.ndarray:
    """(N, 2) metric MDS (SMACOF, scikit-learn) of a precomputed, symmetric distance matrix.

    Started from classical MDS where scikit-learn offers it (>= 1.8), which is deterministic
    and needs no restarts; older versions get 4 seeded random starts. The layout is defined
    up to rotation and reflection only: read distances, not axes.
    """
    from sklearn.manifold import MDS  # here: `bertscope probes cluster --help` must not wait for scikit-learn (~1 s)

    d = np.asarray(distance, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"a square distance matrix is needed, got shape {d.shape}")
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    if len(d) < 3:  # nothing to lay out beyond a line
        xy = np.zeros((len(d), 2))
        if len(d) == 2:
            xy[1, 0] = d[0, 1]
        return xy
    params = inspect.signature(MDS).parameters
    if "metric_mds" in params:  # scikit-learn >= 1.8
        mds = MDS(n_components=2, metric="precomputed", metric_mds=True, init="classical_mds",
                  random_state=seed, normalized_stress="auto")
    else:
        mds = MDS(n_components=2, dissimilarity="precomputed", metric=True, n_init=4, random_state=seed)
    return mds.fit_transform(d)


def mds_rows(xy: np.ndarray, labels: np.ndarray, table: dict[str, np.ndarray], n_layers: int,
             n_heads: int) -> list[dict]:
    """cluster_mds.csv: layer, head (from 1), x, y, behaviour, and the surface columns
    (each (layers, H) in `table`) the behaviour was read from."""
    flat = np.asarray(labels).reshape(-1)
    columns = {c: np.asarray(table[c], dtype=float).reshape(-1) for c in label_columns(table)}
    return [{"layer": i // n_heads + 1, "head": i % n_heads + 1, "x": float(xy[i, 0]), "y": float(xy[i, 1]),
             "behaviour": str(flat[i]), **{c: float(v[i]) for c, v in columns.items()}}
            for i in range(n_layers * n_heads)]


# ----------------------------------------------------------------------------- report

def summary(js_mean: np.ndarray, labels: np.ndarray, n_layers: int, n_heads: int, k: int = 3) -> str:
    """A few lines for the terminal."""
    c = layer_closeness(js_mean, n_layers, n_heads)
    counts = {b: int((np.asarray(labels) == b).sum()) for b in BEHAVIOURS}
    fmt = lambda pairs: ", ".join(f"{a} & {b} ({v:.3f})" for a, b, v in pairs)  # noqa: E731
    return "\n".join([
        f"  mean JS per token (nats, max ln 2 = 0.693): within a layer {c['within']:.3f}, "
        f"between layers {c['between']:.3f}, adjacent layers {c['adjacent']:.3f}",
        f"  nearest head in the same layer: {c['nearest_same_layer']} of {c['n_heads_total']} heads "
        f"(a random neighbour: {c['nearest_chance']:.0%})",
        f"  closest pairs across layers   {fmt(closest_pairs(js_mean, n_layers, n_heads, k, True))}",
        f"  closest pairs within a layer  {fmt(closest_pairs(js_mean, n_layers, n_heads, k, False))}",
        "  behaviours                    " + ", ".join(f"{b} {n}" for b, n in counts.items() if n),
    ])


# ----------------------------------------------------------------------------- figures

MARKERS = {"broad": "o", "previous": "<", "next": ">", "[CLS]": "s", "first token": "P", "[SEP]": "D",
           "punctuation": "*", "other": "X"}
MARKER_SIZE = {"punctuation": 90}


class JSSums:
    """Accumulator (`bertscope.engine.batch.Accumulator`) of the (N, N) JS sums between all heads,
    N = layers x heads layer-major, over `n_tokens` query tokens."""

    def __init__(self, n_heads_total: int, js_backend: str = "chunked"):
        self.js_sum = np.zeros((n_heads_total, n_heads_total))
        self.n_tokens = 0
        self.js_backend = js_backend
        self.batches_done = 0

    def add(self, batch):
        # scale folded into q per layer, so layers with different scales share one call; each
        # layer's layout (causal, window, key/value heads) travels with it (None for encoders)
        q, k, layouts = stack_layers(batch.layers)  # (B, layers*H, L, D), (B, layers*H_kv, L, D)
        self.js_sum += pairwise_js(q, k, batch.key_valid, 1.0, backend=self.js_backend,
                                   layouts=layouts).cpu().numpy()  # (N, N)
        self.n_tokens += int(batch.n_tokens.sum())

    def merge(self, other: JSSums) -> JSSums:
        if other.js_sum.shape != self.js_sum.shape:
            raise ValueError("cannot merge JS sums of different models")
        self.js_sum += other.js_sum
        self.n_tokens += other.n_tokens
        return self

    def save(self, path):
        write_npz(path, js_sum=self.js_sum, n_tokens=self.n_tokens, batches_done=self.batches_done)

    @classmethod
    def load(cls, path) -> JSSums:
        with np.load(path) as f:
            acc = cls(f["js_sum"].shape[0])
            acc.js_sum[...] = f["js_sum"]
            acc.n_tokens, acc.batches_done = int(f["n_tokens"]), int(f["batches_done"])
        return acc


@dataclass
class ClusterSums:
    """What the pass accumulates: the JS sums and the surface statistics of the same tokens."""

    js: JSSums
    stats: HeadStats

    @property
    def js_sum(self) -> np.ndarray:
        return self.js.js_sum

    @property
    def n_tokens(self) -> int:
        return self.js.n_tokens


def spec_for(loaded) -> StatsSpec:
    own = StatsSpec(offsets=(), n_key_classes=len(loaded.class_names), entropy=False, argmax=False, keep_qk=True)
    return own.union(surface.NEEDS)


def js_sums(loaded, segments: Sequence, js_backend: str = "chunked", batch_size: int = 32,
            backend: str = "auto", progress: bool = True) -> ClusterSums:
    """One pass over `segments`: JS sums between all heads of all layers, and surface sums."""
    spec = spec_for(loaded)
    sums = ClusterSums(JSSums(loaded.n_layers * loaded.n_heads, js_backend),
                       HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes))
    fold(loaded, segments, spec, [sums.js, sums.stats],
         EngineOptions(batch_size=batch_size, backend=backend, progress=progress), desc="JS between heads")
    return sums
