"""Retrieval heads in the report (Wu et al. 2024)."""
from __future__ import annotations

from bertscope.analyses.heads.retrieval import paper
from bertscope.analyses.heads.retrieval.outputs import (
    ABLATION_FIGURE,
    ABLATION_FILE,
    HEADS_FIGURE,
    HEADS_FILE,
    NAME,
    NEEDLE_FIGURE,
)
from bertscope.report.page import RunFiles, Section, Table, num


def build(run: RunFiles) -> Section | None:
    """Retrieval heads, the needle test over lengths and depths, and the test with heads zeroed
    (bertscope heads retrieval)."""
    heads = run.csv(HEADS_FILE)
    if not heads:
        return None
    r = (run.record["analyses"].get(NAME) or {}).get("results") or {}
    findings = []
    if r:
        acc = "; ".join(f"{length} tokens {a['copied']}/{a['cells']} (mean log-prob {a['answer_logprob']:.2f})"
                        for length, a in r["accuracy_by_length"].items())
        findings.append(f"{r['cells']} haystacks ({r['prompt']} prompt, needles {', '.join(r['needles'])}); the model "
                        f"copies the reference answer in {r['answered']}: {acc}.")
        top = ", ".join(f"{t['head']} ({t['score']:.2f}, {t['layer_kind']})" for t in r["top_heads"][:5])
        findings.append(f"Retrieval score above 0.1: {r['heads_above_0.1']} of {r['heads']} heads "
                        f"({r['fraction_above_0.1']:.1%}); highest ({r['ranked_by']}): {top}. Wu et al.: "
                        f"{paper.WU_TEXT['sparse']} [{paper.WU_RETRIEVAL.short}].")
        far = r["far"]
        if far["windowed_layers"]:
            where = ", ".join(f"{k} ({v})" for k, v in far["layers"].items()) or "none"
            findings.append(f"Heads that retrieve from more than {far['tokens']} tokens back "
                            f"({far.get('over', 'answered')}): "
                            f"{' '.join(far['heads']) or 'none'}; their layers: {where}. "
                            + ("Every one is a global layer, as the sliding windows require."
                               if far["all_global"] else "Some are not global layers: see the layer kinds."))
        for k, a in (r.get("ablation") or {}).get("by_k", {}).items():
            scoring = a.get("top_scoring", int(k))
            ties = "" if scoring >= int(k) else f", of which only {scoring} score above 0 (the rest: ties at 0)"
            findings.append(f"Top {k} retrieval heads zeroed ({a['top']['heads']}{ties}): "
                            f"{a['top']['accuracy']:.0%} copied, "
                            f"mean answer log-prob {a['top']['answer_logprob']:.2f}; {k} random heads "
                            f"({len(a['random_heads'])} draws): {a['random']['accuracy']:.0%}, "
                            f"{a['random']['answer_logprob']:.2f} (as trained: "
                            f"{r['ablation']['none']['accuracy']:.0%}, {r['ablation']['none']['answer_logprob']:.2f}).")
        if r.get("ablation"):
            findings.append(f"Wu et al.: {paper.WU_TEXT['masking']} [{paper.WU_RETRIEVAL.short}].")
    ablation = run.csv(ABLATION_FILE) or []
    ranked = sorted(heads, key=lambda h: int(h["rank"]))[:10]
    tables = [Table("The ten highest retrieval scores", ["layer", "head", "layer kind", "score", "answered",
                                                         "score (all)", "far score"],
                    [[int(h["layer"]), int(h["head"]), h["layer_kind"], num(h["score"]), int(h["n_answered"]),
                      num(h["score_all"]), num(h["far_score"])] for h in ranked], digits=3)]
    if ablation:
        tables.append(Table("The needle test with heads zeroed (xi = 0)",
                            ["ablation", "k", "draw", "heads", "haystacks", "copied", "token accuracy", "log-prob",
                             "delta log-prob"],
                            [[a["ablation"], int(a["k"]), int(a["draw"]), a["heads"], int(a["cells"]),
                              num(a["accuracy"]), num(a["token_accuracy"]), num(a["answer_logprob"]),
                              num(a["delta_logprob"])] for a in ablation], digits=3))
    figures = [run.figure(NEEDLE_FIGURE, "Needle in a haystack: whether the model copies the reference answer "
                          "(green) at each depth and length, with the answer's log-probability."),
               run.figure(HEADS_FIGURE, "Retrieval score per head: the mean over answered haystacks of the "
                          "fraction of the needle's tokens the head's most-attended key copies."),
               run.figure(ABLATION_FIGURE, "The needle test with the top-k retrieval heads zeroed (red) against k "
                          "random heads (blue).")]
    return Section("Retrieval heads (Wu et al. 2024)",
                   intro="Needle-in-a-haystack inputs run teacher forced, one forward pass each: at each answer row "
                   "a head scores when its most-attended key (the kernels' row argmax) lies in the needle and holds "
                   "the token the row must produce. Wu et al.: " + paper.WU_TEXT["definition"] + ".",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
