"""Head importance and iterative pruning in the report (Michel et al. 2019)."""
from __future__ import annotations

from bertscope.analyses.heads.importance import paper
from bertscope.analyses.heads.importance.outputs import (
    CORRELATION_FIGURE,
    CORRELATION_FILE,
    FIGURE,
    IMPORTANCE_FILE,
)
from bertscope.report.page import RunFiles, Section, Table, heads_str, num


def build(run: RunFiles) -> Section | None:
    """Michel et al. section 4: head importance (bertscope heads importance, --compare)."""
    probes = run.record["analyses"]
    imp, pairs = run.csv(IMPORTANCE_FILE), run.csv(CORRELATION_FILE)
    if not (imp or pairs):
        return None
    findings, tables, figures = [], [], []
    if imp:
        res = (probes.get("importance") or {}).get("results") or {}
        ranked = [f"{r['layer']}-{r['head']}" for r in sorted((r for r in imp if r["rank"]),
                                                              key=lambda r: int(r["rank"]))]
        findings.append(f"{res.get('task', '?')} {res.get('split', '')}, {res.get('examples', '?')} examples, "
                        f"{res.get('convention', '?')} convention, mean loss "
                        f"{num(res.get('loss')) or float('nan'):.4f}: most important heads {heads_str(ranked[:5])}; "
                        f"least important {heads_str(ranked[-5:])}.")
        per_layer = res.get("raw_mean_per_layer")
        if per_layer:
            findings.append("Mean raw importance E|dL/dxi_h| per layer: "
                            + ", ".join(f"{i + 1}: {v:.4f}" for i, v in enumerate(per_layer)) + ".")
        figures.append(run.figure(FIGURE, "Head importance I_h = E_x |dL(x)/dxi_h| at xi = 1 (Michel et "
                                  "al. section 4), per layer L2-normalised unless --no-normalise; each cell shows the "
                                  "head's rank, 1 = the head whose masking the loss is most sensitive to "
                                  "(first order)."))
    if pairs:
        tables.append(Table("Rank correlation of head importance between runs (Spearman over the heads; raw: before "
                            "the per-layer normalisation; overlap: share of the top 10% heads in common)",
                            ["run A", "run B", "heads", "Spearman", "p", "Spearman (raw)", "top-10% overlap"],
                            [[r["label_a"], r["label_b"], int(r["n_heads"]), num(r["spearman"]), num(r["p"]),
                              num(r["spearman_raw"]), num(r["top_overlap"])] for r in pairs]))
        findings.append(f"Paper: {paper.MICHEL_IMPORTANCE_TEXT} [{paper.MICHEL_IMPORTANCE.short}]. Here the runs "
                        "are different fine-tuned models on different tasks, a stronger test than one model on two "
                        "domains.")
        figures.append(run.figure(CORRELATION_FIGURE, "Spearman rho of head importance between the runs "
                                  "compared: are the important heads the same across tasks?"))
    return Section("Head importance (Michel et al. 2019)",
                   intro="Head importance is the first-order (Taylor) estimate of the loss change when a head is "
                   "masked, I_h = E_x |dL(x)/dxi_h|, from one forward and one backward per batch.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
