"""Relation heads and token-to-token attention, Kovaleva et al. (2019) sections 4.2 and 4.5.

Everything here sees word-level maps (`(layers, H, W, W)`, row = the attending word, column
= the attended word; `bertscope.kernels.WordPooling`: attention to a word sums its tokens'
columns, attention from it averages its tokens' rows) and gold word links, never the engine.

Relation heads (4.2). The paper took FrameNet sentences of at most 12 tokens, linked a
frame-evoking predicate to its core frame elements, dropped links less than two tokens
apart, and scored each head by "the maximum absolute attention weight among those token
pairs that correspond to the annotated semantic link", averaged over sentences. FrameNet is
not here, so the links are gold UD arcs from a predicate to its core arguments (`CORE`):
`relation_links` keeps a sentence of at most `max_words` words and its links whose two words
are at least `min_distance` words apart. One sentence gives one score per head: the largest
weight over its links, in either direction (A[pred, arg] or A[arg, pred]), pooled in the
group "all" and per relation (a sentence counts for a relation when it has such a link).
A "control" group scores the predicate with a random unrelated word of the same sentence
(`control_links`), what a head gives any word there: the paper had no such baseline.

Token-to-token attention (4.5). One directed weight per link, A[from, to]: from the verb to
its subject, from a pronoun to its antecedent, each link one unit. Every link is also
counted in a "_far" group when its words are at least two apart, where a previous/next-token
head cannot score.

Heads are flagged as the paper did: above the 99th percentile of all heads' values
(`flag_heads`). With n heads and numpy's linear interpolation, that percentile lies between
the two largest values for n <= 100 and between the 2nd and 3rd for 101 <= n <= 200, so
it flags exactly 1 head of MiniLM's 72 and 2 of bert-base's 144 (the paper's "2 of 144"),
whatever the values: the rank, not the threshold, carries the information.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bertscope.analyses.relations.outputs import (  # here for the parser, without torch
    ADJACENT_MASS,
    MAX_WORDS,
    MIN_DISTANCE,
)
from bertscope.files import write_npz
from bertscope.kernels.spec import StatsSpec


def needs(n_key_classes: int) -> StatsSpec:
    """The statistics the kernels compute for this family: word maps for the link scores, token
    offsets -1/+1 for the previous/next-token test."""
    return StatsSpec(offsets=(-1, 1), n_key_classes=n_key_classes, word_maps=True)


CORE = ("nsubj", "nsubj:pass", "obj", "iobj", "obl")  # exact UD labels (obl:tmod etc. are not core)
ALL = "all"
CONTROL = "control"  # the predicate with a random unrelated word (`control_links`)
PERCENTILE = 99.0
VERB_SUBJECT = "verb_subject"
PRONOUN_ANTECEDENT = "pronoun_antecedent"
TOKEN_GROUPS = (VERB_SUBJECT, VERB_SUBJECT + "_far", PRONOUN_ANTECEDENT, PRONOUN_ANTECEDENT + "_far")
ANTECEDENT_UPOS = ("NOUN", "PROPN")


# --- gold links ------------------------------------------------------------------------


def relation_links(heads: Sequence[int], deprels: Sequence[str], max_words: int = MAX_WORDS,
                   min_distance: int = MIN_DISTANCE) -> list[tuple[str, int, int]] | None:
    """(relation, predicate word, argument word), 0-based, of one sentence's core arcs
    whose words are at least `min_distance` apart; None for a sentence of more than
    `max_words` words. `heads` are CoNLL-U heads (1-based, 0 = root)."""
    if len(heads) > max_words:
        return None
    return [(rel, h - 1, i) for i, (h, rel) in enumerate(zip(heads, deprels))
            if rel in CORE and h > 0 and abs(h - 1 - i) >= min_distance]


def control_links(heads: Sequence[int], upos: Sequence[str], links: list[tuple[str, int, int]], rng,
                  min_distance: int = MIN_DISTANCE) -> list[tuple[int, int]]:
    """A control pair (predicate, word) per link: a word with no arc to or from the
    predicate, not punctuation, at least `min_distance` from it, at the link's distance when
    one such word is (else at any distance); none when no word qualifies. `rng` is a
    `random.Random` (seeded per sentence, so a resumed run draws the same pairs).

    Scored like the links themselves, it is what a head gives a predicate and an unrelated
    word of the same sentence: the part of a relation score that is not about the relation."""
    pairs = []
    for _, p, a in links:
        related = {i for i, h in enumerate(heads) if h - 1 == p} | {heads[p] - 1}
        free = [w for w in range(len(heads)) if w != p and w not in related and upos[w] != "PUNCT"
                and abs(w - p) >= min_distance]
        same = [w for w in free if abs(w - p) == abs(a - p)]
        if free:
            pairs.append((p, rng.choice(same or free)))
    return pairs


def verb_subject_links(heads: Sequence[int], deprels: Sequence[str], upos: Sequence[str],
                       offset: int = 0) -> list[tuple[int, int]]:
    """(verb, subject) word pairs: `nsubj` / `nsubj:pass` dependents of a VERB. `heads` are
    0-based document indices (-1 = root) when `offset` is that of the words, CoNLL-U
    (1-based) when `offset` is 1."""
    return [(h - offset, i) for i, (h, rel) in enumerate(zip(heads, deprels))
            if rel in ("nsubj", "nsubj:pass") and h - offset >= 0 and upos[h - offset] == "VERB"]


def pronoun_antecedent_links(doc) -> list[tuple[int, int]]:
    """(pronoun, antecedent) head-word pairs of a `CorefDocument` (or a window of one).

    A pronoun is a mention whose head word is a PRON. Its antecedent is the nearest earlier
    mention of the same entity whose head is a NOUN or PROPN ("its noun antecedent"; earlier
    pronouns of the chain are passed over): the one whose head word comes last before the
    pronoun's. Pronouns without such a mention in `doc` give no link.
    """
    links = []
    for m in doc.mentions:
        if doc.upos[m.head] != "PRON":
            continue
        before = [a.head for a in doc.mentions
                  if a.entity == m.entity and a.head < m.head and doc.upos[a.head] in ANTECEDENT_UPOS]
        if before:
            links.append((m.head, max(before)))
    return links


@dataclass
class Links:
    """One input's scored links: group index, from word and to word of each, (m,) int64."""

    group: np.ndarray
    src: np.ndarray
    dst: np.ndarray

    @classmethod
    def of(cls, triples: Sequence[tuple[int, int, int]]) -> Links:
        arr = np.array(triples, dtype=np.int64).reshape(-1, 3)  # (m, 3)
        return cls(arr[:, 0], arr[:, 1], arr[:, 2])

    def __len__(self) -> int:
        return len(self.group)


def relation_input(links: list[tuple[str, int, int]], groups: Sequence[str],
                   control: Sequence[tuple[int, int]] = ()) -> Links:
    """A sentence's relation links, each in its relation's group and in "all"; the
    `control_links` pairs in group "control"."""
    index = {g: k for k, g in enumerate(groups)}
    return Links.of([(index[g], p, a) for rel, p, a in links for g in (ALL, rel)]
                    + [(index[CONTROL], p, w) for p, w in control])


def token_input(pairs: dict[str, list[tuple[int, int]]], min_distance: int = MIN_DISTANCE) -> Links:
    """Directed token-to-token links by kind (`VERB_SUBJECT`, `PRONOUN_ANTECEDENT`), each
    also in the kind's "_far" group when its words are at least `min_distance` apart."""
    index = {g: k for k, g in enumerate(TOKEN_GROUPS)}
    triples = []
    for kind, kind_pairs in pairs.items():
        for a, b in kind_pairs:
            triples.append((index[kind], a, b))
            if abs(a - b) >= min_distance:
                triples.append((index[kind + "_far"], a, b))
    return Links.of(triples)


# --- scores ----------------------------------------------------------------------------


def link_weights(maps: np.ndarray, src: np.ndarray, dst: np.ndarray, both: bool) -> np.ndarray:
    """(layers, H, m) attention of every head from src[k] to dst[k]; with `both`, the larger
    of that and dst[k] -> src[k]. maps: (layers, H, W, W)."""
    w = maps[:, :, src, dst]  # (layers, H, m)
    return np.maximum(w, maps[:, :, dst, src]) if both else w


@dataclass
class LinkScores:
    """Per-head sums of link attention, per group, over a data set (an engine accumulator).

    unit="sentence": each input adds, for each group it has links of, the largest weight
    over those links, in either direction (relation heads); n counts inputs.
    unit="link": each link adds its directed weight A[src, dst] (token-to-token); n counts links.
    `links[i]` are the `Links` of segment i (not saved: rebuilt from the data on resume).
    """

    groups: list[str]
    n_layers: int
    n_heads: int
    unit: str = "sentence"
    links: Sequence | None = field(default=None, repr=False)
    sums: np.ndarray = field(init=False)  # (G, layers, H)
    n: np.ndarray = field(init=False)  # (G,)
    batches_done: int = field(default=0, init=False)

    def __post_init__(self):
        if self.unit not in ("sentence", "link"):
            raise ValueError(f"unit must be 'sentence' or 'link', not {self.unit!r}")
        self.sums = np.zeros((len(self.groups), self.n_layers, self.n_heads))
        self.n = np.zeros(len(self.groups), dtype=np.int64)

    def add(self, batch):
        """Score every segment of an engine batch from its layers' word maps."""
        maps = torch.stack([s.word_map for s in batch.layers], dim=1).float().cpu().numpy()  # (B, layers, H, W, W)
        for row, i in enumerate(batch.indices):
            self.add_maps(maps[row], self.links[i])

    def add_maps(self, maps: np.ndarray, links: Links):
        """One input: its word maps (layers, H, W, W) and its links."""
        if len(links) == 0:
            return
        w = link_weights(maps, links.src, links.dst, both=self.unit == "sentence").astype(np.float64)  # (layers, H, m)
        if self.unit == "link":
            np.add.at(self.sums, links.group, w.transpose(2, 0, 1))
            np.add.at(self.n, links.group, 1)
            return
        for g in np.unique(links.group):
            self.sums[g] += w[:, :, links.group == g].max(-1)
            self.n[g] += 1

    def means(self) -> np.ndarray:
        """(G, layers, H) mean score per group; NaN for a group without inputs."""
        n = self.n[:, None, None].astype(np.float64)
        return np.divide(self.sums, n, out=np.full_like(self.sums, np.nan), where=n > 0)

    def merge(self, other: LinkScores) -> LinkScores:
        if (other.groups, other.n_layers, other.n_heads, other.unit) != (self.groups, self.n_layers, self.n_heads,
                                                                          self.unit):
            raise ValueError("cannot merge link scores of different groups, models or units")
        self.sums += other.sums
        self.n += other.n
        return self

    def save(self, path):
        write_npz(path, groups=np.array(self.groups), shape=[self.n_layers, self.n_heads], unit=self.unit,
                  sums=self.sums, n=self.n, batches_done=self.batches_done)

    @classmethod
    def load(cls, path, links: Sequence | None = None) -> LinkScores:
        with np.load(path) as f:
            acc = cls([str(g) for g in f["groups"]], *map(int, f["shape"]), unit=str(f["unit"]), links=links)
            acc.sums[...], acc.n[...] = f["sums"], f["n"]
            acc.batches_done = int(f["batches_done"])
        return acc


# --- summaries -------------------------------------------------------------------------


def flag_heads(values: np.ndarray, percentile: float = PERCENTILE) -> np.ndarray:
    """Bool mask of the heads above the `percentile`-th percentile of all heads' values
    (numpy's linear interpolation; NaN heads are never flagged)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return np.zeros(values.shape, dtype=bool)
    return np.nan_to_num(values, nan=-np.inf) > np.percentile(finite, percentile)


def top_heads(values: np.ndarray, k: int) -> list[tuple[int, int]]:
    """(layer, head), 0-based, of the k largest values of (layers, H), largest first (ties: first)."""
    order = np.argsort(-np.nan_to_num(values, nan=-np.inf), axis=None, kind="stable")[:k]
    return [tuple(int(x) for x in np.unravel_index(i, values.shape)) for i in order]


def adjacent_heads(prev: np.ndarray, next_: np.ndarray, threshold: float = ADJACENT_MASS) -> np.ndarray:
    """(layers, H) bool: previous/next-token heads, whose mean mass on offset -1 or on +1 exceeds `threshold`."""
    return np.maximum(prev, next_) > threshold


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho of two equal-shape arrays (ranks by argsort: ties broken by position,
    which real-valued head means practically never have); NaN entries are left out."""
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3:
        return float("nan")
    rx, ry = (np.argsort(np.argsort(v[keep], kind="stable"), kind="stable").astype(float) for v in (x, y))
    return float(np.corrcoef(rx, ry)[0, 1])


def head_rows(data: str, analysis: str, scores: LinkScores, prev: np.ndarray | None = None,
              next_: np.ndarray | None = None, adjacent_mass: float = ADJACENT_MASS) -> list[dict]:
    """Tidy rows, one per (group, layer, head): mean score, inputs, rank, flag, and the
    head's offset -1/+1 mass when given."""
    rows = []
    means = scores.means()
    for g, group in enumerate(scores.groups):
        values = means[g]
        flags = flag_heads(values)
        rank = np.empty(values.size, dtype=np.int64)
        rank[np.argsort(-np.nan_to_num(values, nan=-np.inf), axis=None, kind="stable")] = np.arange(1, values.size + 1)
        rank = rank.reshape(values.shape)
        for layer in range(scores.n_layers):
            for head in range(scores.n_heads):
                row = dict(data=data, analysis=analysis, group=group, layer=layer + 1, head=head + 1,
                           score=round(float(values[layer, head]), 6), n=int(scores.n[g]),
                           rank=int(rank[layer, head]), flagged=int(flags[layer, head]))
                if prev is not None:
                    row.update(prev=round(float(prev[layer, head]), 6), next=round(float(next_[layer, head]), 6),
                               prev_next_head=int(adjacent_heads(prev, next_, adjacent_mass)[layer, head]))
                rows.append(row)
    return rows


def summary_rows(data: str, analysis: str, scores: LinkScores, k: int, prev: np.ndarray | None = None,
                 next_: np.ndarray | None = None, adjacent_mass: float = ADJACENT_MASS) -> list[dict]:
    """One row per group: inputs, 99th-percentile threshold, flagged heads, top-k heads and,
    with the offset masses, how many of the top k and of the flagged heads are previous/next-token heads."""
    rows = []
    means = scores.means()
    adjacent = None if prev is None else adjacent_heads(prev, next_, adjacent_mass)
    for g, group in enumerate(scores.groups):
        values = means[g]
        if scores.n[g] == 0:
            continue
        flags = flag_heads(values)
        top = top_heads(values, k)
        flagged = [tuple(int(x) for x in ix) for ix in np.argwhere(flags)]
        flagged.sort(key=lambda lh: -values[lh])
        row = dict(data=data, analysis=analysis, group=group, n=int(scores.n[g]),
                   mean=round(float(np.nanmean(values)), 4),
                   p99=round(float(np.percentile(values[np.isfinite(values)], PERCENTILE)), 4),
                   flagged=" ".join(f"{l + 1}-{h + 1}:{values[l, h]:.3f}" for l, h in flagged),
                   top=" ".join(f"{l + 1}-{h + 1}:{values[l, h]:.3f}" for l, h in top))
        if adjacent is not None:
            row.update(top_prev_next=sum(bool(adjacent[lh]) for lh in top), top_k=len(top),
                       flagged_prev_next=sum(bool(adjacent[lh]) for lh in flagged), n_flagged=len(flagged),
                       prev_next_heads=int(adjacent.sum()),
                       rho_prev_next=round(rank_correlation(values, np.maximum(prev, next_)), 3))
        rows.append(row)
    return rows


def head_label(layer: int, head: int) -> str:
    """'<layer>-<head>' from 1, as the papers write heads, from 0-based indices."""
    return f"{layer + 1}-{head + 1}"


def pooled(parts: list):
    """The sum of several data sets' accumulators (they are additive), as a new object."""
    total = copy.deepcopy(parts[0])
    for other in parts[1:]:
        total.merge(other)
    return total


def prev_next(offsets) -> tuple[np.ndarray, np.ndarray]:
    """(layers, H) mean mass on offset -1 and on +1, over every query token of the inputs."""
    mass = offsets.mean("offset_mass_sum")  # (layers, H, 2)
    return mass[..., 0], mass[..., 1]


def tables(results: dict, analyses, names: list[str]):
    """{(analysis, data label): (LinkScores, prev, next, n_inputs)} per data set, plus the pooled
    'ewt+gum' when there are two."""
    out = {}
    for analysis in analyses:
        parts = [results[(analysis, name)] for name in names]
        for name, (scores, offsets, report, _, _) in zip(names, parts):
            out[(analysis, name)] = (scores, *prev_next(offsets), report["inputs"])
        if len(names) > 1:
            scores = pooled([p[0] for p in parts])
            offsets = pooled([p[1] for p in parts])
            out[(analysis, "+".join(names))] = (scores, *prev_next(offsets), sum(p[2]["inputs"] for p in parts))
    return out


def format_summary(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r['analysis']:9} {r['data']:8} {r['group']:24} n={r['n']:<6} mean={r['mean']:.3f} "
                     f"p99={r['p99']:.3f}  flagged: {r['flagged']}")
        lines.append(f"{'':44}top {r['top_k']}: {r['top']}")
        lines.append(f"{'':44}previous/next-token heads: {r['top_prev_next']} of the top {r['top_k']}, "
                     f"{r['flagged_prev_next']} of {r['n_flagged']} flagged ({r['prev_next_heads']} in the model); "
                     f"Spearman rho(score, max(prev, next)) over the heads {r['rho_prev_next']:.2f}")
    return "\n".join(lines) + "\n"
