"""What `bertscope relations` writes: tidy CSVs, heatmaps, example maps, text and run.json."""
from __future__ import annotations

import logging
import random

from bertscope.analyses.relations import stats as rel
from bertscope.models import model_name
from bertscope.report import refresh_report

logger = logging.getLogger(__name__)

HEAD_COLUMNS = ("data", "analysis", "group", "layer", "head", "score", "n", "rank", "flagged", "prev", "next",
                "prev_next_head")
SUMMARY_COLUMNS = ("data", "analysis", "group", "n", "mean", "p99", "flagged", "top", "top_k", "top_prev_next",
                   "n_flagged", "flagged_prev_next", "prev_next_heads", "rho_prev_next")
EXAMPLE_HEADS = 4  # heads drawn per example figure
UNITS = {"relations": "sentences", "tokens": "links"}


def tables(results: dict, analyses, names: list[str]):
    """{(analysis, data label): (LinkScores, prev, next, n_inputs)} per data set, plus the pooled
    'ewt+gum' when there are two."""
    out = {}
    for analysis in analyses:
        parts = [results[(analysis, name)] for name in names]
        for name, (scores, offsets, report, _, _) in zip(names, parts):
            out[(analysis, name)] = (scores, *rel.prev_next(offsets), report["inputs"])
        if len(names) > 1:
            scores = rel.pooled([p[0] for p in parts])
            offsets = rel.pooled([p[1] for p in parts])
            out[(analysis, "+".join(names))] = (scores, *rel.prev_next(offsets), sum(p[2]["inputs"] for p in parts))
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


def write_outputs(run, results: dict, analyses, names: list[str], args, loaded):
    from bertscope.analyses.relations import plots

    label = model_name(run.loaded.path)
    all_heads, summary, record = [], [], {"adjacent_mass": args.prev_next_mass, "percentile": rel.PERCENTILE}
    by_table = tables(results, analyses, names)
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
                 + ("predicate <-> core argument attention (UD, <= %d words, >= %d apart)" % (args.max_words,
                                                                                           args.min_distance)
                    if analysis == "relations" else "token-to-token attention (verb -> subject, pronoun -> antecedent)"))
        run.save_figure(plots.plot_heatmaps(scores.means(), scores.groups, scores.n, title, note, adjacent),
                        f"{analysis}_heatmap_{data.replace('+', '_')}.png")
    text = (f"bertscope relations: {label}, word-level maps (attention from a word = mean of its tokens' rows, "
            f"to a word = sum of its tokens' columns)\n" + format_summary(summary))
    logger.info(text.rstrip("\n"))
    run.write_text("relations_summary.txt", text)
    run.write_csv("relations_heads.csv", all_heads, HEAD_COLUMNS)
    run.write_csv("relations_summary.csv", summary, SUMMARY_COLUMNS)
    if not args.no_figures:
        for analysis in analyses:
            key = [k for k in by_table if k[0] == analysis][-1]  # the pooled table when there is one
            draw_example(run, loaded, analysis, results, names, by_table[key][0], args, label)
    run.finish(record)
    refresh_report(run.dir)


def draw_example(run, loaded, analysis: str, results: dict, names: list[str], scores, args, label: str):
    """One seeded random input's word maps for the top heads: the flagged ones of the first
    group, then the next best, `EXAMPLE_HEADS` in all; the gold links boxed."""
    from bertscope.analyses.relations import plots
    from bertscope.engine import iter_word_maps

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
    title = (f"{label}: word-level maps of the top heads for '{group}' on a random input "
             f"(red: gold {'predicate-argument links, both directions' if analysis == 'relations' else 'verb -> subject cells'})"
             f"\nmean score: " + ", ".join(f"{rel.head_label(*h)} {values[h]:.3f}" for h in heads))
    run.save_figure(plots.plot_example_maps(maps, segment.words, heads, pairs, title, both=analysis == "relations"),
                    f"{analysis}_examples.png")
