"""Pattern types in the report (Kovaleva et al. section 4.1)."""
from __future__ import annotations

from bertscope.analyses.patterns import paper
from bertscope.analyses.patterns.outputs import (
    EXAMPLES_FIGURE,
    LAYERS_FIGURE,
    OVERALL_FIGURE,
    PATTERNS_FILE,
)
from bertscope.analyses.patterns.stats import TYPES
from bertscope.report.page import RunFiles, Section, Table, num


def build(run: RunFiles) -> Section | None:
    """Kovaleva et al. (2019) section 4.1: type proportions per data set beside the paper's statements."""
    rows = run.csv(PATTERNS_FILE)
    if rows is None:
        return None

    overall: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["scope"] == "all":
            overall.setdefault(r["data"], {})[r["type"]] = num(r["proportion"])
    ref = paper.PATTERNS
    table = Table(f"% of (example, head) maps per type, beside {paper.PATTERNS_SOURCE}",
                  ["data"] + list(TYPES) + ["paper Heterogeneous range"],
                  [[d] + [100 * (v.get(t) or 0.0) for t in TYPES]
                   + [f"{ref['heterogeneous_min'].value:.0f}-{ref['heterogeneous_max'].value:.0f}%"]
                   for d, v in overall.items()], digits=1)
    results = run.record["analyses"].get("patterns", {}).get("results", {})
    thresholds = results.get("thresholds", {})
    findings = [f"{d}: Heterogeneous {100 * v.get('Heterogeneous', 0):.1f}%, the first three types together "
                f"{100 * sum(v.get(t, 0) for t in TYPES[:3]):.1f}%, Block {100 * v.get('Block', 0):.1f}%."
                for d, v in overall.items()]
    findings.append(paper.PATTERNS_TEXT)
    rules = ", ".join(f"{k} {v}" for k, v in thresholds.items())
    findings.append("Not the paper's method: bertscope labels maps by rules on streamed statistics "
                    f"(thresholds: {rules}), not by a CNN trained on hand labels; model and data differ too.")
    figures = [run.figure(OVERALL_FIGURE, "Share of each pattern type among all (example, head) maps, one bar "
                          "per data set, stacked as the paper's Figure 2."),
               run.figure(LAYERS_FIGURE, "The same shares per layer: which layers hold which types.")]
    prefix, _, suffix = EXAMPLES_FIGURE.partition("{data}")
    figures += [run.figure(n, f"One real map per type from {n[len(prefix):-len(suffix)]}, the clearest "
                           "among the first segments (the paper's Figure 1); titles give the rule statistics.")
                for n in run.figures(EXAMPLES_FIGURE.format(data="*"))]
    return Section("Attention pattern types (Kovaleva et al. 2019, section 4.1)",
                   intro="Every (example, head) map is one of Vertical ([CLS]/[SEP]), Diagonal (previous/next "
                   "token), Vertical+Diagonal, Block (within the query's own part of a pair) or Heterogeneous.",
                   findings=findings, tables=[table], figures=[f for f in figures if f])
