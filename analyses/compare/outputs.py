"""What `bertscope compare` writes: the names the command and the report section share, and the
one reader of a comparison. The tables it compares are named where they are written
(`bertscope.analyses.surface.outputs` and the probes' outputs)."""
from __future__ import annotations

import csv
from pathlib import Path

from bertscope.files import read_run

CSV_NAME = "compare_heads.csv"  # one row per (source, statistic, head)
FIGURE = "fig_compare_{statistic}.png"  # the difference heatmap of one heads.csv statistic


def read_comparison(directory: str | Path) -> tuple[dict, list[dict]] | None:
    """A comparison written earlier into `directory` (its run.json `compare` entry and the
    rows of compare_heads.csv, as strings), or None when it holds none: for the report."""
    directory = Path(directory)
    record = read_run(directory / "run.json").get("compare")
    if not record or not (directory / CSV_NAME).is_file():
        return None
    with open(directory / CSV_NAME, newline="", encoding="utf-8") as f:
        return record, list(csv.DictReader(f))
