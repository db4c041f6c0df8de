"""Induction heads in the report (Olsson et al. 2022)."""
from __future__ import annotations

from bertscope.analyses.heads.induction import paper
from bertscope.analyses.heads.induction.outputs import (
    ABLATION_FIGURE,
    ABLATION_FILE,
    INDUCTION_FILE,
    LOSS_FIGURE,
    PER_HEAD_FIGURE,
    SCORES_FIGURE,
)
from bertscope.report.page import RunFiles, Section, Table, num


def ablation_finding(k, a: dict) -> str:
    """One k of run.json's "ablation" results in words (the report's finding and the terminal's line)."""
    t, rnd = a["top"], a["random"]
    return (f"Top {k} induction heads zeroed ({t['heads']}): repeated-half loss {t['delta_loss_repeated']:+.3f}, "
            f"ICL score {t['icl_score']:+.3f}; {k} random other heads ({len(a['random_heads'])} draws): "
            f"{rnd['delta_loss_repeated']['mean']:+.3f} +- {rnd['delta_loss_repeated']['sd']:.3f}, ICL score "
            f"{rnd['icl_score']['mean']:+.3f}")


def rho_text(c: dict) -> str:
    """A Spearman correlation of run.json ({"spearman", "p", ...}) in words."""
    return "undefined" if c["spearman"] is None else f"{c['spearman']:+.3f} (p = {c['p']:.2g})"


def build(run: RunFiles) -> Section | None:
    """Induction, duplicate-token and previous-token heads, and the loss with heads zeroed
    (bertscope heads induction)."""
    heads = run.csv(INDUCTION_FILE)
    if not heads:
        return None
    r = (run.record["analyses"].get("induction") or {}).get("results") or {}
    findings = []
    if r:
        top = ", ".join(f"{t['head']} ({t['induction']:.2f})" for t in r["top_induction"][:5])
        findings.append(f"{r['sequences']} sequences of {r['length']} tokens (BOS {r['bos_token']!r}, then T = "
                        f"{r['seq_len']} random tokens twice). Highest induction scores (layer-head, mean attention "
                        f"to i - T + 1 over the repeated half): {top}; heads above 0.5: "
                        f"{r['heads_above_0.5']['induction']} induction, {r['heads_above_0.5']['duplicate']} "
                        f"duplicate-token, {r['heads_above_0.5']['previous']} previous-token.")
        loss = r["loss"]
        findings.append(f"Next-token loss as trained: first half {loss['first']:.3f}, repeated half "
                        f"{loss['repeated']:.3f}, ICL score {loss['icl_score']:+.3f} nats. Olsson et al.: "
                        f"{paper.OLSSON_TEXT['icl_score']} [{paper.OLSSON_INDUCTION.short}].")
        findings += [ablation_finding(k, a) + "." for k, a in r["ablation"].items()]
        c = (r.get("per_head") or {}).get("induction_vs_delta_repeated")
        if c:
            rho = rho_text(c)
            ph = r["per_head"]
            alone = ", ".join(f"{x['head']} {x['delta_loss_repeated']:+.3f} (rank {x['delta_rank']})"
                              for x in ph.get("top_induction_alone", []))
            largest = ", ".join(f"{x['head']} {x['delta_loss_repeated']:+.3f} (induction {x['induction']:.2f}, "
                                f"previous {x.get('previous', float('nan')):.2f})"
                                for x in ph["largest_delta_repeated"])
            findings.append(f"One head zeroed at a time ({ph['sequences']} sequences): Spearman rho of the induction "
                            f"score with the repeated-half loss change {rho} over {c['heads']} heads. The top "
                            f"induction heads alone: {alone}; median head {ph.get('median_delta_repeated', 0):+.3f}. "
                            f"Largest changes: {largest}.")
        findings.append(f"Olsson et al.: {paper.OLSSON_TEXT['ablation']} [{paper.OLSSON_INDUCTION.short}].")
    ablation = run.csv(ABLATION_FILE) or []
    tables = [Table("Heads zeroed (xi = 0): mean next-token loss on each half, the ICL score (repeated minus first) "
                    "and the changes against the model as trained",
                    ["ablation", "k", "draw", "heads", "loss first", "loss repeated", "ICL score", "delta repeated",
                     "delta ICL"],
                    [[a["ablation"], int(a["k"]), int(a["draw"]), a["heads"], num(a["loss_first"]),
                      num(a["loss_repeated"]), num(a["icl_score"]), num(a["delta_loss_repeated"]),
                      num(a["delta_icl"])] for a in ablation], digits=3)] if ablation else []
    figures = [run.figure(SCORES_FIGURE, "Per head, the mean attention of the repeated half's rows to the token "
                          "after the earlier copy (induction), to the earlier copy (duplicate token) and to the "
                          "previous token; cells above 0.3 give the value."),
               run.figure(LOSS_FIGURE, "Mean next-token loss at each target position, as trained and with heads "
                          "zeroed; the repeat starts at the grey line."),
               run.figure(ABLATION_FIGURE, "ICL score (loss on the repeated half minus the first half) with the top-k "
                          "induction heads zeroed (red) and k random other heads (blue: mean; dots: draws)."),
               run.figure(PER_HEAD_FIGURE, "Each head's induction score against the repeated-half loss change when "
                          "it alone is zeroed.")]
    return Section("Induction heads (Olsson et al. 2022)",
                   intro="Sequences of random tokens repeated once, with a BOS first. Scores are the mean attention of "
                   "the repeated half's rows at offsets -T+1, -T and -1 (TransformerLens's induction, duplicate-token "
                   "and previous-token heads), streamed as offset masses. Olsson et al.: "
                   + paper.OLSSON_TEXT["definition"] + ".",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
