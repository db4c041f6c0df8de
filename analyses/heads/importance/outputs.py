"""What `bertscope heads importance` writes, and the one reader of it.

importance.csv has one row per head, in layer-major order: `layer, head` (from 1),
`importance` (per-layer L2-normalised unless --no-normalise), `importance_raw` and `rank`
(1 = most important); a masked head's scores and rank are empty. `heads ablate --importance`,
`heads importance --compare` and the report read it here.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from bertscope.errors import UserError

IMPORTANCE_FILE = "importance.csv"
COLUMNS = ("layer", "head", "importance", "importance_raw", "rank")
CORRELATION_FILE = "importance_correlation.csv"  # heads importance --compare
FIGURE = "fig_importance.png"
CORRELATION_FIGURE = "fig_importance_correlation.png"  # heads importance --compare


def importance_path(path) -> Path:
    """The importance CSV a path names: the file itself, or importance.csv in a run directory."""
    path = Path(path)
    if path.is_dir():
        path = path / IMPORTANCE_FILE
    if not path.is_file():
        raise UserError(f"no importance file at {path} (run `bertscope heads importance` first, or pass the "
                        f"{IMPORTANCE_FILE} it wrote with --importance)")
    return path


def read_importance(path) -> dict[tuple[int, int], dict[str, float]]:
    """{(layer, head) from 1: {"importance", "importance_raw", "rank"}} from an importance CSV
    (`COLUMNS`; more columns are ignored). UserError on anything else."""
    path = importance_path(path)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(f"{path} lacks the column(s) {', '.join(missing)} (an importance CSV has "
                            f"{', '.join(COLUMNS)})")
        out = {}
        for line, r in enumerate(reader, start=2):
            try:
                key = (int(r["layer"]), int(r["head"]))
                values = {c: float(r[c]) if r[c] != "" else math.nan for c in COLUMNS[2:]}  # "": a masked head
            except (TypeError, ValueError):
                raise UserError(f"{path} line {line}: layer and head must be integers and importance, "
                                "importance_raw, rank numbers") from None
            if key in out:
                raise UserError(f"{path} line {line}: head {key[0]}-{key[1]} appears twice")
            out[key] = values
    if not out:
        raise UserError(f"{path} has no rows")
    return out


def importance_grid(table: dict, n_layers: int, n_heads: int, column: str = "importance") -> np.ndarray:
    """(layers, H) array of one importance column (NaN for masked heads); UserError unless the
    table has exactly the model's layers x heads (an importance file of another model)."""
    want = {(lay, h) for lay in range(1, n_layers + 1) for h in range(1, n_heads + 1)}
    if set(table) != want:
        layers, heads = max(k[0] for k in table), max(k[1] for k in table)
        raise UserError(f"the importance file covers {len(table)} heads (up to layer {layers}, head {heads}); "
                        f"the model has {n_layers} layers x {n_heads} heads")
    grid = np.zeros((n_layers, n_heads))  # (layers, H)
    for (lay, h), values in table.items():
        grid[lay - 1, h - 1] = values[column]
    return grid
