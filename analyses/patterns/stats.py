"""Kovaleva et al. (2019, section 4.1): five attention pattern types, one per (example, head).

The paper sorted every self-attention map into Vertical (attention to [CLS]/[SEP]),
Diagonal (previous/next token), Vertical+Diagonal, Block (within the query's own sentence
of a two-sentence input) and Heterogeneous (everything else) with a CNN trained on about
400 hand-labelled maps that were never released. bertscope replaces the CNN by rules on
four per-example statistics that the kernels already stream, so no map is ever kept:

    special   mean over the segment's rows of the mass on [CLS] and [SEP] keys
    diagonal  mean over the rows of the mass on the keys at offsets -1 and +1
    own       over the rows of word tokens, the share of their mass on words that falls on
              words of the query's own part (A rows on A, B rows on B): 1 for a
              block-diagonal pair map, about (a^2 + b^2) / (a + b)^2 (~0.5) for a uniform map
    spread    the mean entropy of the word rows over the mean ln(own part length): 1 when
              rows are uniform over their own part, ln k / ln n when they spread over k of
              its n keys
    entropy   mean row entropy, nats (reported, and the base of `spread`)

Rules (`classify`, thresholds in `Thresholds`), in this order:

1. structured = special + diagonal >= 0.6: most of the map sits on the special-token
   columns and the two neighbouring diagonals, so the picture is stripes and lines.
   Its type is decided by the diagonal's share d = diagonal / structured:
   d < 0.25 Vertical, d > 0.75 Diagonal, otherwise Vertical+Diagonal (each of the two
   carries at least a quarter of the structure).
2. Block needs two parts, own >= 0.8 (four fifths of the word mass stays in the query's
   part; a uniform map gives ~0.5) and spread >= 0.8 (rows spread over at least about
   n^0.8 keys of their n-token part, about half of a 40-token part: a block, not a band
   along the diagonal nor a few sharp peaks). Local attention stays in the query's part
   too, just because the part boundary is far: on MiniLM a spread threshold of 0.5 called
   wide diagonal bands (spread 0.55-0.7, own ~0.9) Block, which they do not look like.
   Single-sentence inputs (sentence polarity) have no second part: Block cannot occur
   there and such maps count as Heterogeneous.
3. Heterogeneous: everything else, as in the paper (the class list is exhaustive).

The [SEP] next to a word is both a special key and a neighbour: for the few rows beside a
special token the two masses overlap (at most 4 rows of a segment), so `special +
diagonal` can exceed 1 by a little; the rules only compare it with thresholds.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from bertscope.analyses.patterns.outputs import Thresholds  # here for the parser, without torch
from bertscope.engine.batch import _segment_sums
from bertscope.files import write_npz
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import StatsSpec
from bertscope.text.token_classes import PARTS

TYPES = ("Vertical", "Diagonal", "Vertical+Diagonal", "Block", "Heterogeneous")
FEATURES = ("special", "diagonal", "own", "spread", "entropy")
CLASSES = PARTS  # [CLS], [SEP], part A, part B; row groups all, part_a, part_b
# the statistics the kernels compute for this family: offsets -1/+1, class masses and entropy
# (the features), and, for the maps of `iter_maps`, the layers' queries and keys
SPEC = StatsSpec(offsets=(-1, 1), n_key_classes=CLASSES.n_classes, entropy=True, class_mass=True)
MAP_SPEC = SPEC.union(StatsSpec(n_key_classes=CLASSES.n_classes, keep_qk=True))
COLORS = {"Vertical": "#4c72b0", "Diagonal": "#dd8452", "Vertical+Diagonal": "#8172b3", "Block": "#55a868",
          "Heterogeneous": "#c44e52"}


# ----------------------------------------------------------------------------- statistics -> features


def features(sums: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """(B, H) float64 features of every segment and head from one layer's per-segment sums.

    sums: `BatchContext.segment_sums(layer)` under `SPEC` and the PARTS scheme, name ->
          (B, H, G, F) with groups (all, part_a, part_b) and classes (cls, sep, part_a, part_b)
    rows: `BatchContext.group_rows`, (B, G) rows per group
    """
    cm, om, ent = sums["class_mass"], sums["offset_mass"], sums["entropy"][..., 0]  # (B,H,G,C) (B,H,G,O) (B,H,G)
    n_all, n_a, n_b = rows[:, None, 0], rows[:, None, 1], rows[:, None, 2]  # (B, 1) each
    special = (cm[:, :, 0, 0] + cm[:, :, 0, 1]) / n_all  # (B, H)
    diagonal = om[:, :, 0].sum(-1) / n_all  # (B, H): offsets -1 and +1
    own_mass = cm[:, :, 1, 2] + cm[:, :, 2, 3]  # (B, H): A rows on A, B rows on B
    word_mass = cm[:, :, 1, 2:].sum(-1) + cm[:, :, 2, 2:].sum(-1)  # (B, H): word rows on any word
    own = own_mass / word_mass.clamp_min(1e-12)
    part_log = n_a * torch.log(n_a.clamp_min(1)) + n_b * torch.log(n_b.clamp_min(1))  # (B, 1): sum of ln(own part)
    spread = (ent[:, :, 1] + ent[:, :, 2]) / part_log.clamp_min(1e-12)  # (B, H)
    entropy = ent[:, :, 0] / n_all  # (B, H)
    two_parts = (n_b > 0).expand_as(special)  # (B, H)
    return dict(special=special, diagonal=diagonal, own=own, spread=spread, entropy=entropy, two_parts=two_parts)


def classify(feat: dict, t: Thresholds = Thresholds()) -> torch.Tensor:
    """Type index into TYPES of every (segment, head): the rules of the module docstring."""
    special, diagonal = feat["special"], feat["diagonal"]
    structured = special + diagonal
    share = diagonal / structured.clamp_min(1e-12)
    kind = torch.full(special.shape, TYPES.index("Heterogeneous"), dtype=torch.long)
    block = feat["two_parts"] & (feat["own"] >= t.own) & (feat["spread"] >= t.spread)
    kind[block] = TYPES.index("Block")
    lined = structured >= t.structured
    kind[lined] = TYPES.index("Vertical+Diagonal")
    kind[lined & (share < t.mix)] = TYPES.index("Vertical")
    kind[lined & (share > 1 - t.mix)] = TYPES.index("Diagonal")
    return kind


def batch_types(batch, layer: int, t: Thresholds = Thresholds()) -> tuple[torch.Tensor, dict]:
    """(types (B, H), features) of one layer of a `BatchContext` run with `SPEC` and PARTS."""
    feat = features(batch.segment_sums(layer), batch.group_rows)
    return classify(feat, t), feat


def map_features(p: torch.Tensor, key_class: torch.Tensor, key_valid: torch.Tensor | None = None) -> dict:
    """Features of given attention maps through the eager reference kernel, as a batch would have them.

    p: (B, H, L, L) rows summing to 1 over valid keys; key_class: (B, L) PARTS ids.
    The maps are fed to `attention_stats_eager` as scores log p (q = log p, k = identity,
    scale 1), whose softmax gives p back, so the statistics are the oracle's own.
    """
    B, H, L, _ = p.shape
    key_valid = torch.ones(B, L, dtype=torch.bool) if key_valid is None else key_valid
    q = torch.log(p.double().clamp_min(1e-30))  # (B, H, L, L): scores whose softmax is p
    k = torch.eye(L, dtype=torch.float64).expand(B, H, L, L)  # (B, H, L, D=L)
    _, stats = attention_stats_eager(q, k, k, key_valid, key_class, SPEC, scale=1.0)
    groups = torch.stack([key_valid, (key_class == 2) & key_valid, (key_class == 3) & key_valid], -1).double()
    sums = _segment_sums(stats, groups, key_class, SPEC)  # name -> (B, H, G, F)
    return features(sums, groups.sum(1))


# ----------------------------------------------------------------------------- the accumulator


class PatternCounts:
    """Type counts per (layer, head) over a data set: an engine `Accumulator`.

    counts        (layers, H, 5) int64   (example, head) maps of each type
    feature_sums  (layers, H, 5) float64 sums of FEATURES (for per-head means)
    Additive: batches, resumed runs and torchrun ranks merge by addition.
    """

    def __init__(self, n_layers: int, n_heads: int, thresholds: Thresholds = Thresholds()):
        self.n_layers, self.n_heads, self.thresholds = n_layers, n_heads, thresholds
        self.counts = np.zeros((n_layers, n_heads, len(TYPES)), dtype=np.int64)
        self.feature_sums = np.zeros((n_layers, n_heads, len(FEATURES)), dtype=np.float64)
        self.n_examples = 0
        self.batches_done = 0

    def add(self, batch):
        for layer in range(self.n_layers):
            kind, feat = batch_types(batch, layer, self.thresholds)  # (B, H)
            one_hot = torch.nn.functional.one_hot(kind, len(TYPES)).sum(0)  # (H, 5)
            self.counts[layer] += one_hot.cpu().numpy()
            sums = torch.stack([feat[f].nan_to_num(0.0).sum(0) for f in FEATURES], -1)
            self.feature_sums[layer] += sums.cpu().numpy()
        self.n_examples += batch.size

    def merge(self, other: PatternCounts) -> PatternCounts:
        if (other.n_layers, other.n_heads, other.thresholds) != (self.n_layers, self.n_heads, self.thresholds):
            raise ValueError("cannot merge pattern counts of different models or thresholds")
        self.counts += other.counts
        self.feature_sums += other.feature_sums
        self.n_examples += other.n_examples
        return self

    def save(self, path: Path):
        meta = dict(n_layers=self.n_layers, n_heads=self.n_heads, thresholds=self.thresholds.as_dict(), types=TYPES)
        write_npz(path, meta=json.dumps(meta), counts=self.counts, feature_sums=self.feature_sums,
                  n_examples=self.n_examples, batches_done=self.batches_done)

    @classmethod
    def load(cls, path: Path) -> PatternCounts:
        with np.load(path) as f:
            meta = json.loads(str(f["meta"]))
            if tuple(meta["types"]) != TYPES:
                raise ValueError(f"{path} counts other pattern types: {meta['types']}")
            acc = cls(meta["n_layers"], meta["n_heads"], Thresholds(**meta["thresholds"]))
            acc.counts[...] = f["counts"]
            acc.feature_sums[...] = f["feature_sums"]
            acc.n_examples, acc.batches_done = int(f["n_examples"]), int(f["batches_done"])
        return acc

    # -- reading

    def proportions(self) -> np.ndarray:
        """(layers, H, 5) share of each type among a head's maps."""
        return self.counts / max(1, self.n_examples)

    def head_rows(self, data: str) -> list[dict]:
        means = self.feature_sums / max(1, self.n_examples)
        share = self.proportions()
        return [{"data": data, "layer": layer + 1, "head": head + 1, "n": self.n_examples,
                 **{t: share[layer, head, k] for k, t in enumerate(TYPES)},
                 "majority": TYPES[int(self.counts[layer, head].argmax())],
                 **{f"mean_{f}": means[layer, head, k] for k, f in enumerate(FEATURES)}}
                for layer in range(self.n_layers) for head in range(self.n_heads)]

    def tidy_rows(self, data: str) -> list[dict]:
        """Tidy proportions: one row per (data, scope, layer, head, type); scope head / layer / all."""
        total = max(1, self.n_examples)
        rows = []
        for k, t in enumerate(TYPES):
            for layer in range(self.n_layers):
                for head in range(self.n_heads):
                    rows.append(dict(data=data, scope="head", layer=layer + 1, head=head + 1, type=t,
                                     count=int(self.counts[layer, head, k]),
                                     proportion=self.counts[layer, head, k] / total))
                rows.append(dict(data=data, scope="layer", layer=layer + 1, head="", type=t,
                                 count=int(self.counts[layer, :, k].sum()),
                                 proportion=self.counts[layer, :, k].sum() / (total * self.n_heads)))
            rows.append(dict(data=data, scope="all", layer="", head="", type=t, count=int(self.counts[..., k].sum()),
                             proportion=self.counts[..., k].sum() / (total * self.n_heads * self.n_layers)))
        return rows


TIDY_COLUMNS = ("data", "scope", "layer", "head", "type", "count", "proportion")
HEAD_COLUMNS = ("data", "layer", "head", "n") + TYPES + ("majority",) + tuple(f"mean_{f}" for f in FEATURES)


def overall(counts: PatternCounts) -> dict[str, float]:
    total = counts.counts.sum()
    return {t: float(counts.counts[..., k].sum() / max(1, total)) for k, t in enumerate(TYPES)}


# ----------------------------------------------------------------------------- figures
