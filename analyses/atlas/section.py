"""The atlas in the report (`bertscope atlas`, `bertscope atlas compare`)."""
from __future__ import annotations

from bertscope.analyses.atlas import paper
from bertscope.analyses.atlas.card import layers_caption
from bertscope.analyses.atlas.outputs import (
    COMPARE_FIGURE,
    COMPARE_NAME,
    GRID_FIGURE,
    LAYERS_FIGURE,
    LAYERS_FILE,
    NAME,
)
from bertscope.report.page import RunFiles, Section, Table


def build(run: RunFiles) -> Section | None:
    results = (run.record.get("analyses", {}).get(NAME, {}) or {}).get("results") or {}
    if not results or run.csv(LAYERS_FILE) is None:
        return None
    from bertscope.analyses.atlas import head_types as T

    n = results["n_heads"]
    rows = []
    for r in T.RULES:
        count = results["counts"].get(r.name)
        top = results.get("top", {}).get(r.name) or []
        rows.append([r.name, r.text(),
                     results["not_measured"].get(r.name, "") if count is None else f"{count} of {n}",
                     ", ".join(f"{t['head']} ({t['score']:.3f})" for t in top[:3])])
    q = f" ({results['quantised']} weights)" if results.get("quantised") else ""
    findings = [f"{results['model']}{q}: {results['typed']} of {n} heads carry at least one type."]
    findings += [f"{name}: {why}." for name, why in results.get("not_measured", {}).items()]
    pairs = results.get("overlap") or []
    if pairs:
        findings.append("Types that share heads (heads of both): "
                        + ", ".join(f"{' + '.join(p['types'])} {p['heads']}" for p in pairs[:3]) + ".")
    if results.get("pending_columns"):
        findings.append("Not measured in this run: " + ", ".join(results["pending_columns"]) + ".")
    findings += [paper.TEXT[k] for k in ("sink", "positional", "induction")]
    if results.get("decoder"):
        findings += [paper.TEXT["retrieval"], paper.TEXT["streaming"]]
    figures = [
        run.figure(GRID_FIGURE, "Every head (columns) of every layer (rows), coloured by its first type; the letters "
                   "are all its types (atlas_card.html has the same grid with each head's numbers)."),
        run.figure(LAYERS_FIGURE, layers_caption(results)),
    ]
    return Section("Head atlas: every head typed",
                   intro="One streamed pass and short probes type every head by fixed thresholds "
                   "(analyses/atlas/head_types.py); atlas_card.md and atlas_card.html are the model's card.",
                   findings=findings,
                   tables=[Table("Types: rule, heads, top three", ["type", "rule", "heads", "top heads (score)"],
                                 rows)],
                   figures=[f for f in figures if f])


def build_compare(run: RunFiles) -> Section | None:
    results = (run.record.get("analyses", {}).get(COMPARE_NAME, {}) or {}).get("results") or {}
    if not results:
        return None
    explained = results.get("explained", [0, 0])
    rows = [[m, r["heads"], ", ".join(f"{t} {c}" for t, c in r["counts"].items() if c)]
            for m, r in results.get("models", {}).items()]
    figures = [run.figure(COMPARE_FIGURE, f"Every head of every model on PC 1 ({100 * explained[0]:.0f}% of the "
                          f"variance) and PC 2 ({100 * explained[1]:.0f}%) of the standardised features "
                          f"({', '.join(results.get('features', []))}): by first type (left), by model (right).")]
    return Section("Head atlas: models compared", intro="The heads of several `bertscope atlas` runs side by side.",
                   tables=[Table("Heads and types per model", ["model", "heads", "types"], rows)],
                   figures=[f for f in figures if f])
