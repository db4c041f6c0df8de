"""Dataset cues in the report (Niven & Kao 2019)."""
from __future__ import annotations

from bertscope.analyses.cues import paper
from bertscope.analyses.cues.outputs import CUES_FIGURE, CUES_FILE
from bertscope.report.page import RunFiles, Section, Table, num


def build(run: RunFiles) -> Section | None:
    rows = run.csv(CUES_FILE)
    if rows is None:
        return None
    task = rows[0]["task"] if rows else ""
    findings, tables = [], []
    for data, split in (("original", "all"), ("original", "test"), ("adversarial", "test")):
        sel = [r for r in rows if r["data"] == data and r["split"] == split and r["ngram"] == "1"
               and num(r["productivity"]) > (num(r["base_rate"]) if r["base_rate"] else 0.5)]
        sel = sorted(sel, key=lambda r: (-num(r["strength"]), r["cue"]))[:8]
        if not sel and not any(r["data"] == data and r["split"] == split for r in rows):
            continue
        tables.append(Table(f"{task.upper()} {data}, {split}: strongest unigram cues above chance",
                            ["cue", "applicability", "productivity", "coverage", "n"],
                            [[r["cue"], int(r["applicability"]), num(r["productivity"]), num(r["coverage"]),
                              int(r["n"])] for r in sel]))
    not_all = next((r for r in rows if r["cue"] == "not" and r["data"] == "original" and r["split"] == "all"), None)
    if task == "arct" and not_all:
        ref = paper.NOT_CUE
        settings = run.record["analyses"].get("cues", {}).get("settings", {})
        expand = " (negated contractions read as 'not': --expand-not)" if settings.get("expand_not") else \
            " (\"don't\" and other contractions are tokens of their own here)"
        findings.append(f"\"not\" over all splits: productivity {num(not_all['productivity']):.2f}, coverage "
                        f"{num(not_all['coverage']):.2f}; {paper.NIVEN} report {ref['productivity'].value} and "
                        f"{ref['coverage'].value} [{paper.CUES.where}]{expand}.")
    adversarial = [num(r["productivity"]) for r in rows if r["data"] == "adversarial" and r["split"] == "test"]
    if adversarial:
        findings.append(f"Adversarial test set: every cue's productivity lies in [{min(adversarial):.2f}, "
                        f"{max(adversarial):.2f}] (0.5 = no signal).")
    figures = [run.figure(CUES_FIGURE, "Each dot is a unigram cue: coverage (share of data points where it occurs in "
                          "one warrant only, or in the hypothesis for RTE) against productivity (how often it points "
                          "to the right answer). Red: the strongest cues above chance.")]
    return Section(f"Dataset cues (Niven & Kao 2019), {task.upper()}",
                   intro="Unigram and bigram cues of lower-cased word tokens; every cue is in cues.csv.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
