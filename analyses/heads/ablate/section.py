"""Head ablation in the report (Michel et al. 2019)."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.heads.ablate import paper
from bertscope.analyses.heads.ablate.outputs import (
    ABLATE_FILE,
    BUT_ONE_FIGURE,
    BUT_ONE_FILE,
    HEADS_FIGURE,
    HISTOGRAM_FIGURE,
    IMPORTANCE_FIGURE,
)
from bertscope.report.page import RunFiles, Section, Table, heads_str, num, pct


def build(run: RunFiles) -> Section | None:
    """Michel et al. (2019): single heads masked, all heads of a layer but one, importance vs
    ablation (bertscope heads ablate)."""
    rows = run.csv(ABLATE_FILE)
    if not rows:
        return None
    entry = (run.record["analyses"].get("ablate") or {}).get("results") or {}
    pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    heads = [r for r in rows if r["kind"] == "head"]
    findings = [f"{entry.get('task', '?')} {entry.get('split', '')}, {entry.get('examples', '?')} examples: baseline "
                f"accuracy {pct(num(rows[0]['accuracy']))}; {len(rows) - 1} variants, BH over all of them."]
    if heads:
        deltas = np.array([num(r["delta"]) for r in heads])
        within = int(np.sum(np.abs(deltas) <= 0.005 + 1e-12))
        worst = min(heads, key=lambda r: num(r["delta"]))
        sig = [r["variant"] for r in heads if r["significant"] == "True"]
        findings.append(f"One head masked: {within} of {len(heads)} heads within 0.5 points of the baseline; mean "
                        f"{pts(float(deltas.mean()))}, worst {worst['variant']} {pts(num(worst['delta']))}; "
                        f"significant: {heads_str(sig)}. Paper: {paper.MICHEL_ABLATION_TEXT['single']} "
                        f"[{paper.MICHEL_ABLATION.short}].")
    table_rows = run.csv(BUT_ONE_FILE) or []
    tables = []
    if table_rows:
        enough = [r["layer"] for r in table_rows if num(r["delta"]) >= 0 or r["significant"] != "True"]
        findings.append(f"All heads but one: the best kept head alone is not significantly worse than the full model "
                        f"in {len(enough)} of {len(table_rows)} layers ({', '.join(enough) or 'none'}). Paper: "
                        f"{paper.MICHEL_ABLATION_TEXT['but_one']} [{paper.MICHEL_ABLATION.short}]. The best head is "
                        "picked on the evaluation data itself (as in the paper), so its delta is optimistic.")
        tables.append(Table("All heads of a layer masked but one: the best kept head per layer (Michel et al.'s "
                            "table), its change in points with its exact interval at level 1 - alpha (McNemar "
                            "inverted) and BH q; the worst kept head and the mean over kept heads; heads within = "
                            "kept heads within 0.5 points",
                            ["layer", "best head", "delta", "CI low", "CI high", "q", "worst head", "worst delta",
                             "mean delta", "heads within"],
                            [[r["layer"], r["best_head"], 100 * num(r["delta"]), 100 * num(r["ci_low"]),
                              100 * num(r["ci_high"]), num(r["q"]), r["worst_head"], 100 * num(r["worst_delta"]),
                              100 * num(r["mean_delta"]), int(r["heads_within"])] for r in table_rows], digits=2))
    corr = entry.get("importance")
    if corr:
        for column in ("importance", "importance_raw"):
            c = corr.get(column) or {}
            rho = "undefined (a constant side)" if c.get("spearman") is None else \
                f"{c['spearman']:+.3f} (p = {c['p']:.3g})"
            findings.append(f"Spearman rho between {column} ({corr['file']}) and the accuracy lost when the head is "
                            f"masked: {rho} over {c.get('heads', '?')} heads.")
    figures = [run.figure(HEADS_FIGURE, "Accuracy with one head masked (zero gate) at a time: colour centred "
                          "on the baseline, cells give the change in points, framed cells are significant."),
               run.figure(HISTOGRAM_FIGURE, "Distribution of the single-head changes (one bin per example "
                          "flipped); shaded: within 0.5 points, Michel et al.'s 'most heads'."),
               run.figure(BUT_ONE_FIGURE, "All heads of a layer masked but one: grey, every kept head; "
                          "purple, the best one with its 95% interval (label: its number)."),
               run.figure(IMPORTANCE_FIGURE, "Head importance (x) against the accuracy lost when the head "
                          "is masked (y), by layer; Spearman's rho in the title.")]
    return Section("Ablating heads (Michel et al. 2019)",
                   intro="A masked head's output is zeroed before the output projection (xi_h = 0). Each single head "
                   "is masked in turn, and in each layer every head but one; the change of accuracy is tested "
                   "against the unmasked model on the same examples (exact McNemar test and its interval, BH).",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
