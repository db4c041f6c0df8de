"""Attention sinks: how much attention the first token(s) draw, per head, layer and query position.

Definitions (the papers' own; docs/sinks.md puts the measured numbers beside them):

    alpha_1(l, h)   Gu et al. (2024): the mean attention to the first token over the queries that
                    can see it. Their code (sail-sg/Attention-Sink, eval_sink_open_source.py)
                    computes it per sequence, A[i, 1] / (T - 1 + 1) summed over the queries i >= 1,
                    the first token's own row (which is 1 under a causal mask) included.
    Sink^eps_1      Gu et al.: the share of heads with alpha_1 > eps (eps = 0.3). Their code
                    thresholds each *sequence's* alpha_1 and averages the indicator over
                    sequences, layers and heads (`mean(dim=(0, 1, 2))`): `sink_share` here is a
                    head's share of segments over the threshold, and Sink^eps its mean over heads.
                    They measure T = 64 tokens; under a causal mask the first T queries of a longer
                    segment see exactly what a T-token input sees, so the same pass gives Sink^eps
                    at T = 64 (`sink_share_64`, over segments of at least 64 tokens) beside the one
                    over every query of the segment.
    first_mass      Xiao et al. (2023), StreamingLLM: the attention mass on the first token, as a
                    function of the query position (here a mean over all rows, and per log2
                    position bucket: the layer x position heatmap); `initial_mass` is the mass on
                    the first k tokens (their "4 initial tokens", --initial).
    massive         Sun et al. (2024): the largest |h| of the residual stream at the first token
                    against the median |h| over every token and dimension of the segment (a
                    forward hook on each layer's output; no kernel statistic).

Encoders use the same statistics: [CLS] is their first token, and the [SEP] mass is reported
beside it (Clark et al. 2019's observation that heads park on [SEP]).

Everything streams: the kernels give each row's mass per key class (`class_mass`), and the first
token and the next k - 1 are classes of their own (`SINK_CLASSES`); rows are then summed per
segment, per log2 position bucket and per variant (with and without a BOS). Nothing is kept per
token: the accumulator holds O(layers x heads x buckets) float64 sums, whatever the corpus and
the length. Sliding-window layers (Gemma-3: 5 of 6 layers see 512 keys): a query further than the
window from the first token cannot see it; alpha_1 is over the queries that can, and the others
are summed apart (`unseeing_*`: the mass on the oldest key of their window, on themselves, on the
previous token, their entropy), which is what such a layer does instead.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertscope.analyses.sinks.outputs import EPSILON, INITIAL, NAME  # noqa: F401 (S.NAME etc., as before)
from bertscope.engine.batch import BatchContext
from bertscope.files import write_npz
from bertscope.kernels.spec import StatsSpec
from bertscope.text.segments import Segment
from bertscope.text.token_classes import TokenClasses

GU_LENGTH = 64  # Gu et al.'s T

# Key classes: the first token (class 0, every scheme's [CLS]: the engine makes it a decoder's
# first real token, `first_token_class`), [SEP], the next INITIAL - 1 tokens, "." and ",", the rest.
SINK_CLASSES = TokenClasses(("cls", "sep", "initial", "punct", "other"), (), "sinks")
FIRST, SEP, INIT, PUNCT, OTHER = range(5)
# the vocabulary scheme's ids (token_classes.KEY_CLASSES: cls, sep, punct, other) -> SINK_CLASSES
_FROM_VOCAB = torch.tensor([FIRST, SEP, PUNCT, OTHER])


@dataclass
class SinkSegment(Segment):
    """A segment and the variant it belongs to (0, or 1 for the second of `--bos both`)."""

    variant: int = 0


def segment_classes(input_ids: Sequence[int], class_table: torch.Tensor, initial: int) -> list[int]:
    """The `SINK_CLASSES` id of every token: position 0 is the first token, positions 1..initial-1
    "initial" (a [SEP] among them stays [SEP]); [CLS] anywhere else is "other" (the engine does the
    same for a decoder), "." and "," punct."""
    ids = _FROM_VOCAB[class_table[torch.as_tensor(list(input_ids), dtype=torch.long)]]
    ids[1:][ids[1:] == FIRST] = OTHER
    ids[0] = FIRST
    head = ids[1:initial]
    head[head != SEP] = INIT
    return ids.tolist()


def n_buckets(context: int) -> int:
    """Log2 position buckets up to a context of `context` positions: [0], [1], [2, 3], [4, 7], ..."""
    return bucket_of(torch.tensor([max(1, context - 1)])).item() + 1


def bucket_of(pos: torch.Tensor) -> torch.Tensor:
    """The bucket of each position (int64): 0 for position 0, else floor(log2(pos)) + 1."""
    return torch.where(pos > 0, torch.log2(pos.double().clamp_min(1)).floor().long() + 1, 0)


def bucket_bounds(n: int) -> list[tuple[int, int]]:
    """(first, last) position of each of `n` buckets."""
    return [(0, 0)] + [(2 ** (b - 1), 2 ** b - 1) for b in range(1, n)]


def spec_for(windows: Sequence[int | None], norms: bool = False) -> StatsSpec:
    """What the kernels compute for the sink statistics: the mass per key class, the entropy, and
    the offsets 0, -1 and, for each sliding window, the oldest key a windowed row sees; with `norms`
    the class masses' norm-based twins too (docs/norms.md: the first token's and each class's share, all the
    sinks read; not the offsets' twins, nor those of any statistic another analysis adds to a union)."""
    offsets = {0, -1} | {-w for w in windows if w}
    return StatsSpec(offsets=tuple(sorted(offsets)), n_key_classes=SINK_CLASSES.n_classes, entropy=True,
                     class_mass=True, norms=("class_mass",) if norms else False)


# --- hidden states: Sun et al.'s massive activations ---------------------------------------------


HIDDEN_FIELDS = ("first_max", "rest_max", "median", "top_at_first", "first_dim")


class HiddenProbe:
    """Forward hooks on each layer's output: per segment, the largest |h| at the first token (and
    its dimension), the largest elsewhere, the median |h| over every valid token and dimension, and
    whether the segment's largest |h| is at the first token. One (B, 5) tensor per layer per forward
    pass, taken by the accumulator (`take`); no hidden state is kept."""

    def __init__(self):
        self.mask: torch.Tensor | None = None
        self.pending: dict[int, torch.Tensor] = {}

    @contextmanager
    def attached(self, model: torch.nn.Module, layers: Sequence[torch.nn.Module]):
        handles = [model.register_forward_pre_hook(self._inputs, with_kwargs=True)]
        handles += [m.register_forward_hook(self._hook(i)) for i, m in enumerate(layers)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _inputs(self, module, args, kwargs):
        self.mask = kwargs.get("attention_mask")
        self.pending = {}

    def _hook(self, layer: int):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            self.pending[layer] = hidden_summary(h, self.mask)
        return hook

    def take(self) -> dict[int, torch.Tensor]:
        out, self.pending = self.pending, {}
        return out


def hidden_summary(h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, 5) float64 per segment: max |h| at its first real token, max |h| at its other tokens
    (NaN for a one-token segment), median |h| over its tokens and dimensions, 1 if the largest |h|
    is at the first token, the dimension of the first token's largest |h|."""
    B, L, _ = h.shape
    valid = torch.ones(B, L, dtype=torch.bool, device=h.device) if mask is None else mask.bool()
    out = torch.full((B, 5), float("nan"), dtype=torch.float64)
    for b in range(B):
        a = h[b][valid[b]].detach().abs().float()  # (n, D)
        if a.shape[0] == 0:
            continue
        first_max, first_dim = a[0].max(0)
        rest = a[1:].max().item() if a.shape[0] > 1 else float("nan")
        out[b, 0], out[b, 1] = first_max.item(), rest
        out[b, 2] = a.flatten().median().item()
        out[b, 3] = float(not rest > first_max.item())
        out[b, 4] = first_dim.item()
    return out


# --- the accumulator -------------------------------------------------------------------------------


ARRAYS = {  # name -> (shape in symbols, dtype)
    "n_segments": (("V",), np.int64),
    "n_rows": (("V",), np.float64),
    "rows_bucket": (("V", "NB"), np.float64),
    "n_seeing": (("V", "Ly"), np.float64),
    "seeing_bucket": (("V", "Ly", "NB"), np.float64),
    "first_sum": (("V", "Ly", "H"), np.float64),
    "first_bucket": (("V", "Ly", "H", "NB"), np.float64),
    "initial_sum": (("V", "Ly", "H"), np.float64),
    "class_sum": (("V", "Ly", "H", "C"), np.float64),
    "sink_count": (("V", "Ly", "H"), np.int64),
    "n_gu": (("V",), np.int64),
    "sink_count_gu": (("V", "Ly", "H"), np.int64),
    "n_unseeing": (("V", "Ly"), np.float64),
    "unseeing_class": (("V", "Ly", "H", "C"), np.float64),
    "unseeing_edge": (("V", "Ly", "H"), np.float64),
    "unseeing_self": (("V", "Ly", "H"), np.float64),
    "unseeing_prev": (("V", "Ly", "H"), np.float64),
    "unseeing_entropy": (("V", "Ly", "H"), np.float64),
    "n_hidden": (("V",), np.int64),
    "hidden_sum": (("V", "Ly", "F"), np.float64),  # first_max, rest_max, median, top_at_first (sums)
    "n_hidden_rest": (("V", "Ly"), np.int64),  # segments with a rest_max (more than one token)
    "first_dim_count": (("V", "Ly", "D"), np.int64),
}
# the norm-based twins' sums (spec.norms, docs/norms.md), held only by an accumulator made with norms=True
NORM_ARRAYS = {
    "first_norm_sum": (("V", "Ly", "H"), np.float64),  # first-token norm share over the rows that see it
    "class_norm_sum": (("V", "Ly", "H", "C"), np.float64),  # each class's norm share over every row
}


class SinkStats:
    """Additive sums of the sink statistics over a corpus: an engine `Accumulator`.

    V variants (one, or two with `--bos both`: with and without a BOS), Ly layers, H heads, C key
    classes (`SINK_CLASSES`), NB log2 position buckets, D hidden dimensions. Every array is a sum
    or a count (`ARRAYS`), so batches, resumed runs and ranks merge by addition, and no number
    depends on the batch size or the padding side.
    """

    def __init__(self, n_layers: int, n_heads: int, windows: Sequence[int | None], variants: Sequence[str],
                 buckets: int, hidden_size: int, epsilon: float = EPSILON, gu_length: int = GU_LENGTH,
                 initial: int = INITIAL, norms: bool = False):
        self.n_layers, self.n_heads, self.norms = n_layers, n_heads, bool(norms)
        self.windows = [None if w is None else int(w) for w in windows]
        if len(self.windows) != n_layers:
            raise ValueError(f"{len(self.windows)} windows for {n_layers} layers")
        self.variants = list(variants)
        self.buckets, self.hidden_size = buckets, hidden_size
        self.epsilon, self.gu_length, self.initial = epsilon, gu_length, initial
        self.spec = spec_for(self.windows, self.norms)
        self.batches_done = 0
        self.probe: HiddenProbe | None = None  # where `add` takes the hidden-state summaries from
        sizes = {"V": len(self.variants), "Ly": n_layers, "H": n_heads, "C": SINK_CLASSES.n_classes, "NB": buckets,
                 "F": 4, "D": hidden_size}
        for name, (shape, dtype) in ARRAYS.items():
            setattr(self, name, np.zeros(tuple(sizes[s] for s in shape), dtype=dtype))
        for name, (shape, dtype) in NORM_ARRAYS.items():  # missing, never 0, without norms
            setattr(self, name, np.zeros(tuple(sizes[s] for s in shape), dtype=dtype) if self.norms else None)

    @property
    def arrays(self) -> tuple[str, ...]:
        """The sums this accumulator holds (`ARRAYS`, and `NORM_ARRAYS` with norms)."""
        return tuple(ARRAYS) + (tuple(NORM_ARRAYS) if self.norms else ())

    # -- the meta data that must agree for a merge or a resume

    def meta(self) -> dict:
        return dict(n_layers=self.n_layers, n_heads=self.n_heads, windows=self.windows, variants=self.variants,
                    buckets=self.buckets, hidden_size=self.hidden_size, epsilon=self.epsilon,
                    gu_length=self.gu_length, initial=self.initial, **({"norms": True} if self.norms else {}))

    # -- adding a batch

    def add(self, batch: BatchContext) -> None:
        valid = batch.key_valid  # (B, L)
        B, L = valid.shape
        device = valid.device
        variant = torch.tensor([getattr(s, "variant", 0) for s in batch.segments], device=device)
        V1 = torch.nn.functional.one_hot(variant, len(self.variants)).double()  # (B, V)
        pos = (valid.long().cumsum(-1) - 1).clamp_min(0)  # (B, L) position from the first real token
        p0 = valid.long().argmax(-1)  # (B,) the first real token's padded index
        W = torch.nn.functional.one_hot(bucket_of(pos).clamp_max(self.buckets - 1), self.buckets).double()
        W = W * valid[..., None]  # (B, L, NB)
        vd = valid.double()
        n_tokens = valid.sum(-1)  # (B,)
        long_enough = (n_tokens >= self.gu_length).double()  # (B,)
        self.n_segments += _np(V1.sum(0)).astype(np.int64)
        self.n_rows += _np(V1.T @ vd.sum(-1))
        self.rows_bucket += _np(torch.einsum("bln,bv->vn", W, V1))
        self.n_gu += _np(V1.T @ long_enough).astype(np.int64)
        i = torch.arange(L, device=device)
        early = (pos < self.gu_length).double()  # (B, L) the first T queries: Gu et al.'s input
        for layer, stats in enumerate(batch.layers):
            cm = stats.class_mass.double()  # (B, H, L, C)
            lo, hi = stats.layout.key_band(i, L)  # (L,) the keys each padded position sees
            sees = valid & (lo[None, :] <= p0[:, None]) & (p0[:, None] <= hi[None, :])  # (B, L)
            sd = sees.double()
            first = cm[..., FIRST]  # (B, H, L)
            seg_first = torch.einsum("bhl,bl->bh", first, sd)  # (B, H)
            seg_seeing = sd.sum(-1)  # (B,)
            alpha = seg_first / seg_seeing.clamp_min(1)[:, None]  # (B, H) each segment's alpha_1
            self.sink_count[:, layer] += _np(V1.T @ (alpha > self.epsilon).double()).astype(np.int64)
            early_seeing = sd * early
            alpha_gu = torch.einsum("bhl,bl->bh", first, early_seeing) / early_seeing.sum(-1).clamp_min(1)[:, None]
            over = (alpha_gu > self.epsilon).double() * long_enough[:, None]
            self.sink_count_gu[:, layer] += _np(V1.T @ over).astype(np.int64)
            self.n_seeing[:, layer] += _np(V1.T @ seg_seeing)
            self.seeing_bucket[:, layer] += _np(torch.einsum("bl,bln,bv->vn", sd, W, V1))
            self.first_sum[:, layer] += _np(V1.T @ seg_first)
            self.first_bucket[:, layer] += _np(torch.einsum("bhl,bln,bv->vhn", first, W, V1))
            if self.norms:  # the norm-based twins: the first token's share of sum_j p_ij n_j, each class's
                cn = stats.class_mass_norm.double()  # (B, H, L, C)
                self.first_norm_sum[:, layer] += _np(V1.T @ torch.einsum("bhl,bl->bh", cn[..., FIRST], sd))
                self.class_norm_sum[:, layer] += _np(torch.einsum("bhlc,bl,bv->vhc", cn, vd, V1))
            initial = first + cm[..., INIT]
            self.initial_sum[:, layer] += _np(torch.einsum("bhl,bl,bv->vh", initial, sd, V1))
            self.class_sum[:, layer] += _np(torch.einsum("bhlc,bl,bv->vhc", cm, vd, V1))
            uns = (valid & ~sees).double()  # rows of a windowed layer too far to see the first token
            if bool(uns.any()):
                self.n_unseeing[:, layer] += _np(V1.T @ uns.sum(-1))
                self.unseeing_class[:, layer] += _np(torch.einsum("bhlc,bl,bv->vhc", cm, uns, V1))
                om = stats.offset_mass.double()  # (B, H, L, O)
                offsets = list(self.spec.offsets)
                for name, o in (("unseeing_self", 0), ("unseeing_prev", -1)):
                    getattr(self, name)[:, layer] += _np(torch.einsum("bhl,bl,bv->vh", om[..., offsets.index(o)],
                                                                      uns, V1))
                left = stats.layout.window[0] if stats.layout.window is not None else None
                if left is not None and -left in offsets:
                    self.unseeing_edge[:, layer] += _np(torch.einsum("bhl,bl,bv->vh", om[..., offsets.index(-left)],
                                                                     uns, V1))
                self.unseeing_entropy[:, layer] += _np(torch.einsum("bhl,bl,bv->vh", stats.entropy.double(),
                                                                    uns, V1))
        if self.probe is not None:
            self._add_hidden(self.probe.take(), V1)

    def _add_hidden(self, summaries: dict[int, torch.Tensor], V1: torch.Tensor):
        if len(summaries) != self.n_layers:
            return  # no hook fired (a model whose layers bertscope cannot reach one by one)
        V1 = V1.cpu()
        self.n_hidden += _np(V1.sum(0)).astype(np.int64)
        for layer, s in summaries.items():  # s: (B, 5)
            has_rest = ~torch.isnan(s[:, 1])
            vals = torch.stack([s[:, 0], s[:, 1].nan_to_num(0.0), s[:, 2], s[:, 3]], -1)  # (B, 4)
            self.hidden_sum[:, layer] += _np(V1.T @ vals)
            self.n_hidden_rest[:, layer] += _np(V1.T @ has_rest.double()).astype(np.int64)
            dims = torch.nn.functional.one_hot(s[:, 4].long().clamp(0, self.hidden_size - 1), self.hidden_size)
            self.first_dim_count[:, layer] += _np(V1.T @ dims.double()).astype(np.int64)

    # -- merging, saving, loading

    def merge(self, other: SinkStats) -> SinkStats:
        if other.meta() != self.meta():
            raise ValueError("cannot merge sink statistics of different models or settings")
        for name in self.arrays:
            getattr(self, name).__iadd__(getattr(other, name))
        return self

    def save(self, path: Path) -> None:
        write_npz(path, meta=json.dumps(self.meta()), batches_done=self.batches_done,
                  **{name: getattr(self, name) for name in self.arrays})

    @classmethod
    def load(cls, path: Path) -> SinkStats:
        with np.load(path) as f:
            acc = cls(**json.loads(str(f["meta"])))
            for name in acc.arrays:
                if name not in f or f[name].shape != getattr(acc, name).shape:
                    raise ValueError(f"{path} holds no {name} of the expected shape: made by another version?")
                getattr(acc, name)[...] = f[name]
            acc.batches_done = int(f["batches_done"])
        return acc

    # -- reading

    def sink_share(self, v: int = 0, gu: bool = False) -> np.ndarray:
        """(Ly, H) share of segments whose alpha_1 exceeds epsilon (gu: over their first T queries)."""
        count, n = (self.sink_count_gu, self.n_gu) if gu else (self.sink_count, self.n_segments)
        return count[v] / n[v] if n[v] else np.full(count[v].shape, np.nan)

    def sink_metric(self, v: int = 0, gu: bool = False) -> float:
        """Gu et al.'s Sink^eps_1, in [0, 1]: the indicator averaged over segments, layers and heads."""
        return float(np.nanmean(self.sink_share(v, gu))) if (self.n_gu if gu else self.n_segments)[v] else math.nan

    def alpha(self, v: int = 0) -> np.ndarray:
        """(Ly, H) alpha_1 pooled over the corpus: first-token mass over every row that sees it."""
        return _div(self.first_sum[v], self.n_seeing[v][:, None])

    def alpha_norm(self, v: int = 0) -> np.ndarray:
        """(Ly, H) alpha_1's norm-based twin: the first token's share of sum_j p_ij ||f(x_j)|| over the rows
        that see it (docs/norms.md); NaN (missing, never 0) without norms."""
        if not self.norms:
            return np.full((self.n_layers, self.n_heads), np.nan)
        return _div(self.first_norm_sum[v], self.n_seeing[v][:, None])

    def class_norm(self, v: int = 0) -> np.ndarray:
        """(Ly, H, C) each key class's norm share over every row (first_mass_norm: class FIRST); NaN
        without norms."""
        if not self.norms:
            return np.full((self.n_layers, self.n_heads, SINK_CLASSES.n_classes), np.nan)
        return _div(self.class_norm_sum[v], np.full(self.class_norm_sum[v].shape, self.n_rows[v]))

    def pooled_metric(self, v: int = 0) -> float:
        """Share of heads whose pooled alpha_1 exceeds epsilon (a threshold on corpus means)."""
        return float(np.mean(self.alpha(v) > self.epsilon))

    def position_mass(self, v: int = 0) -> np.ndarray:
        """(Ly, NB) first-token mass per row, mean over heads and over the rows of each bucket
        (rows that cannot see the first token count, with mass 0); NaN for an empty bucket."""
        return _div(self.first_bucket[v].mean(1), self.rows_bucket[v][None, :])

    def layer_first_mass(self, v: int = 0) -> np.ndarray:
        """(Ly,) mean first-token mass over heads and every row."""
        return _div(self.first_sum[v].mean(1), np.full(self.n_layers, self.n_rows[v]))

    def hidden_means(self, v: int = 0) -> dict[str, np.ndarray]:
        """(Ly,) per-segment means of Sun et al.'s magnitudes; the first token's most frequent dimension."""
        n = self.n_hidden[v]
        if not n:
            return {}
        s = self.hidden_sum[v] / n
        rest = _div(self.hidden_sum[v][:, 1], self.n_hidden_rest[v].astype(np.float64))
        return {"first_max": s[:, 0], "rest_max": rest, "median": s[:, 2], "top_at_first": s[:, 3],
                "first_dim": self.first_dim_count[v].argmax(-1)}

    def layer_kinds(self) -> list[str]:
        return ["global" if w is None else f"window {w + 1}" for w in self.windows]


def _unseeing(sums: np.ndarray, rows: np.ndarray, layers: list[int]) -> float:
    """The mean over heads and over the unseeing queries of `layers` of a (Ly, H) sum (NaN: none)."""
    with np.errstate(invalid="ignore"):
        return float(np.nanmean(_div(sums[layers].mean(1), rows[layers])))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), np.nan)


# --- the tables ----------------------------------------------------------------------------------


HEAD_COLUMNS = ("bos", "layer", "head", "attention", "alpha_1", "sink_share", "sink_share_64", "first_mass",
                "initial_mass", "sep_mass", "punct_mass", "n_queries", "n_seeing", "n_unseeing", "unseeing_edge",
                "unseeing_self", "unseeing_prev", "unseeing_punct", "unseeing_entropy", "n_segments")
# with norms (docs/norms.md): the norm-based twins beside them, at the end of sinks.csv
NORM_HEAD_COLUMNS = ("alpha_1_norm", "first_mass_norm", "sep_mass_norm", "punct_mass_norm")


def head_columns(stats: SinkStats) -> tuple[str, ...]:
    """sinks.csv's columns: `HEAD_COLUMNS`, then with norms `NORM_HEAD_COLUMNS`."""
    return HEAD_COLUMNS + (NORM_HEAD_COLUMNS if stats.norms else ())
LAYER_COLUMNS = ("bos", "layer", "attention", "alpha_1", "first_mass", "sink_heads", "sink_share", "sink_share_64",
                 "unseeing_share", "unseeing_edge", "first_max", "rest_max", "median", "first_max_over_median",
                 "top_at_first", "first_dim")
POSITION_COLUMNS = ("bos", "layer", "attention", "bucket", "first_position", "last_position", "n_queries",
                    "n_seeing", "first_mass")


def head_rows(stats: SinkStats) -> list[dict]:
    rows = []
    kinds = stats.layer_kinds()
    for v, name in enumerate(stats.variants):
        alpha, share, share_gu = stats.alpha(v), stats.sink_share(v), stats.sink_share(v, gu=True)
        n = stats.n_rows[v]
        per_row = _div(stats.class_sum[v], np.full(stats.class_sum[v].shape, n))
        initial = _div(stats.initial_sum[v], stats.n_seeing[v][:, None])
        uns = stats.n_unseeing[v][:, None]
        u_class = _div(stats.unseeing_class[v], uns[..., None])
        u = {k: _div(getattr(stats, f"unseeing_{k}")[v], uns) for k in ("edge", "self", "prev", "entropy")}
        alpha_norm, class_norm = stats.alpha_norm(v), stats.class_norm(v)
        for layer in range(stats.n_layers):
            for head in range(stats.n_heads):
                rows.append({"bos": name, "layer": layer + 1, "head": head + 1, "attention": kinds[layer],
                             "alpha_1": alpha[layer, head], "sink_share": share[layer, head],
                             "sink_share_64": share_gu[layer, head], "first_mass": per_row[layer, head, FIRST],
                             "initial_mass": initial[layer, head], "sep_mass": per_row[layer, head, SEP],
                             "punct_mass": per_row[layer, head, PUNCT], "n_queries": int(n),
                             "n_seeing": int(stats.n_seeing[v, layer]), "n_unseeing": int(stats.n_unseeing[v, layer]),
                             "unseeing_edge": u["edge"][layer, head] if stats.windows[layer] else np.nan,
                             "unseeing_self": u["self"][layer, head], "unseeing_prev": u["prev"][layer, head],
                             "unseeing_punct": u_class[layer, head, PUNCT],
                             "unseeing_entropy": u["entropy"][layer, head],
                             "n_segments": int(stats.n_segments[v])})
                if stats.norms:
                    rows[-1].update(alpha_1_norm=alpha_norm[layer, head],
                                    first_mass_norm=class_norm[layer, head, FIRST],
                                    sep_mass_norm=class_norm[layer, head, SEP],
                                    punct_mass_norm=class_norm[layer, head, PUNCT])
    return rows


def layer_rows(stats: SinkStats) -> list[dict]:
    rows = []
    kinds = stats.layer_kinds()
    for v, name in enumerate(stats.variants):
        alpha, first = stats.alpha(v), stats.layer_first_mass(v)
        share, share_gu = stats.sink_share(v), stats.sink_share(v, gu=True)
        hidden = stats.hidden_means(v)
        uns = stats.n_unseeing[v]
        edge = _div(stats.unseeing_edge[v].mean(1), uns)
        for layer in range(stats.n_layers):
            row = {"bos": name, "layer": layer + 1, "attention": kinds[layer], "alpha_1": np.mean(alpha[layer]),
                   "first_mass": first[layer], "sink_heads": int((alpha[layer] > stats.epsilon).sum()),
                   "sink_share": np.mean(share[layer]), "sink_share_64": np.mean(share_gu[layer]),
                   "unseeing_share": uns[layer] / stats.n_rows[v] if stats.n_rows[v] else np.nan,
                   "unseeing_edge": edge[layer] if stats.windows[layer] else np.nan}
            if hidden:
                fm, med = hidden["first_max"][layer], hidden["median"][layer]
                row.update(first_max=fm, rest_max=hidden["rest_max"][layer], median=med,
                           first_max_over_median=fm / med if med > 0 else np.nan,
                           top_at_first=hidden["top_at_first"][layer], first_dim=int(hidden["first_dim"][layer]))
            rows.append(row)
    return rows


def position_rows(stats: SinkStats) -> list[dict]:
    rows = []
    kinds = stats.layer_kinds()
    bounds = bucket_bounds(stats.buckets)
    for v, name in enumerate(stats.variants):
        mass = stats.position_mass(v)
        for layer in range(stats.n_layers):
            for b, (lo, hi) in enumerate(bounds):
                if not stats.rows_bucket[v, b]:
                    continue
                rows.append({"bos": name, "layer": layer + 1, "attention": kinds[layer], "bucket": b,
                             "first_position": lo, "last_position": hi, "n_queries": int(stats.rows_bucket[v, b]),
                             "n_seeing": int(stats.seeing_bucket[v, layer, b]), "first_mass": mass[layer, b]})
    return rows


def headline(stats: SinkStats) -> dict:
    """run.json's results: Sink^eps per variant, the first-token mass per layer, windowed vs global."""
    out = {"epsilon": stats.epsilon, "gu_length": stats.gu_length, "initial": stats.initial, "variants": {}}
    for v, name in enumerate(stats.variants):
        windowed = [i for i, w in enumerate(stats.windows) if w]
        first = stats.layer_first_mass(v)
        alpha = stats.alpha(v).mean(1)
        entry = {"segments": int(stats.n_segments[v]), "queries": int(stats.n_rows[v]),
                 "sink_metric": stats.sink_metric(v), "sink_metric_64": stats.sink_metric(v, gu=True),
                 "segments_64": int(stats.n_gu[v]), "pooled_metric": stats.pooled_metric(v),
                 "first_mass_by_layer": [round(float(x), 4) for x in first],
                 "alpha_1_by_layer": [round(float(x), 4) for x in alpha]}
        if windowed:
            glob = [i for i in range(stats.n_layers) if i not in windowed]
            entry["windowed"] = {"layers": [i + 1 for i in windowed], "alpha_1": float(np.mean(alpha[windowed])),
                                 "first_mass": float(np.mean(first[windowed])),
                                 "unseeing_share": float(stats.n_unseeing[v, windowed].sum()
                                                         / max(1.0, stats.n_rows[v] * len(windowed))),
                                 "unseeing_edge": _unseeing(stats.unseeing_edge[v], stats.n_unseeing[v], windowed),
                                 "unseeing_punct": _unseeing(stats.unseeing_class[v][..., PUNCT], stats.n_unseeing[v],
                                                             windowed),
                                 "unseeing_entropy": _unseeing(stats.unseeing_entropy[v], stats.n_unseeing[v],
                                                               windowed)}
            if glob:
                entry["global"] = {"layers": [i + 1 for i in glob], "alpha_1": float(np.mean(alpha[glob])),
                                   "first_mass": float(np.mean(first[glob]))}
        hidden = stats.hidden_means(v)
        if hidden:
            ratio = hidden["first_max"] / np.where(hidden["median"] > 0, hidden["median"], np.nan)
            top = int(np.nanargmax(ratio)) if np.isfinite(ratio).any() else 0
            entry["massive"] = {"layer": top + 1, "first_max": float(hidden["first_max"][top]),
                                "rest_max": float(hidden["rest_max"][top]), "median": float(hidden["median"][top]),
                                "ratio": float(ratio[top]), "first_dim": int(hidden["first_dim"][top])}
        out["variants"][name] = entry
    return out
