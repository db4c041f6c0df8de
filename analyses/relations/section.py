"""Relation heads and token-to-token attention in the report (Kovaleva et al. 4.2 and 4.5)."""
from __future__ import annotations

from bertscope.analyses.relations import paper
from bertscope.analyses.relations.outputs import (
    EXAMPLES_FIGURE,
    HEATMAP_FIGURE,
    SUMMARY_FILE,
)
from bertscope.report.page import RunFiles, Section, Table, num

RELATION_FIGURES = (  # (analysis, caption) of the heatmaps
    ("relations", "Mean over sentences of each head's largest word-level attention between a "
     "predicate and one of its core arguments (gold UD nsubj, nsubj:pass, obj, iobj, obl; either direction), "
     "pooled ('all') and per relation (Kovaleva et al. Fig. 3, with UD in place of FrameNet). Red boxes: heads "
     "above the 99th percentile of all heads; white dots: previous/next-token heads."),
    ("tokens", "Mean directed word-level attention from a verb to its subject and from a pronoun "
     "to its nearest noun antecedent (GUM coreference), per link; '_far' keeps the links whose words are at "
     "least 2 apart. White dots mark previous/next-token heads (mean offset -1 or +1 mass > 0.5 on the same "
     "inputs): Kovaleva et al. section 4.5 found the top heads were mostly those."),
)


def build(run: RunFiles) -> Section | None:
    rows = run.csv(SUMMARY_FILE)
    if rows is None:
        return None
    record = (run.record["analyses"].get("relations") or {}).get("results") or {}
    pooled = max((r["data"] for r in rows), key=len)  # "ewt+gum" when both data sets ran
    table = Table("Per group: inputs (sentences for relations, links for tokens), the 99th percentile of the heads' "
                  "means, the heads above it, the top heads, and how many of the top heads are previous/next-token "
                  "heads", ["analysis", "data", "group", "n", "p99", "flagged", "top", "prev/next in top"],
                  [[r["analysis"], r["data"], r["group"], int(r["n"]), num(r["p99"]), r["flagged"],
                    " ".join(r["top"].split()[:5]), f"{r['top_prev_next']} of {r['top_k']}"] for r in rows])
    rh = paper.RELATION_HEADS
    findings = [f"Paper ({rh['sentences'].source}): {rh['flagged_heads'].value:.0f} of {rh['heads'].value:.0f} heads "
                f"above the 99th percentile, mean max weights {rh['flagged_scores'][0].value} and "
                f"{rh['flagged_scores'][1].value}. The 99th percentile of n <= 100 heads always leaves exactly one "
                "head above it (two for 101-200 heads), so the count itself says nothing; the values and ranks do.",
                f"Paper ({paper.KOVALEVA_45}): {paper.TOKEN_TO_TOKEN_TEXT}."]
    for r in rows:
        if r["data"] == pooled and r["group"] in ("all", "verb_subject", "verb_subject_far", "pronoun_antecedent"):
            findings.append(f"{r['analysis']} / {r['group']} on {pooled} (n = {r['n']}): flagged "
                            f"{r['flagged'] or 'none'}; {r['top_prev_next']} of the top {r['top_k']} heads are "
                            f"previous/next-token heads ({r['prev_next_heads']} such heads in the model on these "
                            "inputs); Spearman rho between the heads' scores and their previous/next mass "
                            f"{r.get('rho_prev_next', '?')}.")
    if record.get("adjacent_mass") is not None:
        findings.append(f"A previous/next-token head puts more than {record['adjacent_mass']} of its attention, on "
                        "average over every token of the same inputs, on offset -1 or on +1.")
    labels = [pooled] + sorted({r["data"] for r in rows} - {pooled})  # pooled first, then each data set
    figures = [run.figure(HEATMAP_FIGURE.format(analysis=analysis, data=data.replace("+", "_")),
                          caption + ("" if data == pooled else f" ({data} only.)"))
               for analysis, caption in RELATION_FIGURES for data in labels]
    figures += [run.figure(EXAMPLES_FIGURE.format(analysis="relations"),
                           "Word-level maps of the top relation heads on one random short "
                           "sentence; red boxes are its gold predicate-argument cells (both directions)."),
                run.figure(EXAMPLES_FIGURE.format(analysis="tokens"),
                           "Word-level maps of the top verb -> subject heads (links 2+ words "
                           "apart) on one random input; red boxes are the verb -> subject cells.")]
    return Section("Relation heads and token-to-token attention (Kovaleva et al. 2019, sections 4.2 and 4.5)",
                   intro="bertscope relations: word-level attention between gold-linked words, averaged per head; "
                   "UD core arguments stand in for FrameNet frame elements.", findings=findings, tables=[table],
                   figures=[f for f in figures if f])
