"""The comparison of two runs in the report (`bertscope compare`)."""
from __future__ import annotations

from bertscope.analyses.compare.outputs import FIGURE, read_comparison
from bertscope.analyses.surface.outputs import HEADS_FILE
from bertscope.report.page import RunFiles, Section, Table, num


def build(run: RunFiles) -> Section | None:
    found = read_comparison(run.dir)
    if found is None:
        return None
    record, rows = found
    changed = sorted((r for r in rows if r.get("source") == HEADS_FILE and num(r["diff"]) is not None),
                     key=lambda r: -abs(num(r["diff"])))[:15]
    table = Table("Heads that changed most (heads.csv statistics), diff = b - a",
                  ["statistic", "layer", "head", "a", "b", "diff", "q", "significant"],
                  [[r["statistic"], int(r["layer"]), int(r["head"]), num(r["a"]), num(r["b"]), num(r["diff"]),
                    r.get("q", ""), r.get("significant", "")] for r in changed])
    findings = [f"a = {record.get('a')} ({record.get('model_a')}), b = {record.get('b')} ({record.get('model_b')})."]
    if record.get("test"):
        findings.append(f"Test: {record.get('test_description')}; significant heads per statistic at q < "
                        f"{record.get('alpha')}: {record.get('significant')}.")
    prefix, _, suffix = FIGURE.partition("{statistic}")
    figures = [run.figure(n, f"Per-head change of {n[len(prefix):-len(suffix)]}, b - a: purple higher in b, orange "
                          "lower, white unchanged; framed cells are significant where a test ran.")
               for n in run.figures(FIGURE.format(statistic="*"))]
    return Section("Comparison of two runs", intro="Per-head differences between two run directories "
                   "(bertscope compare).", findings=findings, tables=[table], figures=figures)
