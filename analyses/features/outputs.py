"""What `bertscope features` writes: every (data, feature, head) score, the last layer's [CLS]
row (Figure 7), the sums of each data set (its checkpoint, kept for later runs into the same
directory), and the figures; the names the command and the report section share."""
from __future__ import annotations

SCORES_CSV = "features_scores.csv"  # data, feature, layer, head, score, cls_mass, top_share, n_inputs
FIG7_CSV = "features_cls_last_layer.csv"  # the last layer's rows (Kovaleva et al. Figure 7)
# the FeatureScores of one data set; suffix: the rank's under torchrun ("" in one process and
# for the merged sums)
CHECKPOINT = "features_{data}{suffix}.npz"
HEATMAP_FIGURE = "fig_features_{data}.png"  # layer x head score per feature of one data set (Figure 6)
CLS_LAST_LAYER_FIGURE = "fig_features_cls_last_layer.png"
LAYERS_FIGURE = "fig_features_layers.png"
