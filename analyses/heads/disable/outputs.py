"""What `bertscope heads disable` writes: one row per variant (the baseline, every single head
and every whole layer disabled) and two figures; the names the command and the report section
share."""
from __future__ import annotations

DISABLE_FILE = "disable.csv"  # one row per variant (`bertscope.analyses.heads.common.COLUMNS`)
HEADS_FIGURE = "fig_disable_heads.png"  # one head disabled at a time (Kovaleva et al. Fig. 8)
LAYERS_FIGURE = "fig_disable_layers.png"  # one whole layer disabled at a time (Fig. 9)
