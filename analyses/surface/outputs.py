"""What `bertscope run` writes: the per-head table, the checkpoint of the sums, the
per-example Parquet file (with --per-example) and the five surface figures; the names the
command, its figures and the report section share (`bertscope compare` and the notebook API
read them too)."""
from __future__ import annotations

HEADS_FILE = "heads.csv"  # one row per head: the surface statistics
STATS_CHECKPOINT = "stats{suffix}.npz"  # the sums; suffix: the rank's under torchrun ("" in one process)
STATS_FILE = STATS_CHECKPOINT.format(suffix="")  # the sums of the whole run
EXAMPLES_FILE = "examples.parquet"  # --per-example: one row per (segment, layer, head)

TOKENS_BY_LAYER_FIGURE = "fig_tokens_by_layer.png"
ENTROPY_BY_LAYER_FIGURE = "fig_entropy_by_layer.png"
OFFSETS_HEATMAP_FIGURE = "fig_offsets_heatmap.png"
SPECIAL_HEATMAP_FIGURE = "fig_special_heatmap.png"
ENTROPY_HEATMAP_FIGURE = "fig_entropy_heatmap.png"
