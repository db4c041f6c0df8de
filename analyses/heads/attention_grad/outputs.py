"""What `bertscope heads attention-grad` writes: the mean |gradient| and attention per layer and
per head by key class, and two figures; the names the command and the report section share."""
from __future__ import annotations

LAYERS_FILE = "attention_grad_layers.csv"  # one row per (layer, key class)
HEADS_FILE = "attention_grad_heads.csv"  # one row per (layer, head, key class)
LAYERS_FIGURE = "fig_attention_grad.png"  # Clark et al. Fig. 5
HEADS_FIGURE = "fig_attention_grad_heads.png"
