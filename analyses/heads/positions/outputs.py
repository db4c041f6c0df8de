"""What `bertscope heads positions` writes: the per-head distance and position tables, the per-layer
means, the sums (its checkpoint) and the figures; the names the command and the report section share."""
from __future__ import annotations

# what the command line shows as defaults and run.json files the analysis under, here so that building the
# parser needs no torch (stats.py, which defines the statistics, imports them from here)
NAME = "positions"  # run.json["analyses"][NAME]
LATE = 0.1  # the share of each segment's last real tokens whose rows make the position profile

DISTANCE_FILE = "positions_distance.csv"  # one row per (layer, head): mean distance, mass per log2 distance bucket
PROFILE_FILE = "positions_profile.csv"  # one row per (layer, head): late queries' mass per tenth of their context
LAYERS_FILE = "positions_layers.csv"  # one row per layer: both, means over heads
STATS_FILE = "positions.npz"  # the sums (`PositionStats`), saved every few batches: what --resume continues
STATS_CHECKPOINT = "positions{suffix}.npz"  # under torchrun each rank's own sums ("positions.rank0.npz", ...)

DISTANCE_FIGURE = "fig_positions_distance.png"  # layer x log2 distance bucket heat map, mean over heads
PROFILE_FIGURE = "fig_positions_profile.png"  # layer x tenth of the context heat map (late queries), and its mean
