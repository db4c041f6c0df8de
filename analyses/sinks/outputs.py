"""What `bertscope sinks` writes: the per-head, per-layer and per-position tables, the sums (its
checkpoint) and the figures; the names the command and the report section share."""
from __future__ import annotations

# what the command line shows as defaults and run.json files the analysis under, here so that building the
# parser needs no torch (bertscope.analyses.sinks.stats, which defines the statistics, imports them from here)
NAME = "sinks"  # run.json["analyses"][NAME]
EPSILON = 0.3  # Gu et al.'s threshold
INITIAL = 4  # StreamingLLM's initial tokens kept as sinks

SINKS_FILE = "sinks.csv"  # one row per (bos variant, layer, head)
LAYERS_FILE = "sinks_layers.csv"  # one row per (bos variant, layer): means over heads, massive activations
# one row per (bos variant, layer, log2 position bucket); query positions from 0 (the first token is 0), as the
# heatmap's axis and docs/sinks.md number them
POSITIONS_FILE = "sinks_positions.csv"
STATS_FILE = "sinks.npz"  # the sums (`SinkStats`), saved every few batches: what --resume continues

POSITIONS_FIGURE = "fig_sinks_positions.png"  # layer x query-position heatmap of the first-token mass
HEADS_FIGURE = "fig_sinks_heads.png"  # layer x head alpha_1
LAYERS_FIGURE = "fig_sinks_layers.png"  # per layer: alpha_1 and first-token mass, each variant; windowed layers shaded
MASSIVE_FIGURE = "fig_sinks_massive.png"  # per layer: max |h| at the first token, elsewhere, and the median
