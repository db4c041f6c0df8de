"""What `bertscope probe classifier` writes: the UAS table (CSV and as printed), the
attention-only probe's weight per head, and two figures; the names the command and the report
section share (`bertscope compare` reads the head weights too)."""
from __future__ import annotations

TABLE_FILE = "classifier_table.csv"  # one row per probe: UAS beside the paper's
TABLE_TEXT = "classifier_table.txt"  # the same as printed
WEIGHTS_FILE = "classifier_attn_weights.csv"  # layer, head, w, u of the attention-only probe
TRAINING_FIGURE = "fig_classifier_training.png"
HEAD_WEIGHTS_FIGURE = "fig_classifier_head_weights.png"
