"""Which attention heads track which dependency relation (Clark et al. 2019, section 4.2, Table 1).

Each head is read as a parser with no parameters: for a word, the word it attends to most
(itself, [CLS] and [SEP] excluded) is its predicted head. Accuracy for a relation is the
share of that relation's dependents whose prediction is the gold head word. Clark et al.
evaluate two directions, and so do we:

    dep->head  the dependent attends to its head: the argmax of the dependent's row of the
               word-level map is the head word (exactly `RowStats.word_argmax`).
    head->dep  the head word attends to the dependent. Default (`column`), as in Clark et
               al.'s released code, which runs the same predictor on the transposed map:
               among the other words, the one that attends most to the dependent (argmax
               of the dependent's column) is its head. The alternative (`row`) asks whether
               the head word's own most-attended other word is this dependent; a head with
               two dependents of one relation can then get at most one of them right.

Both are scored per dependent, so the two directions share one denominator and one
baseline. The baseline is the best fixed offset: always predict the word k places away
(head = dependent + k, k in -5..5 without 0, the best k chosen per relation; an offset that
leaves the sentence is wrong). The "all" row pools every relation and is compared with the
right-branching baseline (offset +1), as in the paper's "All" row. Root words have no head
word and are skipped everywhere, "all" included.

Possessives: Clark et al.'s code scores a possessor followed by "'s" with the prediction of
the "'s" word instead (BERT tends to attach the clitic, not the noun, to the possessed noun).
With `poss_clitic=True` (default) we do the same for UD's `nmod:poss` dependents whose next
word is a `case` dependent of theirs (EWT splits "John's" into `John` + `'s`).

Labels: the data are UD (EWT, GUM), the paper used Stanford Dependencies (SD) on the WSJ. Where
a UD label has an SD counterpart, `SD_LABELS` names it. The big difference is prepositions:
SD had `prep` (verb/noun -> preposition) and `pobj` (preposition -> its noun); UD makes the
noun the head and attaches the preposition to it as `case`. So UD `case` is SD `pobj` turned
around, and "the preposition attends to its noun" (the direction in which the paper found its
pobj head, 9-6) is UD `case` dep->head. The match is exact against SD `pobj` head->dep in the
`row` reading; under the paper's transposed scoring, pobj head->dep asked instead whether the
word attending most to the noun is its preposition, a related but different count. UD
`obl`/`nmod` (verb/noun -> noun) span SD's `prep` + `pobj` path and have no one-arc SD
counterpart; SD `prep` (verb/noun -> preposition) has none in UD.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bertscope.analyses.probes.syntax.outputs import HEAD_TO_DEP_MODES  # here for the parser, without torch
from bertscope.files import write_npz
from bertscope.kernels.pooling import word_argmax

DIRECTIONS = ("dep->head", "head->dep")
# candidate offsets, small ones first, so that a tie goes to the smaller |k| (+ before -)
OFFSETS = (1, -1, 2, -2, 3, -3, 4, -4, 5, -5)
RIGHT_BRANCHING = 1
ALL = "all"

# UD label -> the Stanford Dependencies label it corresponds to (the paper's names first)
SD_LABELS = {
    "det": "det", "obj": "dobj", "aux:pass": "auxpass", "aux": "aux", "nmod:poss": "poss",
    "case": "pobj (reversed)", "amod": "amod", "compound": "nn", "nsubj": "nsubj",
    "advmod": "advmod", "compound:prt": "prt", "mark": "mark", "ccomp": "ccomp",
    "nsubj:pass": "nsubjpass", "iobj": "iobj", "xcomp": "xcomp", "advcl": "advcl",
    "acl:relcl": "rcmod", "acl": "vmod", "nummod": "num", "appos": "appos", "conj": "conj",
    "cc": "cc", "cop": "cop", "expl": "expl", "csubj": "csubj", "det:predet": "predet",
    "cc:preconj": "preconj", "parataxis": "parataxis", "discourse": "discourse",
    "punct": "punct", "dep": "dep", "obl:tmod": "tmod", "nmod:tmod": "tmod",
    "obl:npmod": "npadvmod", "nmod:npmod": "npadvmod",
}
# the paper's Table 1 rows, in its order, as UD labels
PAPER_ORDER = ("det", "obj", "aux:pass", "aux", "nmod:poss", "case", "amod", "compound",
               "nsubj", "advmod", "compound:prt", "mark", "ccomp")


def sentence_dependents(heads: Sequence[int], deprels: Sequence[str], poss_clitic: bool = True):
    """The scored dependents of one sentence (root words left out).

    heads: 1-based heads, 0 for the root (CoNLL-U). Returns (source, head, relations):
    `source[d]` the 0-based word whose attention is read for dependent d (the dependent
    itself, or its possessive clitic, see the module docstring), `head[d]` its 0-based gold
    head, `relations[d]` its full UD label.
    """
    source, head, relations = [], [], []
    n = len(heads)
    for i, (h, rel) in enumerate(zip(heads, deprels)):
        if h == 0:
            continue
        s = i
        if poss_clitic and rel == "nmod:poss" and i + 1 < n and heads[i + 1] == i + 1 and deprels[i + 1] == "case":
            s = i + 1
        source.append(s)
        head.append(h - 1)
        relations.append(rel)
    return np.array(source, dtype=np.int64), np.array(head, dtype=np.int64), relations


def word_predictions(maps: np.ndarray, n_words: int) -> tuple[np.ndarray, np.ndarray]:
    """Every head's predicted head word for every word, both ways, from one sentence's maps.

    maps: (layers, H, W, W) word-level maps, words first (units >= n_words are specials).
    Returns (row, column), each (layers, H, n_words) int64: `row[l, h, i]` is the other word
    word i attends to most (= `RowStats.word_argmax`), `column[l, h, i]` the other word that
    attends most to word i. Ties go to the lowest index; -1 when there is no other word.
    """
    block = torch.as_tensor(np.asarray(maps)[:, :, :n_words, :n_words])  # (layers, H, n, n)
    words = torch.ones(1, n_words, dtype=torch.bool)  # (1, n): every word is a candidate
    row = word_argmax(block, words)  # (layers, H, n): the kernel's own row argmax
    column = word_argmax(block.transpose(-1, -2), words)  # (layers, H, n): over the columns
    return row.numpy(), column.numpy()


@dataclass
class SyntaxCounts:
    """Correct predictions per (relation, direction, layer, head), summed over sentences.

    Additive, so sentences can be added in any order and counts of two runs or ranks merged.
    An engine accumulator (`bertscope.engine.batch.Accumulator`): `add(batch)` scores every segment
    of a batch from its word-level maps, with `dependents[i]` (the `sentence_dependents` of
    segment i) as the gold standard; `add_sentence` scores one sentence's predictions.
    """

    relations: list[str]
    n_layers: int
    n_heads: int
    head_to_dep: str = "column"
    dependents: Sequence | None = field(default=None, repr=False)  # per segment index; not saved
    correct: np.ndarray = field(init=False)  # (R, 2, layers, H)
    baseline: np.ndarray = field(init=False)  # (R, len(OFFSETS))
    n: np.ndarray = field(init=False)  # (R,)
    batches_done: int = field(default=0, init=False)

    def __post_init__(self):
        if self.head_to_dep not in HEAD_TO_DEP_MODES:
            raise ValueError(f"head_to_dep must be one of {HEAD_TO_DEP_MODES}, not {self.head_to_dep!r}")
        self.index = {r: i for i, r in enumerate(self.relations)}
        R = len(self.relations)
        self.correct = np.zeros((R, 2, self.n_layers, self.n_heads), dtype=np.int64)
        self.baseline = np.zeros((R, len(OFFSETS)), dtype=np.int64)
        self.n = np.zeros(R, dtype=np.int64)

    def add(self, batch):
        """Score every segment of an engine batch (its layers' `word_map`s) against `dependents`."""
        maps = np.stack([s.word_map.float().cpu().numpy() for s in batch.layers], axis=1)  # (B, layers, H, W, W)
        for row, i in enumerate(batch.indices):
            self.add_sentence(*word_predictions(maps[row], len(batch.segments[row].words)), *self.dependents[i])

    def add_sentence(self, row: np.ndarray, column: np.ndarray, source: np.ndarray, head: np.ndarray,
                     relations: Sequence[str]):
        """One sentence: `row`/`column` from `word_predictions`, dependents from `sentence_dependents`."""
        if len(source) == 0:
            return
        rel = np.array([self.index[r] for r in relations], dtype=np.int64)  # (m,)
        dep_to_head = row[:, :, source] == head  # (layers, H, m)
        if self.head_to_dep == "column":
            head_to_dep = column[:, :, source] == head  # (layers, H, m)
        else:
            head_to_dep = row[:, :, head] == source  # (layers, H, m)
        np.add.at(self.correct[:, 0], rel, dep_to_head.transpose(2, 0, 1))
        np.add.at(self.correct[:, 1], rel, head_to_dep.transpose(2, 0, 1))
        offset_hit = source[:, None] + np.array(OFFSETS) == head[:, None]  # (m, K)
        np.add.at(self.baseline, rel, offset_hit)
        np.add.at(self.n, rel, 1)

    def merge(self, other: SyntaxCounts) -> SyntaxCounts:
        if (other.relations, other.n_layers, other.n_heads, other.head_to_dep) != (
                self.relations, self.n_layers, self.n_heads, self.head_to_dep):
            raise ValueError("cannot merge syntax counts of different relations, models or scorings")
        self.correct += other.correct
        self.baseline += other.baseline
        self.n += other.n
        return self

    def save(self, path):
        write_npz(path, relations=np.array(self.relations), shape=[self.n_layers, self.n_heads],
                  head_to_dep=self.head_to_dep, correct=self.correct, baseline=self.baseline, n=self.n,
                  batches_done=self.batches_done)

    @classmethod
    def load(cls, path, dependents: Sequence | None = None) -> SyntaxCounts:
        with np.load(path) as f:
            counts = cls([str(r) for r in f["relations"]], *map(int, f["shape"]), head_to_dep=str(f["head_to_dep"]),
                         dependents=dependents)
            counts.correct[...], counts.baseline[...], counts.n[...] = f["correct"], f["baseline"], f["n"]
            counts.batches_done = int(f["batches_done"])
        return counts


def _best(values: np.ndarray) -> tuple[int, int]:
    """(layer, head), 0-based, of the largest value of a (layers, H) array (ties: first)."""
    return np.unravel_index(int(np.argmax(values)), values.shape)


def head_label(layer: int, head: int) -> str:
    """`<layer>-<head>`, numbered from 1 as in the paper."""
    return f"{layer + 1}-{head + 1}"


def relation_order(relations: Sequence[str], n: Sequence[int]) -> list[str]:
    """The paper's Table 1 relations first (in its order), then the rest by frequency."""
    count = dict(zip(relations, n))
    first = [r for r in PAPER_ORDER if r in count]
    rest = sorted((r for r in relations if r not in PAPER_ORDER), key=lambda r: (-count[r], r))
    return first + rest


def summarise(counts: SyntaxCounts, treebank: str) -> tuple[list[dict], list[dict]]:
    """(head_rows, table_rows).

    head_rows: every (relation, direction, layer, head) with its accuracy, "all" included.
    table_rows: per relation and direction the best head next to the best fixed offset
    (for "all": the right-branching baseline, offset +1).
    """
    relations = [ALL] + relation_order(counts.relations, counts.n)
    correct = {ALL: counts.correct.sum(axis=0)}  # (2, layers, H)
    baseline = {ALL: counts.baseline.sum(axis=0)}
    n = {ALL: int(counts.n.sum())}
    for r, i in counts.index.items():
        correct[r], baseline[r], n[r] = counts.correct[i], counts.baseline[i], int(counts.n[i])

    head_rows, table_rows = [], []
    for r in relations:
        if n[r] == 0:
            continue
        sd = "" if r == ALL else SD_LABELS.get(r, "")
        if r == ALL:
            k = OFFSETS.index(RIGHT_BRANCHING)
        else:
            k = int(np.argmax(baseline[r]))
        for d, direction in enumerate(DIRECTIONS):
            accuracy = correct[r][d] / n[r]  # (layers, H)
            for layer in range(counts.n_layers):
                for h in range(counts.n_heads):
                    head_rows.append(dict(treebank=treebank, relation=r, sd_label=sd, direction=direction,
                                          layer=layer + 1, head=h + 1, accuracy=round(float(accuracy[layer, h]), 4),
                                          n=n[r]))
            layer, h = _best(accuracy)
            table_rows.append(dict(
                treebank=treebank, relation=r, sd_label=sd, direction=direction,
                best_head=head_label(layer, h), accuracy=round(float(accuracy[layer, h]), 4),
                baseline_offset=f"{OFFSETS[k]:+d}", baseline_accuracy=round(float(baseline[r][k] / n[r]), 4),
                n=n[r]))
    return head_rows, table_rows


def format_table(table_rows: Sequence[dict], min_count: int = 100) -> str:
    """Table 1 as text: one line per relation with at least `min_count` dependents, both
    directions side by side (the better one starred) and the fixed-offset baseline."""
    by_relation: dict[str, dict[str, dict]] = {}
    for row in table_rows:
        by_relation.setdefault(row["relation"], {})[row["direction"]] = row
    lines = [f"{'relation':<14} {'SD':<16} {'n':>6}   {'dep->head':<14} {'head->dep':<14} {'baseline':<13}",
             f"{'':<14} {'':<16} {'':>6}   {'head   acc':<14} {'head   acc':<14} {'offset  acc':<13}"]
    left_out = []
    for relation, rows in by_relation.items():
        first = rows[DIRECTIONS[0]]
        if first["n"] < min_count:
            left_out.append(f"{relation} ({first['n']})")
            continue
        best = max(DIRECTIONS, key=lambda d: rows[d]["accuracy"])
        cells = []
        for d in DIRECTIONS:
            star = "*" if d == best else " "
            cells.append(f"{rows[d]['best_head']:<6}{100 * rows[d]['accuracy']:5.1f}{star}  ")
        baseline = f"{first['baseline_offset']:>3} {100 * first['baseline_accuracy']:7.1f}"
        name = "all (non-root)" if relation == ALL else relation
        lines.append(f"{name:<14} {first['sd_label']:<16} {first['n']:>6}   {cells[0]:<14} {cells[1]:<14} {baseline}")
    lines.append("accuracy in %; * = the better direction; baseline = best fixed offset "
                 "(head = dependent + k), for 'all' right-branching (+1)")
    if left_out:
        lines.append(f"fewer than {min_count} dependents (in the CSVs only): " + ", ".join(left_out))
    return "\n".join(lines) + "\n"


# --- figures ------------------------------------------------------------------------------

HEATMAP_RELATIONS = ("det", "obj", "nmod:poss", "case", "aux", "amod", "nsubj", "mark")
