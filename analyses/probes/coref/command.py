"""`bertscope probe coref`: coreference heads, Clark et al. (2019) section 4.3, Table 2.

GUM: every document is cut into segments `[CLS] words [SEP]` of at most --max-len tokens,
at sentence boundaries (`bertscope.text.word_segments.split_words`), from its gold words.
`--segments windows` (the default) uses every consecutive window, so the whole corpus is
scored; `--segments first` keeps only each document's first window, as the paper kept the
first 128 tokens of each CoNLL-2012 document. GUM has only 160 documents, so their first
windows hold under a tenth of its coreferent mentions: too few for stable per-type numbers
(proper names especially). Either way a mention is scored only when an antecedent lies in
the same segment. Each head's word argmaxes come from the engine in one pass
(`stream_batches`, the kernel's `word_argmax`), segments without a scored mention are not
run at all, and `bertscope.analyses.probes.coref.stats` scores them against the gold antecedents and
the baselines (where the definitions are explained).

GAP: each row's text is one input; its pronoun picks the name it attends to more.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from bertscope.analyses.probes.coref.outputs import (
    BARS_FIGURE,
    HEADS_FIGURE,
    HEADS_FILE,
    TABLE_FILE,
    TABLE_TEXT,
)
from bertscope.cli.args import add_common_arguments, positive_int
from bertscope.data.paths import dataset_dir, seeded_sample
from bertscope.data.readers.coref import coref_document
from bertscope.data.readers.gap import read_gap
from bertscope.data.readers.treebank import read_gum_document
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

if TYPE_CHECKING:
    from bertscope.analyses.probes.coref import stats as coref

# numpy, torch and what imports them (the statistics, the accumulators, the figures, the engine, the model
# loader) are imported inside the functions that run the analysis: the command line imports this module to
# build the command's parser, so a mistyped option is refused at once, not after the seconds those imports
# take (tests/cli/test_new_user.py)

ENCODERS_ONLY = ("its probe reads gold GUM / GAP words aligned to an encoder's [CLS] words [SEP] input (Clark et al. "
                 "section 4)")

logger = logging.getLogger(__name__)

NAME = "coref"
HELP = "which heads find coreferent antecedents (Clark et al. 2019, Table 2), on GUM and GAP"
DESCRIPTION = (
    "Treat every head as a coreference system: a mention's head word selects the word it attends "
    "to most. Report antecedent selection accuracy per mention type (pronoun, proper, nominal) on "
    "GUM next to the nearest-mention, head-match and rule-based sieve baselines, and on GAP how "
    "often a pronoun attends more to the right one of two names.")
DATASETS = ("gum", "gap")


def add_arguments(p):
    add_common_arguments(p)
    p.add_argument("--dataset", choices=("gum", "gap", "both"), default="both",
                   help="GUM antecedent selection, GAP pronoun-name pairs, or both (default: both)")
    p.add_argument("--segments", choices=("windows", "first"), default="windows",
                   help="GUM: every consecutive window of whole sentences (the whole corpus), or only "
                   "each document's first window, as the paper truncated documents (default: windows)")
    p.add_argument("--mention-head", choices=("ud", "last-flat"), default="ud",
                   help="GUM: a mention's head word is the word whose syntactic head lies outside it ('ud'), "
                   "or, for a flat/compound proper name, its last word ('last-flat': 'Obama' of 'Barack Obama', "
                   "as the Collins-style heads of the paper's CoNLL-2012 data) (default: ud)")
    p.add_argument("--limit-docs", type=positive_int, default=None, metavar="N",
                   help="GUM: a seeded sample (--seed) of N documents (default: all 160)")
    p.add_argument("--limit-gap", type=positive_int, default=None, metavar="N",
                   help="GAP: a seeded sample (--seed) of N rows, before skipping (default: all)")
    p.add_argument("--gap-split", choices=("development", "validation", "test"), default="development",
                   help="GAP split (default: development, 2,000 rows)")
    p.add_argument("--gap-name", choices=("sum", "first"), default="sum",
                   help="GAP: attention to a name is the sum over its words, or its first word's "
                   "(default: sum)")


# --- GUM ---------------------------------------------------------------------------------


def read_gum_documents(data_dir: str | None, limit: int | None, seed: int, mention_head: str = "ud") -> list:
    """(CorefDocument, xpos, feats) of the sampled GUM documents; xpos and feats are flat
    per-word lists in the document's word order (the coreference reader keeps neither)."""
    paths = seeded_sample(sorted(dataset_dir("gum", data_dir).glob("GUM_*.conllu")), limit, seed)
    out = []
    for path in paths:
        doc = read_gum_document(path)
        xpos = [x for s in doc.sentences for x in s.xpos]
        feats = [f for s in doc.sentences for f in s.feats]
        out.append((coref_document(doc, mention_head), xpos, feats))
    return out


class GumSegment:
    """One segment's scored mentions, with everything but the heads' choices precomputed."""

    def __init__(self, window, xpos, feats):
        import numpy as np

        from bertscope.analyses.probes.coref import stats as coref

        self.items = coref.anaphors(window)
        n_words = len(window.words)
        self.heads = np.array([a.head for a in self.items], dtype=np.int64)  # (M,)
        self.kinds = [a.kind for a in self.items]
        self.gold = coref.gold_matrix(self.items, n_words)  # (M, n_words)
        choices = coref.baseline_choices(window, self.items, xpos, feats)
        self.baseline_hits = {k: coref.choice_hits(v, self.gold) for k, v in choices.items()}


def gum_segments(documents: list, tokenizer, max_len: int, mode: str):
    """Segments and their scored mentions; report counts what was used and skipped."""
    from bertscope.text.word_segments import split_words, word_segment

    segments, scored = [], []
    report = dict(documents=len(documents), words=0, windows=0, windows_too_long=0, windows_without_anaphors=0,
                  segments=0, mentions=0, anaphoric_mentions=0, scored_mentions=0)
    for doc, xpos, feats in documents:
        report["words"] += len(doc.words)
        report["mentions"] += len(doc.mentions)
        report["anaphoric_mentions"] += len(doc.anaphoric())
        starts = [start for start, _ in doc.sentence_spans]
        windows = split_words(doc.words, tokenizer, max_len, boundaries=starts)
        if mode == "first":
            windows = windows[:1]
        for start, end in windows:
            report["windows"] += 1
            window = doc.window(start, end)
            segment = GumSegment(window, xpos[start:end], feats[start:end])
            if not segment.items:
                report["windows_without_anaphors"] += 1
                continue
            model_input = word_segment(window.words, tokenizer, max_len, doc_id=f"{doc.id}:{start}")
            if model_input is None:  # a single word longer than max_len
                report["windows_too_long"] += 1
                continue
            segments.append(model_input)
            scored.append(segment)
            report["scored_mentions"] += len(segment.items)
    report["segments"] = len(segments)
    return segments, scored, report


def probe_gum(loaded, documents: list, args, progress: bool) -> tuple[coref.Scores, dict]:
    from bertscope.analyses.probes.coref.scores import GumScores
    from bertscope.engine.loop import EngineOptions, fold, word_map_spec

    t0 = time.perf_counter()
    segments, scored, report = gum_segments(documents, loaded.tokenizer, args.max_len, args.segments)
    if not segments:
        raise UserError("gum: no segment holds a mention with an antecedent")
    scores = GumScores(loaded.n_layers, loaded.n_heads, scored)
    fold(loaded, segments, word_map_spec(loaded), [scores], EngineOptions(batch_size=args.batch_size,
         backend=args.backend, progress=progress), from_word=args.from_word, desc="gum word argmax")
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    return scores, report


# --- GAP ---------------------------------------------------------------------------------


def probe_gap(loaded, examples: list, args, progress: bool) -> tuple[coref.Scores, dict]:
    from bertscope.analyses.probes.coref.scores import GapScores
    from bertscope.engine.loop import EngineOptions, fold, word_map_spec
    from bertscope.text.word_segments import word_segment

    t0 = time.perf_counter()
    report = dict(rows=len(examples), skipped_neither=0, skipped_too_long=0, scored=0)
    segments, kept = [], []
    for ex in examples:
        if ex.label not in ("A", "B") or (ex.a_coref and ex.b_coref):
            report["skipped_neither"] += 1
            continue
        segment = word_segment(ex.words, loaded.tokenizer, args.max_len, doc_id=ex.id)
        if segment is None:
            report["skipped_too_long"] += 1
            continue
        segments.append(segment)
        kept.append(ex)
    report["scored"] = len(kept)
    scores = GapScores(loaded.n_layers, loaded.n_heads, kept, args.gap_name)
    if kept:
        fold(loaded, segments, word_map_spec(loaded), [scores], EngineOptions(batch_size=args.batch_size,
             backend=args.backend, progress=progress), from_word=args.from_word, desc="gap word maps")
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    return scores, report


# --- the command -------------------------------------------------------------------------


def main(args) -> int:
    datasets = DATASETS if args.dataset == "both" else (args.dataset,)
    data = {}  # read the data first: a missing data set should not leave a run directory
    if "gum" in datasets:
        data["gum"] = read_gum_documents(args.data_dir, args.limit_docs, args.seed, args.mention_head)
    if "gap" in datasets:
        data["gap"] = seeded_sample(read_gap(args.gap_split, args.data_dir), args.limit_gap, args.seed)

    with ModelRun(NAME, args, encoders_only=ENCODERS_ONLY) as run:
        probe(run, args, datasets, data)
    return 0


def probe(run: ModelRun, args, datasets: tuple[str, ...], data: dict):
    from bertscope.analyses.probes.coref import plots
    from bertscope.analyses.probes.coref import stats as coref
    from bertscope.models.loading import model_name

    label = model_name(run.loaded.path)
    head_rows, table_rows, results = [], [], {"from_word": args.from_word}
    notes = []
    if "gum" in datasets:
        scores, report = probe_gum(run.loaded, data["gum"], args, run.progress)
        head_rows += scores.head_rows("gum")
        rows = scores.table_rows("gum")
        table_rows += rows
        results["gum"] = {**report, "segments_mode": args.segments, "mention_head": args.mention_head, "table": rows}
        notes.append(f"gum: {report['documents']} documents, {report['segments']} segments ({args.segments}, "
                     f"<= {args.max_len} tokens), {report['scored_mentions']} scored mentions "
                     f"(of {report['anaphoric_mentions']} with an antecedent in their document); "
                     f"{report['windows_too_long']} windows skipped as too long")
    if "gap" in datasets:
        scores, report = probe_gap(run.loaded, data["gap"], args, run.progress)
        head_rows += scores.head_rows("gap")
        rows = scores.table_rows("gap")
        table_rows += rows
        results["gap"] = {**report, "split": args.gap_split, "name": args.gap_name, "table": rows}
        notes.append(f"gap ({args.gap_split}): {report['scored']} of {report['rows']} rows scored; skipped "
                     f"{report['skipped_neither']} with neither name correct, {report['skipped_too_long']} "
                     f"longer than {args.max_len} tokens; attention to a name = {args.gap_name} over its words")

    text = (f"Coreference heads of {label} (accuracy %, heads <layer>-<head> from 1; "
            f"'All-best head' = the best head on All, scored on each type)\n"
            + coref.format_table(table_rows) + "\n".join(notes) + "\n")
    logger.info(text.rstrip("\n"))
    run.write_text(TABLE_TEXT, text)
    run.write_csv(TABLE_FILE, table_rows, coref.TABLE_COLUMNS)
    run.write_csv(HEADS_FILE, head_rows, ("dataset", "mention_type", "layer", "head", "accuracy", "n"))
    if not args.no_figures:
        run.save_figure(plots.plot_bars(table_rows, f"{label}: coreference heads vs baselines"),
                        BARS_FIGURE)
        run.save_figure(plots.plot_heatmaps(head_rows, f"{label}: accuracy of every head"),
                        HEADS_FIGURE)
    run.finish(results)


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the word maps."""
    from bertscope.engine.loop import word_map_spec

    return {"word maps": word_map_spec(model)}
