"""index.html: one page per run with the settings, the figures and the per-head table.

Plain HTML with relative links to the PNGs beside it, so the run directory can be copied
or served as it is. Table cells are shaded by value (per column) to make stand-out heads
visible at a glance.
"""
from __future__ import annotations

import html
import os
from pathlib import Path

import numpy as np

SHADED = {"prev", "self", "next", "cls", "sep", "punct", "other", "sep_sep", "entropy", "cls_entropy"}


def write_report(run_dir: Path, record: dict, table: dict[str, np.ndarray], figures: list[str], summary: str) -> Path:
    settings = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                       for k, v in record["settings"].items())
    figs = "".join(f'<figure><img src="{html.escape(f)}" alt="{html.escape(f)}"></figure>' for f in figures)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>bertscope run: {html.escape(run_dir.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ padding: 2px 8px; text-align: right; border-bottom: 1px solid #eee; }}
th {{ position: sticky; top: 0; background: #fafafa; }}
figure img {{ max-width: 100%; }}
pre {{ background: #f6f6f6; padding: 1em; }}
</style></head><body>
<h1>bertscope: surface-level attention patterns</h1>
<p>Model <code>{html.escape(record["model"]["path"])}</code> ({record["model"]["layers"]} layers x
{record["model"]["heads"]} heads), corpus <code>{html.escape(str(record["settings"]["corpus"]))}</code>,
{record.get("n_tokens", 0)} tokens in {record["segments"].get("segments", "?")} segments.
Heads are numbered <code>layer-head</code> from 1, as in Clark et al. (2019).</p>
<pre>{html.escape(summary)}</pre>
<h2>Figures</h2>{figs}
<h2>Per-head table (<a href="heads.csv">heads.csv</a>)</h2>
{_table_html(table)}
<h2>Settings</h2><table>{settings}</table>
</body></html>
"""
    path = run_dir / "index.html"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _table_html(table: dict[str, np.ndarray]) -> str:
    cols = list(table)
    flat = {c: table[c].ravel() for c in cols}
    span = {c: (flat[c].min(), np.ptp(flat[c]) or 1.0) for c in cols if c in SHADED}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    rows = []
    for i in range(len(flat["layer"])):
        cells = []
        for c in cols:
            x = flat[c][i]
            text = f"{x:.3f}" if isinstance(x, np.floating) else str(x)
            if c in span:
                lo, width = span[c]
                alpha = 0.6 * float((x - lo) / width)
                cells.append(f'<td style="background: rgba(0, 114, 178, {alpha:.2f})">{text}</td>')
            else:
                cells.append(f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
