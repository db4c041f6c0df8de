"""Attention sinks in the report (`bertscope sinks`)."""
from __future__ import annotations

from bertscope.analyses.sinks import paper
from bertscope.analyses.sinks.outputs import (
    HEADS_FIGURE,
    LAYERS_FIGURE,
    LAYERS_FILE,
    MASSIVE_FIGURE,
    POSITIONS_FIGURE,
)
from bertscope.report.page import RunFiles, Section, Table, num


def _pct(x) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def build(run: RunFiles) -> Section | None:
    rows = run.csv(LAYERS_FILE)
    entry = run.record.get("analyses", {}).get("sinks", {})
    results = entry.get("results") or {}
    if rows is None or not results:
        return None
    eps = results.get("epsilon", 0.3)
    T = results.get("gu_length", 64)
    variants = results.get("variants", {})
    table = Table(f"Sink^{eps:g}_1 (share of heads with alpha_1 > {eps:g}) beside {paper.GU_TABLE1.short}",
                  ["first token", "segments", f"per segment, first {T} queries (Gu et al.'s T)",
                   "per segment, every query", "pooled alpha_1", "paper (7-13B models)"],
                  [[name, r["segments"], "n/a (bidirectional)" if name == "cls" else _pct(r.get("sink_metric_64")),
                    _pct(r.get("sink_metric")),
                    _pct(r.get("pooled_metric")),
                    ", ".join(f"{k} {v.value:.1f}%" for k, v in paper.GU_SINK.items())]
                   for name, r in variants.items()])
    layer_table = Table("Per layer, mean over heads (w: sliding-window layer)",
                        ["first token", "layer", "attention", "alpha_1", "first-token mass", "sink heads",
                         "max |h| first / median"],
                        [[r["bos"], int(r["layer"]), r["attention"], num(r["alpha_1"]), num(r["first_mass"]),
                          int(r["sink_heads"]), num(r.get("first_max_over_median") or "")] for r in rows],
                        digits=3, shade={"alpha_1", "first-token mass"})
    findings = []
    for name, r in variants.items():
        by_layer = r.get("first_mass_by_layer", [])
        gu = "" if name == "cls" else (f"{_pct(r.get('sink_metric_64'))} over the first {T} queries of "
                                       f"{r.get('segments_64')} segments, ")
        findings.append(f"[{name}] Sink^{eps:g}_1 = {gu}{_pct(r.get('sink_metric'))} over every query; the "
                        "first-token mass by layer runs " + ", ".join(f"{x:.2f}" for x in by_layer) + ".")
        if "windowed" in r:
            w, g = r["windowed"], r.get("global") or {}
            findings.append(f"[{name}] Sliding-window layers {w['layers']}: alpha_1 {w['alpha_1']:.3f} over the "
                            f"queries that see the first token, first-token mass {w['first_mass']:.3f} over all; "
                            f"{_pct(w['unseeing_share'])} of their queries cannot see it and put "
                            f"{w['unseeing_edge']:.4f} on the oldest key of their window and "
                            f"{w.get('unseeing_punct', float('nan')):.3f} on '.' and ',' (their entropy: "
                            f"{w.get('unseeing_entropy', float('nan')):.2f} nats). Global layers "
                            f"{g.get('layers')}: alpha_1 {g.get('alpha_1', float('nan')):.3f}, first-token mass "
                            f"{g.get('first_mass', float('nan')):.3f}.")
        if "massive" in r:
            m = r["massive"]
            findings.append(f"[{name}] Massive activations: in layer {m['layer']} the first token's largest |h| is "
                            f"{m['first_max']:.1f} (dimension {m['first_dim']}), {m['ratio']:.0f} times the median "
                            f"|h| ({m['median']:.3f}); elsewhere at most {m['rest_max']:.1f}.")
    if "with" in variants and "without" in variants:
        a, b = variants["with"], variants["without"]
        findings.append(f"BOS effect: Sink^{eps:g}_1 {_pct(a.get('sink_metric_64'))} with a BOS first, "
                        f"{_pct(b.get('sink_metric_64'))} without (first {T} queries); over every query "
                        f"{_pct(a.get('sink_metric'))} against {_pct(b.get('sink_metric'))}.")
    findings += [paper.TEXT["streaming"], paper.TEXT["gu"], paper.TEXT["massive"]]
    if "cls" in variants:
        findings.append(paper.TEXT["clark"])
    figures = [
        run.figure(POSITIONS_FIGURE, "Attention on the first token per layer (rows) and query position (columns, "
                   "log2 buckets up to the model's context), mean over heads and the queries of each bucket; a "
                   "sliding-window layer (w) falls to 0 where its queries no longer see the first token "
                   "(StreamingLLM's Figure 2 read over a whole corpus)."),
        run.figure(HEADS_FIGURE, f"alpha_1 of every head (mean attention to the first token over the queries that "
                   f"see it, pooled over the corpus); a dot marks alpha_1 > {eps:g}; the title gives Gu et al.'s "
                   "Sink^eps over every query."),
        run.figure(LAYERS_FIGURE, "Per layer, mean over heads: alpha_1 (solid) and the first-token mass over every "
                   "query (dashed: lower than alpha_1 only where some queries cannot see the first token); grey: "
                   "sliding-window layers; one colour per BOS variant."),
        run.figure(MASSIVE_FIGURE, "Sun et al.'s massive activations: per layer output, the largest |h| at the first "
                   "token, the largest at any other token and the median |h|, means over segments (log scale)."),
    ]
    return Section("Attention sinks (Xiao et al. 2023; Gu et al. 2024; Sun et al. 2024)",
                   intro="How much attention each head parks on the first token (BOS where there is one, [CLS] for "
                   "an encoder), over a whole corpus, streamed: no attention map is kept.",
                   findings=findings, tables=[table, layer_table], figures=[f for f in figures if f])
