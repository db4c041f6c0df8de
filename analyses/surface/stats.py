"""Surface-level attention patterns (Clark et al. 2019, section 3).

The per-head table itself, its columns and the statistics it needs (`NEEDS`) are the core's
(`bertscope.engine.head_table`: the notebook API and the viewer show it too); this module names the
analysis and sums the table up in the terminal (`summary`: the heads that most clearly show each
pattern; `decoder_summary` for a model whose attention is not an encoder's plain one).
"""
from __future__ import annotations

import warnings

import numpy as np

from bertscope.engine.head_table import (  # noqa: F401  (the family's table: its command, section and tests read it here)
    ARGMAX_COLUMNS,
    COLUMNS,
    NEEDS,
    head_table,
    layout_table,
    present_classes,
    table_rows,
)

NAME = "surface"


def summary(table: dict[str, np.ndarray], k: int = 3) -> str:
    """A few lines for the terminal: the heads that most clearly show each pattern."""
    if "first" in table:
        return decoder_summary(table, k)
    lines = []
    for col, what in (("prev", "previous token"), ("next", "next token"), ("cls", "[CLS]"),
                      ("sep", "[SEP]"), ("punct", "'.' and ','"), ("entropy", "broadest (entropy, nats)")):
        flat = table[col].ravel()
        top = np.argsort(-flat, kind="stable")[:k]
        heads = ", ".join(f"{table['layer'].ravel()[i]}-{table['head'].ravel()[i]} ({flat[i]:.2f})" for i in top)
        lines.append(f"  {what:<26} {heads}")
    for col, what in (("sep", "[SEP] mass"), ("rest_sep", "other -> [SEP]"), ("sep_sep", "[SEP] -> [SEP]")):
        with warnings.catch_warnings():  # a pruned model's removed heads are NaN; a layer of them, NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            by_layer = np.nanmean(table[col], axis=1)
        lines.append(f"  {what + ' by layer':<26} " + " ".join(f"{x:.2f}" for x in by_layer))
    return "\n".join(lines)


def _top(table: dict[str, np.ndarray], col: str, k: int, lowest: bool = False) -> str:
    """The k heads with the highest (`lowest`: the lowest) values of `col`, with their values; NaN last."""
    flat = table[col].ravel()
    key = np.nan_to_num(flat, nan=np.inf) if lowest else -np.nan_to_num(flat, nan=-np.inf)
    top = np.argsort(key, kind="stable")[:k]
    return ", ".join(f"{table['layer'].ravel()[i]}-{table['head'].ravel()[i]} ({flat[i]:.2f})" for i in top)


def decoder_summary(table: dict[str, np.ndarray], k: int = 3) -> str:
    """The terminal lines of a causal model: previous-token, self and first-token heads, the most
    focused and the broadest heads against their layer's uniform baseline (KL from uniform over the
    visible keys: raw entropy grows with the keys a row sees), and the first token's share by layer."""
    lines = []
    for col, what in (("prev", "previous token"), ("self", "current token"), ("first", "first token"),
                      ("punct", "'.' and ','"), ("sep", "[SEP]"), ("kl_uniform", "most focused (KL, nats)")):
        if col in table:
            lines.append(f"  {what:<26} {_top(table, col, k)}")
    lines.append(f"  {'broadest (KL, nats)':<26} " + _top(table, "kl_uniform", k, lowest=True))
    for col, what in (("first", "first token mass"), ("entropy", "entropy"), ("uniform_entropy", "uniform entropy")):
        with warnings.catch_warnings():  # a layer of removed heads is NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            by_layer = np.nanmean(table[col], axis=1)
        if col == "uniform_entropy" and np.ptp(by_layer) < 5e-3:  # no windowed layer: one baseline
            lines.append(f"  {what:<26} {by_layer[0]:.2f} (every layer)")
        else:
            lines.append(f"  {what + ' by layer':<26} " + " ".join(f"{x:.2f}" for x in by_layer))
    return "\n".join(lines)
