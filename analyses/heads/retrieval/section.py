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
    ranked_score,
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
    greedy = r.get("answer") == "greedy"
    windowed = any(h["layer_kind"] != "global" for h in heads)  # else every layer's kind says "global"
    if r:
        haystacks = f"{r['cells']} haystacks ({r['prompt']} prompt, needles {', '.join(r['needles'])})"
        if greedy:  # the teacher-forced answer is the model's own: counted by its word recall of the reference
            acc = "; ".join(f"{length} tokens {a['copied']}/{a['cells']} (mean recall {a['recall']:.2f})"
                            for length, a in r["accuracy_by_length"].items())
            findings.append(f"{haystacks}, each answered in the model's own words (--answer greedy): its answer "
                            "recalls more than half of the reference answer's words (Wu et al.'s criterion) in "
                            f"{r['answered']}: {acc}.")
        else:
            acc = "; ".join(f"{length} tokens {a['copied']}/{a['cells']} (mean log-prob {a['answer_logprob']:.2f})"
                            for length, a in r["accuracy_by_length"].items())
            findings.append(f"{haystacks}; the model copies the reference answer in {r['answered']}: {acc}.")
        top = ", ".join(f"{t['head']} ({ranked_score(t, r):.2f}" + (f", {t['layer_kind']})" if windowed else ")")
                        for t in r["top_heads"][:5]) or "none scores above 0"
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
    by = "score" if int(heads[0]["n_answered"]) else "score_all"  # the ranking's score
    ranked = [h for h in sorted(heads, key=lambda h: int(h["rank"])) if float(h[by]) > 0][:10]  # those that score
    tables = []
    if ranked:
        kind = lambda h: [h["layer_kind"]] if windowed else []  # noqa: E731
        tables.append(Table("The highest retrieval scores (at most ten; heads that score above 0)",
                            ["layer", "head", *(["layer kind"] if windowed else []), "score", "answered",
                             "score (all)", "far score"],
                            [[int(h["layer"]), int(h["head"]), *kind(h), num(h["score"]), int(h["n_answered"]),
                              num(h["score_all"]), num(h["far_score"])] for h in ranked], digits=3))
    if ablation:
        tables.append(Table("The needle test with heads zeroed (xi = 0)",
                            ["ablation", "k", "draw", "heads", "haystacks", "copied", "token accuracy", "log-prob",
                             "delta log-prob"],
                            [[a["ablation"], int(a["k"]), int(a["draw"]), a["heads"], int(a["cells"]),
                              num(a["accuracy"]), num(a["token_accuracy"]), num(a["answer_logprob"]),
                              num(a["delta_logprob"])] for a in ablation], digits=3))
    needle = ("Needle in a haystack at each depth and length, answered in the model's own words (--answer "
              "greedy): the word recall of the reference answer by the model's greedy answer (color and value), "
              "and a star where the haystack counts as answered (recall above 0.5)." if greedy else
              "Needle in a haystack at each depth and length: the fraction of the answer's tokens the model "
              "predicts (color), the answer's log-probability, and a star where it copies the whole answer.")
    figures = [run.figure(NEEDLE_FIGURE, needle),
               run.figure(HEADS_FIGURE, "Retrieval score per head: the mean over answered haystacks of the "
                          "fraction of the needle's tokens the head's most-attended key copies."),
               run.figure(ABLATION_FIGURE, "The needle test with the top-k retrieval heads zeroed (red) against k "
                          "random heads (blue).")]
    return Section("Retrieval heads (Wu et al. 2024)",
                   intro="Needle-in-a-haystack inputs run teacher forced, one forward pass each: at each answer row "
                   "a head scores when its most-attended key (the kernels' row argmax) lies in the needle and holds "
                   "the token the row must produce. Wu et al.: " + paper.WU_TEXT["definition"] + ".",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
