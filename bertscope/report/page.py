"""The report's page contract: what an analysis's report section returns, and how it reads
the run directory.

A section is a function `build(run: RunFiles) -> Section | None`, listed in the registry
(`bertscope.analyses`): it looks for its files in the run directory and returns a `Section`
(intro, findings, tables, figures with captions), or None when its files are absent, so a
missing analysis is skipped, never an error. Findings are sentences generated from the run's
numbers, with the paper's number beside ours where it has one. `bertscope.report.writer` writes the
page; this module knows nothing of HTML or of any analysis.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from bertscope.files import read_run


@dataclass
class Figure:
    file: str  # a PNG in the run directory
    caption: str  # what it shows and how to read it


@dataclass
class Table:
    caption: str
    columns: list[str]
    rows: list[list]  # cells: str, int or float (floats are printed with `digits`)
    digits: int = 3
    shade: set[str] = field(default_factory=set)  # columns shaded by value, to make stand-outs visible


@dataclass
class Section:
    title: str
    intro: str = ""  # plain text
    findings: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    raw_html: str = ""  # for the provenance block only: already escaped


class RunFiles:
    """Read access to a run directory for the sections; remembers which figures were shown."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.record = read_run(self.dir / "run.json")  # checked; the analyses under "analyses"
        self.claimed: set[str] = set()

    def has(self, name: str) -> bool:
        return (self.dir / name).is_file()

    def csv(self, name: str) -> list[dict] | None:
        """Rows of a CSV as dicts of strings, or None when the file is absent."""
        if not self.has(name):
            return None
        with open(self.dir / name, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    def figures(self, pattern: str) -> list[str]:
        return sorted(p.name for p in self.dir.glob(pattern) if p.is_file())

    def figure(self, name: str, caption: str) -> Figure | None:
        if not self.has(name):
            return None
        self.claimed.add(name)
        return Figure(name, caption)


def heads_str(heads: list[str], limit: int = 12) -> str:
    """Head names for a sentence: the first `limit`, then how many more."""
    more = f" and {len(heads) - limit} more" if len(heads) > limit else ""
    return ", ".join(heads[:limit]) + more if heads else "none"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def num(s) -> float | None:
    """A CSV cell as a float, or None when it is empty, not a number or NaN."""
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v
