"""Head importance and iterative pruning in the report (Michel et al. 2019)."""
from __future__ import annotations

import numpy as np

from bertscope import paper_numbers as paper
from bertscope.report_page import RunFiles, Section, Table, heads_str, num, pct


def build(run: RunFiles) -> Section | None:
    """Michel et al. section 4: head importance (bertscope heads importance, --compare) and
    iterative pruning (bertscope heads prune)."""
    probes = run.record.get("probes") or {}
    imp, pairs, prune = run.csv("importance.csv"), run.csv("importance_correlation.csv"), run.csv("prune.csv")
    if not (imp or pairs or prune):
        return None
    findings, tables, figures = [], [], []
    if imp:
        res = (probes.get("importance") or {}).get("results") or {}
        ranked = [f"{r['layer']}-{r['head']}" for r in sorted((r for r in imp if r["rank"]), key=lambda r: int(r["rank"]))]
        findings.append(f"{res.get('task', '?')} {res.get('split', '')}, {res.get('examples', '?')} examples, "
                        f"{res.get('convention', '?')} convention, mean loss {num(res.get('loss')) or float('nan'):.4f}: "
                        f"most important heads {heads_str(ranked[:5])}; least important {heads_str(ranked[-5:])}.")
        per_layer = res.get("raw_mean_per_layer")
        if per_layer:
            findings.append("Mean raw importance E|dL/dxi_h| per layer: "
                            + ", ".join(f"{i + 1}: {v:.4f}" for i, v in enumerate(per_layer)) + ".")
        figures.append(run.figure("fig_importance.png", "Head importance I_h = E_x |dL(x)/dxi_h| at xi = 1 (Michel et "
                                  "al. section 4), per layer L2-normalised unless --no-normalise; each cell shows the "
                                  "head's rank, 1 = the head whose masking the loss is most sensitive to (first order)."))
    if pairs:
        tables.append(Table("Rank correlation of head importance between runs (Spearman over the heads; raw: before the "
                            "per-layer normalisation; overlap: share of the top 10% heads in common)",
                            ["run A", "run B", "heads", "Spearman", "p", "Spearman (raw)", "top-10% overlap"],
                            [[r["label_a"], r["label_b"], int(r["n_heads"]), num(r["spearman"]), num(r["p"]),
                              num(r["spearman_raw"]), num(r["top_overlap"])] for r in pairs]))
        findings.append(f"Paper: {paper.MICHEL_IMPORTANCE_TEXT} [{paper.MICHEL_IMPORTANCE.short}]. Here the runs are "
                        "different fine-tuned models on different tasks, a stronger test than one model on two domains.")
        figures.append(run.figure("fig_importance_correlation.png", "Spearman rho of head importance between the runs "
                                  "compared: are the important heads the same across tasks?"))
    if prune:
        res = (probes.get("prune") or {}).get("results") or {}
        tol = num(res.get("tolerance")) or 0.01
        mine = [r for r in prune if r["order"] == "importance"]
        rnd = [r for r in prune if r["order"] == "random"]
        steps = [r["step"] for r in mine]
        rand_mean = {s: float(np.mean([num(r["accuracy"]) for r in rnd if r["step"] == s])) for s in steps} if rnd else {}
        tables.append(Table(f"Accuracy (%) on {res.get('split', 'test')} with the heads pruned; importance recomputed "
                            f"on {res.get('importance_split', 'dev')} at every step",
                            ["step", "% of heads pruned", "heads pruned", "by importance", "delta (points)",
                             "random, mean of seeds"],
                            [[int(r["step"]), 100 * num(r["fraction_pruned"]), int(r["heads_pruned"]),
                              100 * num(r["accuracy"]), 100 * num(r["delta"]),
                              100 * rand_mean[r["step"]] if rand_mean else "-"] for r in mine], digits=1))
        if res:
            rp = res.get("random_prunable_fraction") or []
            findings.append(f"{res.get('task')}: {pct(res.get('prunable_fraction', 0))} of the heads can be pruned by "
                            f"importance with every step within {100 * tol:g} point of the unpruned "
                            f"{pct(res.get('baseline_accuracy', 0))}"
                            + (f"; in a random order {pct(float(np.mean(rp)))} on average over {len(rp)} seeds" if rp
                               else "")
                            + f". Paper: {paper.MICHEL_PRUNING_TEXT} [{paper.MICHEL_PRUNING.short}].")
        figures.append(run.figure("fig_prune.png", "Iterative pruning (Michel et al. section 4): accuracy against the "
                                  "fraction of heads pruned (masked), by importance and in random orders (band: "
                                  "min-max over seeds); dotted: the baseline minus the tolerance."))
    return Section("Head importance and pruning (Michel et al. 2019)",
                   intro="Head importance is the first-order (Taylor) estimate of the loss change when a head is "
                   "masked, I_h = E_x |dL(x)/dxi_h|, from one forward and one backward per batch. Iterative pruning "
                   "masks the least important 10% of the original heads per step, recomputing importance on held-out "
                   "data each time.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
