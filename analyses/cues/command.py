"""`bertscope cues`: Niven & Kao's (2019) dataset-cue statistics on ARCT, and the same on RTE.

A cue is a unigram or bigram of lower-cased word tokens. On ARCT (a choice between two
warrants), with T_j^(i) the cue set of warrant j of data point i, n the number of data points:

    applicability  alpha_k = #{i : k is in one warrant of i and not in the other}
    productivity   pi_k    = #{i : ... and that warrant is the correct one} / alpha_k
    coverage       xi_k    = alpha_k / n

Productivity above 0.5 means "pick the warrant holding k" beats chance on the points where
k discriminates; coverage says how many points it reaches.

RTE is no choice between candidates, so a cue there is a unigram/bigram of the hypothesis
and "applies" wherever it occurs: alpha_k = #{i : k in T(h_i)}, and it predicts the label
most of those points carry, pi_k = max_y #{i : k in T(h_i), y_i = y} / alpha_k, reported with
that label and its base rate: on a two-class task pi_k >= 0.5 always, so only the lift over
the base rate is a cue, and RTE's cues are ranked by coverage x (pi_k - base rate).

Tokeniser (`word_tokens`): lower-case, then maximal runs of letters/digits with inner
apostrophes kept, so "don't" is one token and differs from "not"; hyphenated words are split
("long-term" -> "long", "term"); punctuation is dropped. Bigrams are adjacent word tokens of
one text. With `expand_not=True` (`--expand-not`) a negated contraction becomes its verb and
"not" ("don't" -> "do not", "can't"/"cannot" -> "can not", "won't" -> "will not"), the way a
lemmatising tokeniser such as spaCy's reads "n't": this is what brings "not"'s coverage on
ARCT near the 0.64 Niven & Kao report (see the README).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from bertscope.report import refresh_report

HELP = "dataset cues: applicability, productivity, coverage of unigrams/bigrams (Niven & Kao 2019)"
DESCRIPTION = (
    "Count Niven & Kao's (2019) cue statistics on ARCT (cues in the warrants, original and "
    "adversarial data) or RTE (cues in the hypothesis), per split and over all splits, for every unigram "
    "and bigram of lower-cased word tokens. Writes cues.csv, a figure and a run.json entry; prints the "
    "strongest cues (productivity above 0.5, sorted by coverage x productivity).")

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
    from bertscope.datasets.tasks import read_arct, read_rte
    from bertscope.errors import UserError

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

def add_arguments(p):
    from bertscope.args import add_quiet_argument, positive_int

    p.add_argument("--task", choices=("arct", "rte"), default="arct",
                   help="arct: cues in the warrants (original and adversarial data); rte: cues in the hypothesis "
                   "(default: arct)")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="folder of the annotated data sets (default: $BERTSCOPE_DATA, then ../shared/data)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="run directory; an existing run's directory gains the outputs (default: runs/<timestamp>)")
    p.add_argument("--top", type=positive_int, default=10, metavar="K", help="strongest cues shown per table (default: 10)")
    p.add_argument("--min-n", type=positive_int, default=1, metavar="N",
                   help="cues.csv keeps cues applicable to at least N data points (default: 1, all)")
    p.add_argument("--expand-not", action="store_true",
                   help="read negated contractions as verb + 'not' (\"don't\" -> 'do not'), as a lemmatising "
                   "tokeniser would; by default \"don't\" is one token, different from 'not'")
    p.add_argument("--seed", type=int, default=0, help="seed of the RTE dev split (default: 0)")
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figure")
    add_quiet_argument(p)


def main(args) -> int:
    from bertscope.rundir import AnalysisRun

    tables = cue_tables(args.task, args.data_dir, args.seed, args.expand_not)  # reads the data first: a missing set fails early
    run = AnalysisRun("cues", args)
    run.write_csv("cues.csv", rows(args.task, tables, args.min_n), COLUMNS)
    results = {}
    for (data, split), cues in tables.items():
        top = strongest([c for c in cues if c.ngram == 1], top=args.top)
        results[f"{data}/{split}"] = {"n": cues[0].n if cues else 0,
                                      "top": [{"cue": c.cue, "productivity": round(c.productivity, 4),
                                               "coverage": round(c.coverage, 4)} for c in top]}
        if split == "all" or not getattr(args, "quiet", False):
            run.log(_table(f"{args.task} {data} {split}", cues, args.top))
    if not args.no_figures:
        run.save_figure(cue_figure(args.task, tables, args.top), "cues.png")
    run.finish(results)
    refresh_report(run.dir)
    return 0


def _table(title: str, cues: list[Cue], top: int) -> str:
    order = "productivity > 0.5, by coverage x productivity" if not cues or cues[0].label is None else \
        "productivity above the label's base rate, by coverage x (productivity - base rate)"
    lines = [f"{title}: n = {cues[0].n if cues else 0}; strongest cues ({order})",
             f"  {'cue':<18}{'applic.':>8}{'product.':>10}{'coverage':>10}"]
    for c in strongest(cues, top=top):
        label = "" if c.label is None else f"  -> label {c.label} (base rate {c.base_rate:.2f})"
        lines.append(f"  {c.cue:<18}{c.applicability:>8}{c.productivity:>10.3f}{c.coverage:>10.3f}{label}")
    return "\n".join(lines)


def cue_figure(task: str, tables: dict[tuple[str, str], list[Cue]], top: int):
    """Productivity against coverage of the unigram cues over all splits, strongest ones named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the original data over all splits; the adversarial test set, where every cue should sit at 0.5
    panels = [key for key in (("original", "all"), ("adversarial", "test")) if key in tables]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False, sharey=True)
    for ax, key in zip(axes[0], panels):
        cues = [c for c in tables[key] if c.ngram == 1 and c.applicability >= 5]
        ax.scatter([c.coverage for c in cues], [c.productivity for c in cues], s=6, alpha=0.35, color="0.4")
        for rank, c in enumerate(strongest(cues, top=top)):
            ax.scatter([c.coverage], [c.productivity], s=14, color="tab:red")
            ax.annotate(c.cue, (c.coverage, c.productivity), fontsize=7, textcoords="offset points",
                        xytext=(4, 8 - 7 * (rank % 3)))  # staggered: strong cues crowd at low coverage
        ax.set_ylim(-0.03, 1.03)
        ax.axhline(0.5, color="0.6", lw=0.8, ls="--")  # chance for a warrant choice; RTE's base rates are ~0.5
        ax.set(xlabel="coverage (share of data points the cue applies to)", ylabel="productivity",
               title=f"{task.upper()} {key[0]}, {'all splits' if key[1] == 'all' else key[1] + ' split'} "
               "(unigrams applicable to >= 5 points)")
        ax.title.set_fontsize(9)
    fig.suptitle("Dataset cues (Niven & Kao 2019): red = the strongest cues above chance (see cues.csv, strength)",
                 fontsize=10)
    fig.tight_layout()
    return fig
