"""The coreference probe in the report (Clark et al. section 4.3, Table 2)."""
from __future__ import annotations

from bertscope.analyses.probes.coref import paper
from bertscope.analyses.probes.coref.outputs import (
    BARS_FIGURE,
    HEADS_FIGURE,
    TABLE_FILE,
)
from bertscope.report.page import RunFiles, Section, Table, num

# datasets scored as Table 2 is (antecedent selection over every mention); GAP picks one of two names
TABLE2_DATASETS = {"gum"}


def build(run: RunFiles) -> Section | None:
    rows = run.csv(TABLE_FILE)
    if rows is None:
        return None
    ref = paper.COREF_TABLE2
    table_rows, findings = [], []
    for r in rows:
        t = r["type"]
        v = {k: num(r.get(k)) for k in ("accuracy", "overall_head_accuracy", "nearest", "head_match", "sieve")}
        comparable = r["dataset"] in TABLE2_DATASETS
        p = {k: ref[k][t].value if comparable and t in ref[k] else "" for k in ref}
        table_rows.append([r["dataset"], t, r["best_head"]] +
                          [100 * v[k] if v[k] is not None else "" for k in v] +
                          [p["head 5-4"], p["nearest"], p["head_match"], p["sieve"], int(r["n"] or 0)])
        if t == "All" and v["accuracy"] is not None:
            findings.append(f"{r['dataset']}: best head {r['best_head']} picks a correct antecedent "
                            f"{100 * v['accuracy']:.1f}% of the time (n = {r['n']})" +
                            (f", vs the paper's head 5-4 at {ref['head 5-4']['All'].value}% [{paper.TABLE2.where}]."
                             if comparable else "; no paper number: not Table 2's task."))
    figures = [run.figure(BARS_FIGURE, "Antecedent accuracy by mention type: the best head against the "
                          "baselines (nearest mention, head-word match, sieve)."),
               run.figure(HEADS_FIGURE, "Layer x head antecedent accuracy: where coreference is found.")]
    table = Table(f"Antecedent selection accuracy % beside {paper.TABLE2}",
                  ["dataset", "type", "best head", "accuracy", "All-best head acc", "nearest", "head match", "sieve",
                   "paper head 5-4", "paper nearest", "paper head match", "paper sieve", "n"], table_rows, digits=1)
    return Section("Coreference per head (Clark et al. 2019, section 4.3)",
                   intro="How often the head word of a coreferent mention attends most to the head of one of its "
                   "antecedents.", findings=findings, tables=[table], figures=[f for f in figures if f])
