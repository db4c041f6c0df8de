"""What `bertscope probe cluster` writes: the Jensen-Shannon divergences, the MDS layout with
each head's behaviour, the per-layer means, and two figures; the names the command and the
report section share."""
from __future__ import annotations

JS_FILE = "cluster_js.csv"  # one row per pair of heads
MDS_FILE = "cluster_mds.csv"  # one row per head: coordinates, behaviour, the surface numbers behind it
LAYERS_FILE = "cluster_layers.csv"  # mean JS between the heads of two layers
MDS_FIGURE = "fig_cluster_mds.png"
LAYERS_FIGURE = "fig_cluster_layers.png"
