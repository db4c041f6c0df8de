"""Head clustering in the report (Clark et al. section 6)."""
from __future__ import annotations

from bertscope.analyses.probes.cluster.outputs import (
    LAYERS_FIGURE,
    MDS_FIGURE,
    MDS_FILE,
)
from bertscope.report.page import RunFiles, Section, heads_str


def build(run: RunFiles) -> Section | None:
    rows = run.csv(MDS_FILE)
    if rows is None:
        return None
    counts: dict[str, list[str]] = {}
    for r in rows:
        counts.setdefault(r["behaviour"], []).append(f"{r['layer']}-{r['head']}")
    findings = [f"{b}: {len(h)} heads ({heads_str(h, 8)})" for b, h in sorted(counts.items(), key=lambda x: -len(x[1]))]
    figures = [run.figure(MDS_FIGURE, "Heads embedded in 2-D by multidimensional scaling of their "
                          "Jensen-Shannon distances: heads close together attend alike; markers give each head's "
                          "behaviour (Clark et al. Fig. 6)."),
               run.figure(LAYERS_FIGURE, "Mean Jensen-Shannon divergence between the heads of two "
                          "layers: dark diagonal blocks mean heads of nearby layers behave alike.")]
    return Section("Head clustering (Clark et al. 2019, section 6)", intro="Behaviour of each head, from its "
                   "surface statistics, as grouped in the MDS plot.", findings=findings,
                   figures=[f for f in figures if f])
