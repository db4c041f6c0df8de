"""Iterative pruning in the report (Michel et al. 2019, section 4)."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.heads.prune import paper
from bertscope.analyses.heads.prune.outputs import FIGURE, PRUNE_FILE
from bertscope.report.page import RunFiles, Section, Table, num, pct


def build(run: RunFiles) -> Section | None:
    """Accuracy against the share of heads pruned, by importance and in random orders
    (bertscope heads prune)."""
    prune = run.csv(PRUNE_FILE)
    if not prune:
        return None
    probes = run.record["analyses"]
    findings, tables, figures = [], [], []
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
    figures.append(run.figure(FIGURE, "Iterative pruning (Michel et al. section 4): accuracy against the "
                              "fraction of heads pruned (masked), by importance and in random orders (band: "
                              "min-max over seeds); dotted: the baseline minus the tolerance."))
    return Section("Iterative pruning (Michel et al. 2019)",
                   intro="Iterative pruning masks the least important 10% of the original heads per step, "
                   "recomputing importance on held-out data each time, and evaluates each step on the test split.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
