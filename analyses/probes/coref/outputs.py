"""What `bertscope probe coref` writes: the per-head and best-head tables, the printed table
and two figures; the names the command and the report section share (`bertscope compare`
reads the per-head table too)."""
from __future__ import annotations

HEADS_FILE = "coref_heads.csv"  # one row per (dataset, mention type, head): accuracy
TABLE_FILE = "coref_table.csv"  # the best head per (dataset, mention type) beside the baselines
TABLE_TEXT = "coref_table.txt"  # the same as printed
BARS_FIGURE = "coref_bars.png"
HEADS_FIGURE = "coref_heads.png"
