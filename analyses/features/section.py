"""Attention to linguistic features in the report (Kovaleva et al. section 4.4)."""
from __future__ import annotations

from bertscope.analyses.features import paper
from bertscope.analyses.features.outputs import (
    CLS_LAST_LAYER_FIGURE,
    HEATMAP_FIGURE,
    LAYERS_FIGURE,
    SCORES_CSV,
)
from bertscope.report.page import RunFiles, Section, Table, num, pct

FEATURE_NAMES = {"cls": "[CLS]", "sep": "[SEP]", "noun": "nouns", "verb": "verbs", "pron": "pronouns",
                 "punct": "punctuation", "nsubj": "subjects", "obj": "objects", "neg": "negation"}


def feature_findings(rows: list[dict], uniform: dict) -> tuple[list[str], list[list]]:
    """Per data set: which feature wins each head, the strongest head of the specials and of
    the linguistic features, how often the most-attended token is [CLS] or [SEP], and the
    score uniform attention would give any token (`uniform`: data -> mean 1 / length)."""
    findings, table = [], []
    for data in dict.fromkeys(r["data"] for r in rows):
        mine = [r for r in rows if r["data"] == data]
        by_head: dict[tuple, dict] = {}
        for r in mine:
            by_head.setdefault((r["layer"], r["head"]), {})[r["feature"]] = num(r["score"])
        won = [max(scores, key=lambda f: scores[f]) for scores in by_head.values()]
        special = sum(w in ("cls", "sep") for w in won)
        best = {}
        for f in dict.fromkeys(r["feature"] for r in mine):
            fr = [r for r in mine if r["feature"] == f]
            top = max(fr, key=lambda r: num(r["score"]))
            share = sum(num(r["top_share"]) for r in fr) / len(fr)
            best[f] = num(top["score"])
            mean = sum(num(r["score"]) for r in fr) / len(fr)
            table.append([data, FEATURE_NAMES.get(f, f), int(top["n_inputs"]), mean,
                          f"{top['layer']}-{top['head']}", num(top["score"]), share])
        ling = {f: v for f, v in best.items() if f not in ("cls", "sep")}
        top_ling = max(ling, key=ling.get) if ling else None
        shares = [num(r["top_share"]) for r in mine if r["feature"] in ("cls", "sep")]
        n_heads = len(by_head)
        findings.append(
            f"{data}: in {special} of {n_heads} heads the highest-scoring feature is [CLS] or [SEP]; strongest "
            f"special-token head {max(best.get('cls', 0), best.get('sep', 0)):.2f}"
            + (f", strongest linguistic-feature head ({FEATURE_NAMES.get(top_ling, top_ling)}) {ling[top_ling]:.2f}"
               if top_ling else "")
            + f"; the most-attended token of an (input, head) is [CLS] or [SEP] in "
            f"{pct(sum(shares) / n_heads)} of them"
            + (f"; uniform attention would score any token {uniform[data]:.3f}." if data in uniform else "."))
    return findings, table


def build(run: RunFiles) -> Section | None:
    rows = run.csv(SCORES_CSV)
    if not rows:
        return None
    results = (run.record["analyses"].get("features") or {}).get("results") or {}
    uniform = {d: r["uniform_score"] for d, r in results.items() if "uniform_score" in r}
    findings, table_rows = feature_findings(rows, uniform)
    last = max(int(r["layer"]) for r in rows)
    for data in dict.fromkeys(r["data"] for r in rows):
        mean = {}
        for r in rows:
            if r["data"] == data and int(r["layer"]) == last:
                mean.setdefault(r["feature"], []).append(num(r["cls_mass"]))
        ranked = sorted(((sum(v) / len(v), f) for f, v in mean.items()), reverse=True)
        findings.append(f"{data}, layer {last} [CLS] row (Figure 7), mean over heads: "
                        + ", ".join(f"{FEATURE_NAMES.get(f, f)} {v:.2f}" for v, f in ranked[:4]) + ".")
    T = paper.FEATURES_TEXT
    findings.append(f"Paper [{paper.FEATURES.short}]: {T['stripes']}; {T['layers']}; {T['features']}; {T['cls_last']}.")
    table = Table("Per data set and feature: inputs with the feature, mean score over heads, the best head, and the "
                  "share of (input, head) pairs whose most-attended token is of the feature",
                  ["data", "feature", "inputs", "mean score", "best head", "best score", "top-token share"],
                  table_rows, shade={"mean score", "best score", "top-token share"})
    prefix, _, suffix = HEATMAP_FIGURE.partition("{data}")
    figures = [run.figure(n, f"Layer x head score per feature on {n[len(prefix):-len(suffix)].upper()} (Kovaleva et "
                          "al. Fig. 6): attention all tokens give to the feature's most-attended token, divided by "
                          "the input's length, averaged over inputs with the feature; one colour scale for all "
                          "panels, so linguistic features read against [CLS] and [SEP].")
               for n in run.figures(HEATMAP_FIGURE.format(data="*"))
               if n not in (CLS_LAST_LAYER_FIGURE, LAYERS_FIGURE)]
    figures += [run.figure(CLS_LAST_LAYER_FIGURE, "Last layer: the [CLS] row's attention on each "
                           "feature's tokens, per head (Kovaleva et al. Fig. 7), averaged over inputs with the "
                           "feature."),
                run.figure(LAYERS_FIGURE, "Mean score over the heads of each layer, per feature: "
                           "where in depth [CLS] and [SEP] take the attention.")]
    return Section("Attention to linguistic features (Kovaleva et al. 2019, section 4.4)",
                   intro="Does a head's vertical stripe fall on nouns, verbs, pronouns, subjects, objects, negation "
                   "or punctuation, or on [CLS] and [SEP]? Gold UPOS and UD relations on the treebanks; only "
                   "negation, punctuation and the special tokens on the task data.",
                   findings=findings, tables=[table], figures=[f for f in figures if f])
