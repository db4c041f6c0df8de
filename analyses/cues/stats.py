"""Niven & Kao's (2019) cue statistics: applicability, productivity and coverage of every
unigram and bigram of lower-cased word tokens, for ARCT's warrants and RTE's hypotheses."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bertscope.data.readers.tasks import read_arct, read_rte
from bertscope.errors import UserError

WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")
COLUMNS = ("task", "data", "split", "ngram", "cue", "n", "applicability", "productivity", "coverage",
           "label", "base_rate", "strength")


IRREGULAR_NOT = {"can't": "can", "cannot": "can", "won't": "will", "shan't": "shall", "ain't": "is"}


def word_tokens(text: str, expand_not: bool = False) -> list[str]:
    """Lower-cased word tokens: letters/digits with inner apostrophes ("don't"), no punctuation;
    with `expand_not`, negated contractions become verb + "not"."""
    tokens = WORD.findall(text.lower().replace("\u2019", "'"))
    if not expand_not:
        return tokens
    out = []
    for t in tokens:
        if t in IRREGULAR_NOT:
            out += [IRREGULAR_NOT[t], "not"]
        elif t.endswith("n't") and len(t) > 3:
            out += [t[:-3], "not"]
        else:
            out.append(t)
    return out


def ngrams(tokens: Sequence[str], n: int) -> set[str]:
    """The set of n-grams of one text, joined by a space."""
    return {" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@dataclass(frozen=True)
class Cue:
    cue: str
    ngram: int
    n: int                 # data points in the split
    applicability: int     # alpha_k
    productivity: float    # pi_k
    label: int | None = None       # the label the cue points to (RTE); None for ARCT's warrant choice
    base_rate: float | None = None  # that label's share of the split (RTE)

    @property
    def coverage(self) -> float:
        return self.applicability / self.n

    @property
    def chance(self) -> float:
        """Productivity of a cue that carries no signal: 0.5 for a warrant choice, else its label's base rate."""
        return 0.5 if self.base_rate is None else self.base_rate

    @property
    def strength(self) -> float:
        """ARCT: coverage x productivity, the order of Niven & Kao's table of strong cues. RTE:
        coverage x (productivity - base rate), the share of all points the cue gets right beyond
        what its label's base rate gives (coverage x productivity would rank "the" first)."""
        return self.coverage * (self.productivity - (0 if self.base_rate is None else self.base_rate))


def warrant_cues(points: Iterable[tuple[str, str, int]], ngram: int = 1, expand_not: bool = False) -> list[Cue]:
    """Cue statistics over (warrant0, warrant1, correct index) points."""
    applicable, productive, n = Counter(), Counter(), 0
    for w0, w1, label in points:
        n += 1
        sets = (ngrams(word_tokens(w0, expand_not), ngram), ngrams(word_tokens(w1, expand_not), ngram))
        for j in (0, 1):
            for k in sets[j] - sets[1 - j]:  # in warrant j and not in the other: k discriminates
                applicable[k] += 1
                productive[k] += label == j
    return [Cue(k, ngram, n, a, productive[k] / a) for k, a in applicable.items()]


def label_cues(points: Iterable[tuple[str, int]], ngram: int = 1, expand_not: bool = False) -> list[Cue]:
    """Cue statistics over (text, label) points: each cue predicts its most frequent label."""
    per_label: dict[str, Counter] = {}
    labels, n = Counter(), 0
    for text, label in points:
        n += 1
        labels[label] += 1
        for k in ngrams(word_tokens(text, expand_not), ngram):
            per_label.setdefault(k, Counter())[label] += 1
    cues = []
    for k, counts in per_label.items():
        label, hits = max(counts.items(), key=lambda item: (item[1], -item[0]))  # ties: the smaller label
        a = sum(counts.values())
        cues.append(Cue(k, ngram, n, a, hits / a, label, labels[label] / n))
    return cues


def strongest(cues: Iterable[Cue], top: int = 10) -> list[Cue]:
    """Cues more productive than chance (0.5 on ARCT), strongest first (ties: by the cue)."""
    kept = [c for c in cues if c.productivity > c.chance]
    return sorted(kept, key=lambda c: (-c.strength, c.cue))[:top]


# ----------------------------------------------------------------------------- data sets

def cue_tables(task: str, data_dir: str | None = None, seed: int = 0,
               expand_not: bool = False) -> dict[tuple[str, str], list[Cue]]:
    """(data, split) -> cues of every n-gram order, for ARCT (original, adversarial) or RTE."""
    tables: dict[tuple[str, str], list[Cue]] = {}
    if task == "arct":
        for version in ("original", "adversarial"):
            for split in ("train", "dev", "test", "all"):
                points = [(ex.warrant0, ex.warrant1, ex.label) for ex in read_arct(split, version, data_dir)]
                tables[version, split] = [c for n in (1, 2) for c in warrant_cues(points, n, expand_not)]
    elif task == "rte":
        for split in ("train", "dev", "test", "all"):
            points = [(ex.text_b, ex.label) for ex in read_rte(split, data_dir, seed)]
            tables["original", split] = [c for n in (1, 2) for c in label_cues(points, n, expand_not)]
    else:
        raise UserError(f"unknown task {task!r} for cues: choose arct or rte")
    return tables


def rows(task: str, tables: dict[tuple[str, str], list[Cue]], min_n: int = 1) -> list[dict]:
    """Tidy rows for cues.csv: one per (data, split, cue) applicable at least `min_n` times."""
    out = []
    for (data, split), cues in tables.items():
        for c in sorted(cues, key=lambda c: (c.ngram, -c.strength, c.cue)):
            if c.applicability >= min_n:
                out.append({"task": task, "data": data, "split": split, "ngram": c.ngram, "cue": c.cue, "n": c.n,
                            "applicability": c.applicability, "productivity": round(c.productivity, 6),
                            "coverage": round(c.coverage, 6), "label": "" if c.label is None else c.label,
                            "base_rate": "" if c.base_rate is None else round(c.base_rate, 6),
                            "strength": round(c.strength, 6)})
    return out


# ----------------------------------------------------------------------------- command
