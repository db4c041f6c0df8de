"""The run directory: everything a run leaves behind, written so that a crash loses little.

    run.json     model, data, settings, versions, status and the list of outputs
    stats.npz    the raw per-head sums (`HeadStats`), rewritten at every checkpoint
    heads.csv    the tidy per-head table of the analysis
    fig_*.png    figures
Every file is written to a temporary name and renamed, so a reader (or a resumed run)
never sees half a file.
"""
from __future__ import annotations

import csv
import json
import os
from datetime import datetime
from pathlib import Path

from bertscope.errors import UserError


def check_run_dir(out: str | None):
    """Refuse a used `--out` early, before any work, without creating anything."""
    if out is None:
        return
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{path} already exists and is not empty: choose another --out, or --resume {path}")


def new_run_dir(out: str | None) -> Path:
    """The run's directory: `out`, or runs/<timestamp>; refuses to overwrite a used one."""
    path = Path(out) if out else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    check_run_dir(str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the run directory {path}: {e.strerror}") from None
    return path


def write_json(path: Path, data: dict):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_npz(path, compressed: bool = False, **arrays):
    """Write arrays to an .npz atomically: a crash mid-write leaves the old file, as a checkpoint
    must (the temporary name keeps numpy's .npz suffix, so numpy adds none)."""
    import numpy as np

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    (np.savez_compressed if compressed else np.savez)(tmp, **arrays)
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} not found: is this a bertscope run directory?") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...]):
    """A tidy CSV: one header line, floats with 6 significant digits."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([f"{row[c]:.6g}" if isinstance(row[c], float) else row[c] for c in columns])
    os.replace(tmp, path)
