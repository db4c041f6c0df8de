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
    if "perplexity" in prune[0]:
        return build_lm(run, prune)
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


def build_lm(run: RunFiles, prune: list[dict]) -> Section:
    """`heads prune --task lm`: perplexity on held-out text against the share of heads pruned."""
    res = ((run.record["analyses"].get("prune") or {}).get("results")) or {}
    mine = [r for r in prune if r["order"] == "importance"]
    rnd = [r for r in prune if r["order"] == "random"]

    def random_cells(step):
        got = [num(r["perplexity"]) for r in rnd if r["step"] == step]
        if not got:
            return ["-", "-"]
        return [float(np.exp(np.mean(np.log(got)))), f"{min(got):.2f}-{max(got):.2f}"]
    tables = [Table(f"Perplexity on {res.get('eval_segments', '?')} held-out {res.get('corpus', '')} segments with the "
                    f"query heads pruned (gated to 0); importance recomputed on {res.get('importance_segments', '?')} "
                    "other segments at every step",
                    ["step", "% of heads pruned", "heads pruned", "by importance", "x unpruned",
                     "random, geometric mean", "random, min-max"],
                    [[int(r["step"]), 100 * num(r["fraction_pruned"]), int(r["heads_pruned"]), num(r["perplexity"]),
                      num(r["perplexity_ratio"]), *random_cells(r["step"])] for r in mine], digits=2)]
    findings = []
    if res:
        findings.append(f"Unpruned perplexity {num(res.get('baseline_perplexity')) or float('nan'):.2f}; most "
                        f"important heads of the unpruned model {', '.join(res.get('top_heads_unpruned') or [])}. "
                        f"Paper (a classifier's accuracy, not a language model's perplexity): "
                        f"{paper.MICHEL_PRUNING_TEXT} [{paper.MICHEL_PRUNING.short}].")
    figures = [run.figure(FIGURE, "Iterative pruning with the language-modelling loss (Michel et al. section 4): "
                          "perplexity on held-out text (log scale) against the fraction of query heads pruned "
                          "(gated to 0), by importance recomputed at every step and in seeded random orders.")]
    return Section("Iterative pruning of a language model (Michel et al. 2019)",
                   intro="Iterative pruning masks the least important 10% of the original query heads per step, "
                   "importance E|dL/dxi_h| recomputed with the next-token loss at each step, and measures perplexity "
                   "on held-out segments.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
