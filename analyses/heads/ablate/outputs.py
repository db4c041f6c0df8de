"""What `bertscope heads ablate` writes: one row per variant (the baseline, single heads masked,
all heads of a layer but one), the best kept head per layer, and four figures; the names the
command and the report section share."""
from __future__ import annotations

ABLATE_FILE = "ablate.csv"  # one row per variant (`bertscope.analyses.heads.common.COLUMNS`)
BUT_ONE_FILE = "ablate_but_one.csv"  # per layer: the best kept head of "all but one"
HEADS_FIGURE = "fig_ablate_heads.png"
HISTOGRAM_FIGURE = "fig_ablate_hist.png"
BUT_ONE_FIGURE = "fig_ablate_but_one.png"
IMPORTANCE_FIGURE = "fig_ablate_importance.png"  # with an importance CSV
