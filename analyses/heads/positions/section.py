"""Attention by distance and by position in the report (`bertscope heads positions`)."""
from __future__ import annotations

from bertscope.analyses.heads.positions import paper
from bertscope.analyses.heads.positions.outputs import DISTANCE_FIGURE, LAYERS_FILE, NAME, PROFILE_FIGURE
from bertscope.report.page import RunFiles, Section, Table, num


def build(run: RunFiles) -> Section | None:
    rows = run.csv(LAYERS_FILE)
    results = (run.record.get("analyses", {}).get(NAME, {}) or {}).get("results") or {}
    if rows is None or not results:
        return None
    late = results.get("late", 0.1)
    kinds = results.get("kinds", {})
    kind_table = Table("Per layer kind, mean over its layers and heads",
                       ["attention", "layers", "mean distance", "90% of the mass within", "99% within",
                        "mass at 512 and beyond", "late queries: first tenth", "middle (30-70%)", "last tenth",
                        "U-shaped"],
                       [[kind, ", ".join(map(str, k["layers"])), num(k["mean_distance"]), k.get("reach_90") or "32768+",
                         k.get("reach_99") or "32768+", num(k["mass_beyond_512"]), num(k["late_shape"]["first"]),
                         num(k["late_shape"]["middle"]), num(k["late_shape"]["last"]),
                         "yes" if k["late_shape"]["u_shaped"] else "no"] for kind, k in kinds.items()], digits=4)
    layer_table = Table("Per layer, mean over heads (w: sliding-window layer)",
                        ["layer", "attention", "mean distance", "90% within", "late: first tenth", "late: 40-50%",
                         "late: last tenth", "late: first token"],
                        [[int(r["layer"]), r["attention"], num(r["mean_distance"]), r["reach_90"] or "32768+",
                          num(r["p_0-10%"]), num(r["p_40-50%"]), num(r["p_90-100%"]), num(r["first_token"])]
                         for r in rows], digits=3, shade={"mean distance"})
    findings = []
    for kind, k in kinds.items():
        window = (f" Nothing lies beyond the window: the largest mass of any head there is {k['beyond_window']:.3g}."
                  if "beyond_window" in k else
                  f" {100 * k['mass_beyond_512']:.1f}% of the mass lies at distance 512 or more; the layer that reads "
                  f"farthest is {k.get('farthest_layer')}.")
        s, s0 = k["late_shape"], k["late_shape_without_first_token"]
        findings.append(f"[{kind}] layers {k['layers']}: mean distance {k['mean_distance']:.1f} tokens, 90% of the "
                        f"mass within distance {k.get('reach_90') or '32768+'}.{window} The late queries put "
                        f"{s['first']:.3f} on the first tenth of their context ({s0['first']:.3f} without the first "
                        f"token), {s['middle']:.3f} on each middle tenth and {s['last']:.3f} on the last: "
                        f"{'U-shaped' if s['u_shaped'] else 'not U-shaped'}.")
    findings += [paper.TEXT["liu"], paper.TEXT["hsieh"]]
    figures = [
        run.figure(DISTANCE_FIGURE, "Attention by query-key distance per layer (rows) and log2 distance bucket "
                   "(columns), mean over heads and every query, log colour scale (blank: no mass); a red edge marks "
                   "where a sliding window ends; right: each layer's mean distance (grey: windowed layers)."),
        run.figure(PROFILE_FIGURE, f"The late queries (the last {100 * late:g}% of each segment): attention by the "
                   "key's place in the query's context, in tenths, per layer (left) and per layer kind (right, log "
                   "scale; dashed: the first tenth without the first token, the attention sink; dotted: uniform)."),
    ]
    return Section("Attention by distance and by position (Liu et al. 2023; Hsieh et al. 2024)",
                   intro="How far back each head reads, and where in its context a late query looks: beginning, "
                   "middle or end (is the attention U-shaped, as Hsieh et al. find?). Streamed: no attention map is "
                   "kept.", findings=findings, tables=[kind_table, layer_table], figures=[f for f in figures if f])
