"""The probing classifiers in the report (Clark et al. section 5, Table 3)."""
from __future__ import annotations

from bertscope.analyses.probes.classifier import paper
from bertscope.analyses.probes.classifier.outputs import (
    HEAD_WEIGHTS_FIGURE,
    TABLE_FILE,
    TRAINING_FIGURE,
)
from bertscope.report.page import RunFiles, Section, Table, num


def build(run: RunFiles) -> Section | None:
    rows = run.csv(TABLE_FILE)
    if rows is None:
        return None
    ref = paper.CLASSIFIER_TABLE3
    table_rows = [[r["model"], num(r["uas"]), num(r["uas_with_punct"]),
                   ref[r["model"]].value if r["model"] in ref else ""] for r in rows]
    findings = [f"{r[0]}: UAS {r[1]:.1f} vs the paper's {r[3]} [{paper.TABLE3.where}]." for r in table_rows
                if r[1] is not None and r[3] != ""]
    figures = [run.figure(TRAINING_FIGURE, "Dev UAS by epoch for each probe: flat curves mean "
                          "training converged."),
               run.figure(HEAD_WEIGHTS_FIGURE, "Learned weight of each head (w: attention from "
                          "dependent to head, u: the reverse): the heads the attention-only probe relies on.")]
    return Section("Attention-based probing classifiers (Clark et al. 2019, section 5)",
                   intro="Dependency parsing from attention maps alone (Attn) and with GloVe word vectors.",
                   findings=findings, tables=[Table(f"UAS beside {paper.TABLE3}",
                                                    ["model", "UAS", "UAS with punct", "paper UAS"],
                                                    table_rows, digits=1)],
                   figures=[f for f in figures if f])
