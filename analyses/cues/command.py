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

from bertscope.analyses.cues.outputs import CUES_FIGURE, CUES_FILE
from bertscope.analyses.cues.plots import cue_figure
from bertscope.analyses.cues.stats import COLUMNS, Cue, cue_tables, rows, strongest
from bertscope.cli.args import add_quiet_argument, positive_int
from bertscope.run.analysis_run import AnalysisRun

HELP = "dataset cues: applicability, productivity, coverage of unigrams/bigrams (Niven & Kao 2019)"
DESCRIPTION = (
    "Count Niven & Kao's (2019) cue statistics on ARCT (cues in the warrants, original and "
    "adversarial data) or RTE (cues in the hypothesis), per split and over all splits, for every unigram "
    "and bigram of lower-cased word tokens. Writes cues.csv, a figure and a run.json entry; prints the "
    "strongest cues (productivity above 0.5, sorted by coverage x productivity).")

def add_arguments(p):
    p.add_argument("--task", choices=("arct", "rte"), default="arct",
                   help="arct: cues in the warrants (original and adversarial data); rte: cues in the hypothesis "
                   "(default: arct)")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="folder of the annotated data sets (default: $BERTSCOPE_DATA, then the user data "
                   "folder, then ../shared/data; `bertscope data download` fills the user data folder)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="run directory; an existing run's directory gains the outputs (default: runs/<timestamp>)")
    p.add_argument("--top", type=positive_int, default=10, metavar="K",
                   help="strongest cues shown per table (default: 10)")
    p.add_argument("--min-n", type=positive_int, default=1, metavar="N",
                   help="cues.csv keeps cues applicable to at least N data points (default: 1, all)")
    p.add_argument("--expand-not", action="store_true",
                   help="read negated contractions as verb + 'not' (\"don't\" -> 'do not'), as a lemmatising "
                   "tokeniser would; by default \"don't\" is one token, different from 'not'")
    p.add_argument("--seed", type=int, default=0, help="seed of the RTE dev split (default: 0)")
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figure")
    add_quiet_argument(p)


def main(args) -> int:
    # reads the data first: a missing set fails early
    tables = cue_tables(args.task, args.data_dir, args.seed, args.expand_not)
    with AnalysisRun("cues", args) as run:
        write_cues(run, args, tables)
    return 0


def write_cues(run: AnalysisRun, args, tables: dict):
    run.write_csv(CUES_FILE, rows(args.task, tables, args.min_n), COLUMNS)
    results = {}
    for (data, split), cues in tables.items():
        top = strongest([c for c in cues if c.ngram == 1], top=args.top)
        results[f"{data}/{split}"] = {"n": cues[0].n if cues else 0,
                                      "top": [{"cue": c.cue, "productivity": round(c.productivity, 4),
                                               "coverage": round(c.coverage, 4)} for c in top]}
        if split == "all" or not getattr(args, "quiet", False):
            run.log(_table(f"{args.task} {data} {split}", cues, args.top))
    if not args.no_figures:
        run.save_figure(cue_figure(args.task, tables, args.top), CUES_FIGURE)
    run.finish(results)


def _table(title: str, cues: list[Cue], top: int) -> str:
    order = "productivity > 0.5, by coverage x productivity" if not cues or cues[0].label is None else \
        "productivity above the label's base rate, by coverage x (productivity - base rate)"
    lines = [f"{title}: n = {cues[0].n if cues else 0}; strongest cues ({order})",
             f"  {'cue':<18}{'applic.':>8}{'product.':>10}{'coverage':>10}"]
    for c in strongest(cues, top=top):
        label = "" if c.label is None else f"  -> label {c.label} (base rate {c.base_rate:.2f})"
        lines.append(f"  {c.cue:<18}{c.applicability:>8}{c.productivity:>10.3f}{c.coverage:>10.3f}{label}")
    return "\n".join(lines)


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, it reads annotated data, no
    model."""
    return {}
