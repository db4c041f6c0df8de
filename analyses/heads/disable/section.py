"""Disabled heads and layers in the report (Kovaleva et al. section 4.6)."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.heads.disable import paper
from bertscope.analyses.heads.disable.outputs import (
    DISABLE_FILE,
    HEADS_FIGURE,
    LAYERS_FIGURE,
)
from bertscope.report.page import RunFiles, Section, Table, heads_str, num, pct


def build(run: RunFiles) -> Section | None:
    """Kovaleva et al. 4.6: each head and each layer disabled (bertscope heads disable)."""
    rows = run.csv(DISABLE_FILE)
    entry = (run.record["analyses"].get("disable") or {}).get("results") or {}
    if rows is None or not rows:
        return None
    base = num(rows[0]["accuracy"])
    heads = [r for r in rows if r["kind"] == "head"]
    layers = [r for r in rows if r["kind"] == "layer"]
    pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    sig = [r["variant"] for r in rows[1:] if r["significant"] == "True"]
    findings = [f"{entry.get('task', '?')} {entry.get('split', '')}, {entry.get('examples', '?')} examples: baseline "
                f"accuracy {pct(base)}; significant changes (BH q < {entry.get('alpha', 0.05)}, exact McNemar): "
                f"{heads_str(sig)}."]
    if heads:
        deltas = [num(r["delta"]) for r in heads]
        best, worst = max(heads, key=lambda r: num(r["delta"])), min(heads, key=lambda r: num(r["delta"]))
        findings.append(f"Single heads: {sum(d > 0 for d in deltas)} of {len(deltas)} help, "
                        f"{sum(d < 0 for d in deltas)} hurt, mean {pts(float(np.mean(deltas)))} points; best "
                        f"{best['variant']} {pts(num(best['delta']))}, worst {worst['variant']} "
                        f"{pts(num(worst['delta']))}. Paper: {paper.DISABLE_TEXT['heads']} [{paper.DISABLE.short}].")
    if layers:
        first = layers[0]
        findings.append(f"Layer 1 disabled: {pts(num(first['delta']))} points, 95% CI [{pts(num(first['ci_low']))}, "
                        f"{pts(num(first['ci_high']))}], q = {num(first['q']):.3g}. Paper: "
                        f"{paper.DISABLE_TEXT['layers']} [{paper.DISABLE.short}].")
    table = Table("Whole layers disabled, and the 8 single heads that change accuracy most (points; exact "
                  "interval at level 1 - alpha, McNemar inverted; b / c = examples only the baseline / only "
                  "the variant gets right)",
                  ["variant", "accuracy %", "delta", "CI low", "CI high", "b", "c", "p", "q", "significant"],
                  [[r["variant"], 100 * num(r["accuracy"]), 100 * num(r["delta"]), 100 * num(r["ci_low"]),
                    100 * num(r["ci_high"]), int(r["b"]), int(r["c"]), num(r["p"]), num(r["q"]), r["significant"]]
                   for r in layers + sorted(heads, key=lambda r: -abs(num(r["delta"])))[:8]], digits=3)
    figures = [run.figure(HEADS_FIGURE, "Accuracy with one head disabled at a time (Kovaleva et al. "
                          "Fig. 8): colour centred on the baseline (orange on the colour bar), cells give the change "
                          "in points, framed cells are significant."),
               run.figure(LAYERS_FIGURE, "Accuracy with one whole layer disabled at a time (Fig. 9), "
                          "with exact intervals at level 1 - alpha (McNemar inverted); the orange line is the "
                          "baseline, * significant.")]
    return Section("Disabling heads and layers (Kovaleva et al. 2019, section 4.6)",
                   intro="A disabled head attends uniformly to every valid token (its output is the mean of V). "
                   "Each single head and each whole layer of the fine-tuned model is disabled in turn; the change "
                   "of accuracy is tested against the baseline on the same examples (paired).",
                   findings=findings, tables=[table], figures=[f for f in figures if f])
