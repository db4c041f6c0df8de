"""What `bertscope heads prune` writes, and the one reader of its pruning order.

    prune.csv         one row per (order, seed, step): accuracy and its change
    prune_order.csv   which heads the importance order removed at each step (layer and head
                      from 1), read back by `bertscope heads remove --from-prune`
    fig_prune.png     the pruning curves
    prune_importance.csv  --task lm: the importance each step pruned by (step, then importance.csv's columns)

With --task lm, prune.csv's columns are `LM_COLUMNS` (perplexity on held-out text, not accuracy).
"""
from __future__ import annotations

import csv
from pathlib import Path

PRUNE_FILE = "prune.csv"
ORDER_FILE = "prune_order.csv"
FIGURE = "fig_prune.png"
ORDER_COLUMNS = ("step", "fraction_pruned", "layer", "head")
LM_COLUMNS = ("step", "fraction_pruned", "heads_pruned", "order", "seed", "loss", "perplexity", "perplexity_ratio")
IMPORTANCE_STEPS_FILE = "prune_importance.csv"


def heads_from_prune_order(path: Path, fraction: float) -> dict[int, list[int]]:
    """The heads `bertscope heads prune` had removed once `fraction` of them were gone:
    every row of its prune_order.csv (step, fraction_pruned, layer, head; layer and head from 1)
    with fraction_pruned <= fraction (a small tolerance for the float written)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != ORDER_COLUMNS:
            raise ValueError(f"{path} has columns {reader.fieldnames}, not {', '.join(ORDER_COLUMNS)}")
        heads: dict[int, list[int]] = {}
        for n, row in enumerate(reader, start=2):
            try:
                frac, layer, head = float(row["fraction_pruned"]), int(row["layer"]), int(row["head"])
            except (TypeError, ValueError):
                raise ValueError(f"{path} line {n}: not numbers: {row}") from None
            if layer < 1 or head < 1:
                raise ValueError(f"{path} line {n}: layer and head count from 1, not {layer}-{head}")
            if frac <= fraction + 1e-9:
                heads.setdefault(layer - 1, []).append(head - 1)
    return {layer: sorted(set(hs)) for layer, hs in heads.items()}
