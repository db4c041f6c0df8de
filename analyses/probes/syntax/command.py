"""`bertscope probe syntax`: per-head dependency accuracy, Clark et al. (2019) Table 1.

Each treebank sentence is one input `[CLS] words [SEP]`, tokenized from its gold words
(`bertscope.text.word_segments.word_segment`); sentences longer than --max-len tokens are skipped and
counted. The word-level maps of every head (`bertscope.engine.loop.iter_word_maps`) are turned
into predicted heads and scored per relation by `bertscope.analyses.probes.syntax.stats`, where the
metric, the two directions, the baselines and the UD/SD label mapping are explained.

Treebanks: `ewt` is UD English-EWT dev (2,001 sentences, all used by default); `gum` is the
GUM corpus (8.9k sentences in 160 documents, a second domain mix), of which a seeded sample
of 3,000 sentences is used by default (`--limit all` for every one).
"""
from __future__ import annotations

import logging
import time

from bertscope.analyses.probes.syntax.outputs import (
    BEST_HEADS_FIGURE,
    HEAD_TO_DEP_MODES,
    HEADS_FILE,
    HEATMAPS_FIGURE,
    TABLE_FILE,
    TABLE_TEXT,
)
from bertscope.cli.args import add_common_arguments, limit_arg
from bertscope.data.paths import seeded_sample
from bertscope.data.readers.treebank import read_ewt_dev, read_gum
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

# numpy, torch and what imports them (the statistics, the figures, the engine, the model loader) are imported
# inside the functions that run the analysis: the command line imports this module to build the command's
# parser, so a mistyped option is refused at once, not after the seconds those imports take
# (tests/cli/test_new_user.py)


ENCODERS_ONLY = "its probe reads gold UD words aligned to an encoder's [CLS] words [SEP] input (Clark et al. section 4)"

logger = logging.getLogger(__name__)

NAME = "syntax"
HELP = "which heads track which dependency relation (Clark et al. 2019, Table 1)"
DESCRIPTION = (
    "Treat every head as a parser: a word's most-attended other word is its predicted head. "
    "Report per UD relation and direction (dependent -> head, head -> dependent) the best head "
    "next to the best fixed-offset baseline, on UD English-EWT dev and/or GUM.")
TREEBANKS = ("ewt", "gum")
DEFAULT_LIMITS = {"ewt": None, "gum": 3000}  # sentences; None = all


ALL_SENTENCES = 0  # --limit all


def limit_option(text: str) -> int:
    """--limit N or all, told apart from no --limit (each treebank's default)."""
    limit = limit_arg(text)
    return ALL_SENTENCES if limit is None else limit


def add_arguments(p):
    add_common_arguments(p)
    p.add_argument("--treebank", choices=("ewt", "gum", "both"), default="ewt",
                   help="UD English-EWT dev, GUM (a second domain mix), or both (default: ewt)")
    p.add_argument("--limit", type=limit_option, default=None, metavar="N|all",
                   help="sentences per treebank, a seeded sample (--seed) kept in file order "
                   "(default: all of EWT dev, 3000 of GUM's 8,917)")
    p.add_argument("--min-count", type=int, default=100, metavar="N",
                   help="relations with fewer dependents are left out of the printed table and the "
                   "figure, not the CSVs (default: 100)")
    p.add_argument("--head-to-dep", choices=HEAD_TO_DEP_MODES, default="column",
                   help="head->dependent direction: 'column' = the word attending most to the dependent "
                   "is its head (Clark et al.'s code: the transposed map); 'row' = the head word's "
                   "most-attended word is the dependent (default: column)")
    p.add_argument("--plain-poss", action="store_true",
                   help="score nmod:poss possessors by their own attention even when a clitic 's follows "
                   "(by default the 's word's prediction is used, as in Clark et al.'s code)")


def read_sentences(treebank: str, data_dir: str | None) -> list:
    if treebank == "ewt":
        return read_ewt_dev(data_dir)
    return [s for document in read_gum(data_dir) for s in document.sentences]


def probe_treebank(loaded, sentences: list, args, log, progress: bool, treebank: str):
    """Segments, word maps and counts for one treebank: (SyntaxCounts, report dict)."""
    from bertscope.analyses.probes.syntax import stats as syntax
    from bertscope.engine.loop import EngineOptions, fold, word_map_spec
    from bertscope.text.word_segments import word_segment

    t0 = time.perf_counter()
    segments, dependents, report = [], [], dict(sentences=len(sentences), skipped_long=0,
                                                no_dependents=0, used=0, words=0, dependents=0)
    for s in sentences:
        deps = syntax.sentence_dependents(s.heads, s.deprels, poss_clitic=not args.plain_poss)
        if len(deps[0]) == 0:
            report["no_dependents"] += 1
            continue
        segment = word_segment(s.words, loaded.tokenizer, args.max_len, doc_id=s.sent_id)
        if segment is None:
            report["skipped_long"] += 1
            continue
        segments.append(segment)
        dependents.append(deps)
        report["words"] += len(s.words)
        report["dependents"] += len(deps[0])
    report["used"] = len(segments)
    if not segments:
        raise UserError(f"{treebank}: no sentence fits --max-len {args.max_len}")
    log(f"{treebank}: {report['used']} of {report['sentences']} sentences, {report['dependents']} scored "
        f"dependents; {report['skipped_long']} skipped as longer than {args.max_len} tokens")

    relations = sorted({r for _, _, rels in dependents for r in rels})
    counts = syntax.SyntaxCounts(relations, loaded.n_layers, loaded.n_heads, head_to_dep=args.head_to_dep,
                                 dependents=dependents)
    fold(loaded, segments, word_map_spec(loaded), [counts], EngineOptions(batch_size=args.batch_size,
         backend=args.backend, progress=progress), from_word=args.from_word, desc=f"{treebank} word maps")
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    return counts, report


def headline(table_rows: list[dict], min_count: int) -> dict:
    """run.json summary: the 'all' row and each printed relation's better direction."""
    from bertscope.analyses.probes.syntax import stats as syntax

    rows = {}
    for row in table_rows:
        rows.setdefault(row["relation"], {})[row["direction"]] = row
    out = {}
    for relation, by_direction in rows.items():
        first = by_direction[syntax.DIRECTIONS[0]]
        if relation != syntax.ALL and first["n"] < min_count:
            continue
        best = max(syntax.DIRECTIONS, key=lambda d: by_direction[d]["accuracy"])
        out[relation] = {
            "n": first["n"],
            **{d: [by_direction[d]["best_head"], by_direction[d]["accuracy"]] for d in syntax.DIRECTIONS},
            "better": best,
            "baseline": [first["baseline_offset"], first["baseline_accuracy"]],
        }
    return out


def main(args) -> int:
    treebanks = TREEBANKS if args.treebank == "both" else (args.treebank,)
    if args.min_count < 0:
        raise UserError(f"--min-count must be at least 0, not {args.min_count}")
    data = {}
    for tb in treebanks:  # read the data first: a missing data set should not leave a run directory
        if args.limit is None:
            limit = DEFAULT_LIMITS[tb]
        else:
            limit = None if args.limit == ALL_SENTENCES else args.limit
        data[tb] = seeded_sample(read_sentences(tb, args.data_dir), limit, args.seed)
    with ModelRun(NAME, args, encoders_only=ENCODERS_ONLY) as run:
        probe(run, args, treebanks, data)
    return 0


def probe(run: ModelRun, args, treebanks: tuple[str, ...], data: dict):
    from bertscope.analyses.probes.syntax import plots
    from bertscope.analyses.probes.syntax import stats as syntax
    from bertscope.models.loading import model_name

    label = model_name(run.loaded.path)
    all_heads, all_table, texts, results = [], [], [], {"head_to_dep": args.head_to_dep,
                                                        "poss_clitic": not args.plain_poss,
                                             "from_word": args.from_word}
    for tb in treebanks:
        counts, report = probe_treebank(run.loaded, data[tb], args, run.log, run.progress, tb)
        head_rows, table_rows = syntax.summarise(counts, tb)
        all_heads += head_rows
        all_table += table_rows
        text = syntax.format_table(table_rows, args.min_count)
        header = (f"{tb}: {report['used']} sentences, {report['dependents']} dependents, "
                  f"{report['skipped_long']} skipped (> {args.max_len} tokens), model {label}, "
                  f"head->dep = {args.head_to_dep}\n")
        texts.append(header + text)
        logger.info(header + text)
        results[tb] = {**report, "relations": headline(table_rows, args.min_count)}
        run.save_figure(plots.plot_best_heads(table_rows, f"{label} on {tb.upper()}: best head per relation",
                                               args.min_count), BEST_HEADS_FIGURE.format(treebank=tb))
        run.save_figure(plots.plot_relation_heatmaps(head_rows, f"{label} on {tb.upper()}"),
                        HEATMAPS_FIGURE.format(treebank=tb))
    run.write_text(TABLE_TEXT, "\n".join(texts))
    run.write_csv(HEADS_FILE, all_heads,
                  ("treebank", "relation", "sd_label", "direction", "layer", "head", "accuracy", "n"))
    run.write_csv(TABLE_FILE, all_table,
                  ("treebank", "relation", "sd_label", "direction", "best_head", "accuracy",
                   "baseline_offset", "baseline_accuracy", "n"))
    run.finish(results)


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the word maps."""
    from bertscope.engine.loop import word_map_spec

    return {"word maps": word_map_spec(model)}
