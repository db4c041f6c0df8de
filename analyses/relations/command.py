"""`bertscope relations`: relation heads and token-to-token attention (Kovaleva et al. 2019, 4.2 and 4.5).

`--analysis relations`: UD English-EWT dev and GUM sentences of at most --max-words words,
each one input `[CLS] words [SEP]`; a head's score on a sentence is the largest word-level
attention, in either direction, between a predicate and one of its core arguments (gold
`nsubj`, `nsubj:pass`, `obj`, `iobj`, `obl` arcs whose words are --min-distance or more
apart), averaged over sentences, pooled and per relation (`bertscope.analyses.relations.stats`).

`--analysis tokens`: the directed attention from a verb to its subject (EWT dev and GUM
sentences) and from a pronoun to its noun antecedent (GUM gold coreference, within one
input: a window of whole sentences of at most --max-len tokens, or one sentence with
`--coref-scope sentence`), averaged over links; how many of the top heads are simply
previous/next-token heads comes from the surface statistics (offset -1/+1 mass) computed
in the same pass on the same inputs.

Every (analysis, data set) is one `engine.fold` into two accumulators (`LinkScores` and a
`HeadStats` of the offsets), checkpointed under `relations_state/`, so `--resume DIR`
continues an interrupted run and torchrun ranks split the batches and sum their states.
Only the example maps drawn in the figures are ever materialised.
"""
from __future__ import annotations

import argparse
import logging
import random
import time
from pathlib import Path

from bertscope.analyses.relations.outputs import (
    ADJACENT_MASS,
    EXAMPLES_FIGURE,
    HEAD_COLUMNS,
    HEADS_FILE,
    HEATMAP_FIGURE,
    MAX_WORDS,
    MIN_DISTANCE,
    SUMMARY_COLUMNS,
    SUMMARY_FILE,
    SUMMARY_TEXT,
)
from bertscope.cli.args import add_common_arguments, fraction, limit_arg, positive_int
from bertscope.data.paths import seeded_sample
from bertscope.data.readers.coref import coref_document
from bertscope.data.readers.treebank import read_ewt_dev, read_gum
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

# torch and what imports it (the statistics, the figures, the engine, the model loader) are imported inside
# the functions that run the analysis: the command line imports this module to build the command's parser, so
# a mistyped option is refused at once, not after the seconds those imports take (tests/cli/test_new_user.py)

ENCODERS_ONLY = "Kovaleva et al.'s relation heads are read on [CLS] ... [SEP] inputs of gold words (sections 4.2, 4.5)"

logger = logging.getLogger(__name__)

EXAMPLE_HEADS = 4  # heads drawn per example figure

NAME = "relations"
HELP = "relation heads and token-to-token attention (Kovaleva et al. 2019, sections 4.2 and 4.5)"
DESCRIPTION = (
    "Which heads attend between a predicate and its core arguments (gold UD arcs, short sentences: the "
    "relation-head experiment of Kovaleva et al. with UD in place of FrameNet), and which attend from a verb "
    "to its subject and from a pronoun to its noun antecedent (GUM coreference), and how many of those are "
    "plain previous/next-token heads.")
ANALYSES = ("relations", "tokens")
DATA = ("ewt", "gum")
STATE = "relations_state"
TOP_K = 10


def add_arguments(p):
    add_common_arguments(p)
    p.add_argument("--analysis", choices=ANALYSES + ("both",), default="both",
                   help="relation heads (4.2), token-to-token attention (4.5), or both (default: both)")
    p.add_argument("--data", choices=DATA + ("both",), default="both",
                   help="UD English-EWT dev, GUM, or both, reported apart and pooled (default: both)")
    p.add_argument("--limit", type=limit_arg, default=None, metavar="N|all",
                   help="inputs per analysis and data set, a seeded sample (--seed) of the qualifying ones "
                   "(default: all)")
    p.add_argument("--max-words", type=positive_int, default=MAX_WORDS, metavar="N",
                   help=f"relations: sentences of at most N words (default: {MAX_WORDS}, the paper's filter)")
    p.add_argument("--min-distance", type=positive_int, default=MIN_DISTANCE, metavar="N",
                   help=f"relations: links whose words are at least N words apart; tokens: the '_far' groups "
                   f"(default: {MIN_DISTANCE}, the paper's filter)")
    p.add_argument("--coref-scope", choices=("segment", "sentence"), default="segment",
                   help="tokens, GUM: an input is a window of whole sentences of at most --max-len tokens, or one "
                   "sentence; pronoun -> antecedent links must lie inside it (default: segment)")
    p.add_argument("--prev-next-mass", type=fraction, default=ADJACENT_MASS, metavar="X",
                   help="a previous/next-token head puts more than X of its attention on offset -1 or on +1, "
                   f"on average over every token of the inputs (default: {ADJACENT_MASS})")
    p.add_argument("--top", type=positive_int, default=TOP_K, metavar="K",
                   help=f"top heads listed and checked for previous/next-token behaviour (default: {TOP_K})")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")
    p.add_argument("--checkpoint-every", type=positive_int, default=20, help=argparse.SUPPRESS)  # tests


# --- inputs ----------------------------------------------------------------------------


def read_data(args) -> dict:
    """The data sets asked for: 'ewt' -> sentences, 'gum' -> treebank documents."""
    names = DATA if args.data == "both" else (args.data,)
    return {name: read_ewt_dev(args.data_dir) if name == "ewt" else read_gum(args.data_dir) for name in names}


def sentences_of(name: str, data) -> list:
    return data if name == "ewt" else [s for doc in data for s in doc.sentences]


def relation_inputs(sentences: list, tokenizer, args) -> tuple[list, list, dict]:
    """(segments, Links, report) of the sentences with a qualifying core-argument link, each
    with its control pairs (drawn with a generator seeded by --seed and the sentence id)."""
    from bertscope.analyses.relations import stats as rel
    from bertscope.text.word_segments import word_segment

    groups = relation_groups()
    segments, links, report = [], [], dict(sentences=len(sentences), too_many_words=0, no_link=0,
                                           too_long=0, inputs=0, links=0)
    for s in sentences:
        found = rel.relation_links(s.heads, s.deprels, args.max_words, args.min_distance)
        if found is None:
            report["too_many_words"] += 1
            continue
        if not found:
            report["no_link"] += 1
            continue
        segment = word_segment(s.words, tokenizer, args.max_len, doc_id=s.sent_id)
        if segment is None:
            report["too_long"] += 1
            continue
        segments.append(segment)
        control = rel.control_links(s.heads, s.upos, found, random.Random(f"{args.seed}:{s.sent_id}"),
                                    args.min_distance)
        links.append(rel.relation_input(found, groups, control))
        report["links"] += len(found)
    return segments, links, report


def token_inputs(name: str, data, tokenizer, args) -> tuple[list, list, dict]:
    """(segments, Links, report): verb -> subject in every EWT sentence or GUM input, and
    pronoun -> antecedent in GUM inputs (windows of whole sentences, or sentences)."""
    from bertscope.analyses.relations import stats as rel
    from bertscope.text.word_segments import split_words, word_segment

    segments, links, report = [], [], dict(inputs=0, too_long=0, no_link=0, verb_subject=0, pronoun_antecedent=0)

    def add(words, pairs, doc_id):
        if not any(pairs.values()):
            report["no_link"] += 1
            return
        segment = word_segment(words, tokenizer, args.max_len, doc_id=doc_id)
        if segment is None:
            report["too_long"] += 1
            return
        segments.append(segment)
        links.append(rel.token_input(pairs, args.min_distance))
        for kind, kind_pairs in pairs.items():
            report[kind] += len(kind_pairs)

    if name == "ewt":
        for s in data:
            add(s.words, {rel.VERB_SUBJECT: rel.verb_subject_links(s.heads, s.deprels, s.upos, offset=1)}, s.sent_id)
        return segments, links, report
    for doc in data:
        coref = coref_document(doc)
        deprels = [d for s in doc.sentences for d in s.deprels]
        starts = [start for start, _ in coref.sentence_spans]
        if args.coref_scope == "sentence":
            windows = list(coref.sentence_spans)
        else:
            windows = split_words(coref.words, tokenizer, args.max_len, boundaries=starts)
        for start, end in windows:
            window = coref.window(start, end)
            pairs = {rel.VERB_SUBJECT: rel.verb_subject_links(window.heads, deprels[start:end], window.upos),
                     rel.PRONOUN_ANTECEDENT: rel.pronoun_antecedent_links(window)}
            add(window.words, pairs, f"{doc.id}:{start}")
    return segments, links, report


def relation_groups() -> list[str]:
    from bertscope.analyses.relations import stats as rel

    return [rel.ALL, *rel.CORE, rel.CONTROL]


def groups_of(analysis: str) -> list[str]:
    from bertscope.analyses.relations import stats as rel

    return relation_groups() if analysis == "relations" else list(rel.TOKEN_GROUPS)


# --- the folds -------------------------------------------------------------------------


def offsets_spec(loaded):
    """What `rel.needs` asks of the kernels, with the model's key classes."""
    from bertscope.analyses.relations import stats as rel

    return rel.needs(loaded.classes.n_classes)


def state_paths(run_dir: Path, analysis: str, name: str, suffix: str) -> tuple[Path, Path]:
    folder = run_dir / STATE
    return folder / f"{analysis}-{name}{suffix}.scores.npz", folder / f"{analysis}-{name}{suffix}.offsets.npz"


def fold_inputs(loaded, analysis: str, name: str, segments: list, links: list, args, run_dir: Path, world,
                progress: bool):
    """(LinkScores, HeadStats) of one analysis on one data set, resumed from its checkpoint when
    --resume finds one (a pair that disagrees on the batches done is started again)."""
    from bertscope.analyses.relations import stats as rel
    from bertscope.engine.accumulate import HeadStats
    from bertscope.engine.loop import EngineOptions, fold

    spec = offsets_spec(loaded)
    unit = "sentence" if analysis == "relations" else "link"
    scores_path, offsets_path = state_paths(run_dir, analysis, name, world.suffix())
    scores = rel.LinkScores(groups_of(analysis), loaded.n_layers, loaded.n_heads, unit=unit, links=links)
    offsets = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    if args.resume and scores_path.exists() and offsets_path.exists():
        saved, saved_offsets = rel.LinkScores.load(scores_path, links), HeadStats.load(offsets_path)
        if saved.batches_done == saved_offsets.batches_done:
            scores, offsets = saved, saved_offsets
    scores_path.parent.mkdir(exist_ok=True)

    def checkpoint():
        offsets.save(offsets_path)
        scores.save(scores_path)

    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=progress,
                            checkpoint_every=args.checkpoint_every)
    fold(loaded, segments, spec, [scores, offsets], options, checkpoint=checkpoint, shard=(world.rank, world.size),
         from_word=args.from_word, desc=f"{analysis} {name}")
    return scores, offsets


def all_reduce(world, scores, offsets):
    """Every rank's sums into each rank's copies (torchrun)."""
    import torch
    import torch.distributed as dist

    from bertscope.engine.distributed import all_reduce_stats

    if world.size > 1:
        for array in (scores.sums, scores.n):
            t = torch.from_numpy(array)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place on the numpy buffer
    return scores, all_reduce_stats(world, offsets)


# --- the command -----------------------------------------------------------------------


def main(args) -> int:
    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, command="relations")
    analyses = ANALYSES if args.analysis == "both" else (args.analysis,)
    data = read_data(args)  # a missing data set should not leave a run directory
    with ModelRun(NAME, args, distributed=True, resumable=True, encoders_only=ENCODERS_ONLY) as run:
        measure(run, args, analyses, data)
    return 0


def measure(run: ModelRun, args, analyses: tuple[str, ...], data: dict):
    """`main` once the model has loaded (on every rank): each analysis on each data set, then the outputs."""
    loaded, run_dir, progress, log, world = run.loaded, run.dir, run.progress, run.log, run.world
    results = {}
    for analysis in analyses:
        for name, dataset in data.items():
            t0 = time.perf_counter()
            if analysis == "relations":
                segments, links, report = relation_inputs(sentences_of(name, dataset), loaded.tokenizer, args)
            else:
                segments, links, report = token_inputs(name, dataset, loaded.tokenizer, args)
            segments, links = sample_inputs(segments, links, args.limit, args.seed)
            report["inputs"] = len(segments)
            if not segments:
                raise UserError(f"{analysis}, {name}: no input qualifies")
            log(f"{analysis}, {name}: {len(segments)} inputs ({report})")
            scores, offsets = fold_inputs(loaded, analysis, name, segments, links, args, run_dir, world, progress)
            scores, offsets = all_reduce(world, scores, offsets)
            report["wall_s"] = round(time.perf_counter() - t0, 2)
            results[(analysis, name)] = (scores, offsets, report, segments, links)
    run.shutdown()
    if not world.is_main:
        return
    write_outputs(run, results, analyses, list(data), args, loaded)


def sample_inputs(segments: list, links: list, limit: int | None, seed: int) -> tuple[list, list]:
    """A seeded sample of `limit` inputs in their original order (all with None)."""
    kept = seeded_sample(list(zip(segments, links)), limit, seed)
    return [s for s, _ in kept], [lk for _, lk in kept]


def write_outputs(run, results: dict, analyses, names: list[str], args, loaded):
    from bertscope.analyses.relations import plots
    from bertscope.analyses.relations import stats as rel
    from bertscope.models.loading import model_name

    label = model_name(run.loaded.path)
    all_heads, summary, record = [], [], {"adjacent_mass": args.prev_next_mass, "percentile": rel.PERCENTILE}
    by_table = rel.tables(results, analyses, names)
    for (analysis, data), (scores, prev, next_, n_inputs) in by_table.items():
        all_heads += rel.head_rows(data, analysis, scores, prev, next_, args.prev_next_mass)
        rows = rel.summary_rows(data, analysis, scores, args.top, prev, next_, args.prev_next_mass)
        summary += rows
        entry = {"inputs": n_inputs, "groups": {r["group"]: {k: r[k] for k in SUMMARY_COLUMNS[3:]} for r in rows}}
        if data in names:
            entry.update(report=results[(analysis, data)][2])
        record.setdefault(analysis, {})[data] = entry
        adjacent = rel.adjacent_heads(prev, next_, args.prev_next_mass)
        note = (f"mean {'max weight over a sentence' if analysis == 'relations' else 'weight per link'}; red boxes: "
                f"above the 99th percentile of the {scores.n_layers * scores.n_heads} heads; white dots: previous/"
                f"next-token heads (mean offset -1 or +1 mass > {args.prev_next_mass})")
        title = (f"{label} on {data.upper()}: "
                 + ("predicate <-> core argument attention "
                    f"(UD, <= {args.max_words} words, >= {args.min_distance} apart)"
                    if analysis == "relations"
                    else "token-to-token attention (verb -> subject, pronoun -> antecedent)"))
        run.save_figure(plots.plot_heatmaps(scores.means(), scores.groups, scores.n, title, note, adjacent),
                        HEATMAP_FIGURE.format(analysis=analysis, data=data.replace("+", "_")))
    text = (f"bertscope relations: {label}, word-level maps (attention from a word = mean of its tokens' rows, "
            f"to a word = sum of its tokens' columns)\n" + rel.format_summary(summary))
    logger.info(text.rstrip("\n"))
    run.write_text(SUMMARY_TEXT, text)
    run.write_csv(HEADS_FILE, all_heads, HEAD_COLUMNS)
    run.write_csv(SUMMARY_FILE, summary, SUMMARY_COLUMNS)
    if not args.no_figures:
        for analysis in analyses:
            key = [k for k in by_table if k[0] == analysis][-1]  # the pooled table when there is one
            draw_example(run, loaded, analysis, results, names, by_table[key][0], args, label)
    run.finish(record)


def draw_example(run, loaded, analysis: str, results: dict, names: list[str], scores, args, label: str):
    """One seeded random input's word maps for the top heads: the flagged ones of the first
    group, then the next best, `EXAMPLE_HEADS` in all; the gold links boxed."""
    from bertscope.analyses.relations import plots
    from bertscope.analyses.relations import stats as rel
    from bertscope.engine.loop import iter_word_maps

    group = rel.ALL if analysis == "relations" else rel.VERB_SUBJECT + "_far"
    g = scores.groups.index(group)
    heads = rel.top_heads(scores.means()[g], EXAMPLE_HEADS)
    candidates = [(seg, links) for name in names for seg, links in zip(*results[(analysis, name)][3:5])
                  if (links.group == g).any() and seg.n_tokens <= 40]
    if not candidates:
        return
    segment, links = random.Random(args.seed).choice(candidates)
    _, maps = next(iter_word_maps(loaded, [segment], args.from_word, progress=False, backend=args.backend))
    pairs = sorted({(int(a), int(b)) for a, b, k in zip(links.src, links.dst, links.group) if k == g})
    values = scores.means()[g]
    cells = "predicate-argument links, both directions" if analysis == "relations" else "verb -> subject cells"
    title = (f"{label}: word-level maps of the top heads for '{group}' on a random input "
             f"(red: gold {cells})"
             f"\nmean score: " + ", ".join(f"{rel.head_label(*h)} {values[h]:.3f}" for h in heads))
    run.save_figure(plots.plot_example_maps(maps, segment.words, heads, pairs, title, both=analysis == "relations"),
                    EXAMPLES_FIGURE.format(analysis=analysis))


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the word maps and
    the offsets."""
    return {"word maps, offsets": offsets_spec(model)}
