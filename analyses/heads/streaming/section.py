"""Streaming and retrieval heads in the report (DuoAttention, Xiao et al. 2024)."""
from __future__ import annotations

from bertscope.analyses.heads.streaming import paper
from bertscope.analyses.heads.streaming.outputs import CURVE_FIGURE, CURVE_FILE, ERROR_FIGURE, HEADS_FILE
from bertscope.report.page import RunFiles, Section, Table, num


def curve_finding(r: dict) -> str:
    """run.json's results in words (the report's finding and the terminal's line)."""
    return (f"Streaming by lowest error, up to {r['no_loss_fraction']['error']:.0%} of the {r['groups']} key/value "
            f"groups stream with a loss change of at most {r['tolerance']} nats and no needle answer token lost "
            f"(random groups: {r['no_loss_fraction']['random']:.0%}); as trained: loss {r['loss']:.3f}, needle "
            f"token accuracy {r['needle_token_accuracy']:.2f}, needle accuracy {r['needle_accuracy']:.2f} over "
            f"{r['haystacks']} haystacks")


def build(run: RunFiles) -> Section | None:
    """Per-head streaming error and the loss / needle curve (bertscope heads streaming)."""
    heads = run.csv(HEADS_FILE)
    if not heads:
        return None
    r = (run.record["analyses"].get("streaming") or {}).get("results") or {}
    findings = []
    if r:
        low = ", ".join(f"{g['group']} ({g['error']:.3f})" for g in r["lowest_error"][:5])
        high = ", ".join(f"{g['group']} ({g['error']:.3f})" for g in r["highest_error"][:5])
        findings.append(f"Sink {r['sink']} + recent {r['recent']} tokens, {r['segments']} segments of up to "
                        f"{r['max_len']} tokens. Lowest error (layer-KV head): {low}; highest: {high}.")
        findings.append(curve_finding(r) + ".")
        findings.append(f"{paper.DUO}: {paper.DUO_TEXT['ratio']} [{paper.DUO_ATTENTION.short}].")
    curve = run.csv(CURVE_FILE) or []
    tables = [Table("Key/value groups streaming (sink + recent): mean next-token loss and the needle test",
                    ["order", "k", "fraction", "draw", "loss", "delta loss", "needle accuracy", "token accuracy"],
                    [[c["order"], int(c["k"]), num(c["fraction"]), int(c["draw"]), num(c["loss"]),
                      num(c["delta_loss"]), num(c["needle_accuracy"]), num(c["needle_token_accuracy"])]
                     for c in curve], digits=3)] if curve else []
    figures = [run.figure(ERROR_FIGURE, "Per head, ||o - o_L|| / ||o||: how far the head's output moves when it "
                          "sees only the sink and the recent window (0: not at all)."),
               run.figure(CURVE_FIGURE, "Loss change and needle accuracy as the key/value groups of lowest "
                          "streaming error are made streaming (red), against random groups (blue).")]
    return Section("Streaming and retrieval heads (DuoAttention, Xiao et al. 2024)",
                   intro="Each head's attention output o against o_L, its output over the first --sink and the last "
                   "--recent tokens only (StreamingLLM's attention sink + recent window), computed beside the "
                   "other statistics without an attention map; then heads made streaming in that order. "
                   + paper.DUO + ": " + paper.DUO_TEXT["definition"] + ".",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
