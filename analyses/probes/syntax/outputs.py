"""What `bertscope probe syntax` writes: the per-head and best-head tables, the printed table,
and two figures per treebank; the names the command and the report section share
(`bertscope compare` reads the per-head table too)."""
from __future__ import annotations

HEADS_FILE = "syntax_heads.csv"  # one row per (treebank, relation, direction, head): accuracy
TABLE_FILE = "syntax_table.csv"  # the best head per (treebank, relation, direction) beside the baseline
TABLE_TEXT = "syntax_table.txt"  # the same as printed
BEST_HEADS_FIGURE = "syntax_best_heads_{treebank}.png"
HEATMAPS_FIGURE = "syntax_heatmaps_{treebank}.png"

# --head-to-dep: a head-to-dependent relation read from the dependent's column or the head's row
# (bertscope.analyses.probes.syntax.stats); here, so that the parser is built without torch
HEAD_TO_DEP_MODES = ("column", "row")
