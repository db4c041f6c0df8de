"""Attention gradients in the report (Clark et al. section 3)."""
from __future__ import annotations

from bertscope.analyses.heads.attention_grad import paper
from bertscope.analyses.heads.attention_grad.outputs import (
    HEADS_FIGURE,
    LAYERS_FIGURE,
    LAYERS_FILE,
)
from bertscope.report.page import RunFiles, Section, Table, num, pct


def build(run: RunFiles) -> Section | None:
    """Clark et al. section 3, Fig. 5: mean |dL/dP| per layer and key class, beside the attention
    (bertscope heads attention-grad)."""
    rows = run.csv(LAYERS_FILE)
    if not rows:
        return None
    entry = (run.record["analyses"].get("attention_grad") or {}).get("results") or {}
    classes = ("cls", "sep", "punct", "other")
    labels = {"cls": "[CLS]", "sep": "[SEP]", "punct": ". or ,", "other": "other"}
    by = {(int(r["layer"]), r["key_class"]): r for r in rows}
    layers = sorted({int(r["layer"]) for r in rows})
    objective = entry.get("objective", "?")
    data = (f"{entry.get('task')} {entry.get('split')}" if objective == "task" else entry.get("corpus", "?"))
    findings = [f"{objective} loss on {data}, {entry.get('inputs', '?')} inputs, mean loss "
                f"{num(entry.get('mean_loss')) or float('nan'):.3f}."]
    value = lambda lay, c, col: num(by[(lay, c)][col])  # noqa: E731  (None for NaN: a class without keys)
    ratio = lambda x: "-" if x is None else f"x{x:.2f}"  # noqa: E731
    for lay in layers:
        findings.append(f"Layer {lay}, attention and gradient relative to other tokens: " + "; ".join(
            f"{labels[c]} {pct(value(lay, c, 'attention') or 0)}, {ratio(value(lay, c, 'grad_vs_other'))}"
            for c in classes[:-1]) + ".")
    src = paper.CLARK_GRADIENT
    findings.append(f"Paper: {paper.CLARK_GRADIENT_TEXT} [{src.short}]."
                    + (" Clark used the masked-LM loss; a fine-tuned task loss reads one label through [CLS], so its "
                       "gradients say what the task needs, not what pre-training needs."
                       if objective == "task" else ""))
    sci = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731  (gradients span orders of magnitude)
    table = Table("Per layer: mean |d loss / d P_ij| over (query, key) pairs by the key's class (x other's), and "
                  "the mean attention mass a row puts on the class",
                  ["layer"] + [f"{labels[c]} |grad|" for c in classes] + [f"{labels[c]} / other" for c in classes[:-1]]
                  + [f"{labels[c]} attention" for c in classes],
                  [[lay] + [sci(value(lay, c, "mean_abs_grad")) for c in classes]
                   + [num(by[(lay, c)]["grad_vs_other"]) for c in classes[:-1]]
                   + [num(by[(lay, c)]["attention"]) for c in classes] for lay in layers], digits=3)
    figures = [run.figure(LAYERS_FIGURE, "Clark et al. Fig. 5: by layer, the attention mass on each key "
                          "class, the mean |gradient| of the loss with respect to an attention weight to it (log "
                          "scale), and that gradient relative to other tokens' (1 = as other tokens). A class with "
                          "much attention and a gradient far below 1 is attended to as a no-op."),
               run.figure(HEADS_FIGURE, "Per head, for [CLS], [SEP] and '. or ,': the attention "
                          "mass on the class (top) and log10 of its mean |gradient| over other tokens' (bottom; red: "
                          "smaller). A head with much attention on a class and a red cell below it uses that "
                          "class as a no-op.")]
    return Section("Attention gradients (Clark et al. 2019, section 3, Fig. 5)",
                   intro="How much the loss depends on each attention weight, by the kind of key: |dL/dP_ij| summed "
                   "inside backward (the maps are never kept), averaged per layer over heads and valid (query, key) "
                   "pairs; punctuation is the tokens '.' and ','.",
                   findings=findings, tables=[table], figures=[f for f in figures if f])
