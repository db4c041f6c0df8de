"""The syntax probe in the report (Clark et al. section 4.2, Table 1)."""
from __future__ import annotations

from bertscope.analyses.probes.syntax import paper
from bertscope.analyses.probes.syntax.outputs import (
    BEST_HEADS_FIGURE,
    HEATMAPS_FIGURE,
    TABLE_FILE,
)
from bertscope.report.page import RunFiles, Section, Table, num

BASELINE_MARGIN = 10  # points: a head this far above word position tracks the relation itself
MIN_WORDS = 20  # fewer scored words make a percentage too noisy for a finding


def build(run: RunFiles) -> Section | None:
    rows = run.csv(TABLE_FILE)
    if rows is None:
        return None
    best: dict[tuple[str, str], dict] = {}  # (treebank, relation) -> the better direction's row
    for r in rows:
        key = (r["treebank"], r["relation"])
        if num(r["accuracy"]) is not None and (key not in best or num(r["accuracy"]) > num(best[key]["accuracy"])):
            best[key] = r
    table_rows, findings = [], []
    for (tb, rel), r in best.items():
        ref = paper.SYNTAX_TABLE1.get("all" if rel == "all" else r.get("sd_label", ""))
        acc, base = 100 * num(r["accuracy"]), 100 * (num(r["baseline_accuracy"]) or 0)
        table_rows.append([tb, rel, r.get("sd_label", ""), r["direction"], r["best_head"], acc, base, int(r["n"]),
                           ref["best_head"] if ref else "", ref["accuracy"].value if ref else "",
                           ref["baseline"].value if ref else ""])
        if ref and rel != "all":
            findings.append(f"{tb}: {rel} ({r.get('sd_label')}) best head {r['best_head']} at {acc:.1f}% vs the "
                            f"paper's {ref['best_head']} at {ref['accuracy'].value}% [{paper.TABLE1.where}].")
    for tb in sorted({tb for tb, _ in best}):
        rels = [(rel, 100 * (num(r["accuracy"]) - (num(r["baseline_accuracy"]) or 0)))
                for (t, rel), r in best.items() if t == tb and rel != "all" and int(r["n"]) >= MIN_WORDS]
        above = sorted((x for x in rels if x[1] >= BASELINE_MARGIN), key=lambda x: -x[1])
        findings.insert(0, f"{tb}: {len(above)} of {len(rels)} relations (those with {MIN_WORDS}+ words) have a head "
                           f"at least {BASELINE_MARGIN} "
                        f"points above the best fixed-offset baseline: "
                        f"{', '.join(f'{rel} (+{d:.1f})' for rel, d in above[:6]) or 'none'}.")
    figures = [run.figure(n, "Best head per relation (bars) against the best fixed-offset baseline; a head well "
                          "above its baseline tracks that relation beyond word position.")
               for n in run.figures(BEST_HEADS_FIGURE.format(treebank="*"))]
    figures += [run.figure(n, "Layer x head accuracy per relation: where in the network each relation is found.")
                for n in run.figures(HEATMAPS_FIGURE.format(treebank="*"))]
    table = Table(f"Best head per relation, accuracy % (ours, better direction) beside {paper.TABLE1}",
                  ["treebank", "relation", "SD label", "direction", "head", "accuracy", "baseline", "n",
                   "paper head", "paper accuracy", "paper baseline"], table_rows, digits=1)
    return Section("Dependency syntax per head (Clark et al. 2019, section 4.2)",
                   intro="For every word, the word a head attends to most is its predicted syntactic head "
                   "(or dependent); accuracy per relation of the best head. Our data are UD (EWT, GUM), the "
                   "paper's PTB with Stanford Dependencies, so relations are matched by label.",
                   findings=findings[:8], tables=[table], figures=figures)
