"""The report: one self-contained HTML page per run directory (index.html).

`bertscope run` writes it at the end of a run, `bertscope report RUN_DIR` (re)writes it for
any run directory, for instance after probes or a comparison added their files. The page
needs nothing beside it: figures are embedded as base64 data URIs, the CSS is inline, there
is no script and no network access, so the one file can be mailed or archived on its own.

Each analysis contributes a section (`bertscope.report.page` is the contract): a function,
listed in the registry `bertscope.registry.SECTIONS`, that looks for its files in the run
directory and returns a `Section` (intro, findings, tables, figures with captions), or None
when its files are absent. The report adds its own two: the provenance first, and last the
figures no section claimed, in "Other figures". Its footer lists the sources of the papers'
numbers the sections quote, as the registry's `PAPER_SOURCES` names them.
"""
from __future__ import annotations

import base64
import html
import importlib
import logging
from pathlib import Path

from bertscope.analyses import registry
from bertscope.errors import UserError
from bertscope.files import write_text
from bertscope.report.page import Figure, RunFiles, Section, Table
from bertscope.text.segments import describe_lengths
from bertscope.version import __version__

logger = logging.getLogger(__name__)

REPORT_NAME = "index.html"


def build_sections(run_dir: Path) -> list[tuple[str, Section]]:
    """Every section with files in `run_dir`, in page order: the provenance, each analysis's
    section as the registry lists them, then the figures no section claimed."""
    files = RunFiles(run_dir)
    out = [("provenance", provenance(files))]
    for entry in registry.SECTIONS:
        module, function = entry.builder.split(":")
        s = getattr(importlib.import_module(module), function)(files)
        if s is not None:
            out.append((entry.name, s))
    s = other_figures(files)  # last: it sees what every other section claimed
    if s is not None:
        out.append(("other_figures", s))
    return out


def paper_sources() -> list:
    """The sources of the papers' numbers the sections quote (`bertscope.report.quotes.Source`),
    in the registry's order (`bertscope.registry.PAPER_SOURCES`): the page's footer."""
    out = []
    for entry in registry.PAPER_SOURCES:
        module, name = entry.split(":")
        out.append(getattr(importlib.import_module(module), name))
    return out


def write_report(run_dir: str | Path) -> Path:
    """Write RUN_DIR/index.html from every analysis found in the directory; returns its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a directory: give a bertscope run directory")
    sections = build_sections(run_dir)
    page = render(run_dir, sections)
    path = run_dir / REPORT_NAME
    write_text(path, page)
    return path


def refresh_report(run_dir: str | Path) -> Path | None:
    """Rewrite the report after a probe or a comparison added files to `run_dir`. Their own
    outputs are written by then, so a report that cannot be built is said, not raised."""
    existed = (Path(run_dir) / REPORT_NAME).is_file()  # a new run's first report is written, not updated
    try:
        path = write_report(run_dir)
    except (UserError, OSError, ValueError, KeyError) as e:
        logger.warning(f"the report {Path(run_dir) / REPORT_NAME} was not updated ({e}): bertscope report {run_dir}")
        return None
    logger.info(f"{'updated' if existed else 'wrote'} the report {path}")
    return path


# ----------------------------------------------------------------------------- the report's own sections

def provenance(run: RunFiles) -> Section:
    r = run.record
    model = r.get("model") or {}
    rows = [("status", r.get("status")), ("command", r.get("command")),
            ("bertscope", r.get("bertscope_version")),
            ("model", f"{model.get('path')} ({model.get('type')}, {model.get('layers')} layers x "
                      f"{model.get('heads')} heads)" if model else None),
            ("tokens", r.get("n_tokens")), ("elapsed (s)", r.get("elapsed_s")),
            ("kernel", r.get("kernel")), ("attention output", r.get("output")),
            ("processes", r.get("world_size")), ("attention", _layouts(r.get("attention")))]
    for group in ("corpus", "segments", "versions", "settings"):
        for k, v in (r.get(group) or {}).items():
            rows.append((f"{group}: {k}", describe_lengths(v) if k == "lengths" and v else v))
    rows.append(("outputs", ", ".join(r.get("outputs") or [])))
    for name, p in r["analyses"].items():
        rows.append((f"probe {name}", f"{p.get('status')}, command: {p.get('command', '?')}"))
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td style=\"text-align:left\">{html.escape(str(v))}</td></tr>"
                    for k, v in rows if v not in (None, "", {}))
    return Section("Settings and provenance", intro="From run.json: what was run, on what, with which versions.",
                   raw_html=f"<table>{cells}</table>")




def _layouts(layouts: list[str] | None) -> str | None:
    """A decoder's per-layer attention layouts in a few words: "causal, 3 key/value heads (layers 1-30)"."""
    if not layouts:
        return None
    groups: dict[str, list[int]] = {}
    for i, layout in enumerate(layouts, 1):
        groups.setdefault(layout, []).append(i)
    return "; ".join(f"{layout} (layers {', '.join(map(str, ls)) if len(ls) < len(layouts) else f'1-{len(layouts)}'})"
                     for layout, ls in groups.items())


def other_figures(run: RunFiles) -> Section | None:
    """Every PNG no section claimed, so no figure is left out of the report."""
    rest = [n for n in run.figures("*.png") if n not in run.claimed]
    if not rest:
        return None
    return Section("Other figures", intro="Figures in the run directory that no report section describes yet.",
                   figures=[Figure(n, "no caption: no report section knows this file yet.") for n in rest])


# ----------------------------------------------------------------------------- HTML

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; line-height: 1.4; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
th, td { padding: 2px 8px; text-align: right; border-bottom: 1px solid #eee; }
th { background: #fafafa; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: 0.3em 0; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 60em; }
ul.findings li { margin: 0.2em 0; }
.paper { color: #8a3b00; }
.scroll { max-height: 30em; overflow: auto; }
"""


def render(run_dir: Path, sections: list[tuple[str, Section]]) -> str:
    nav = "".join(f'<a href="#{html.escape(n)}">{html.escape(s.title)}</a>' for n, s in sections)
    body = "".join(_section_html(run_dir, n, s) for n, s in sections)
    sources = "".join(f"<li>{html.escape(str(src))}</li>" for src in paper_sources())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>bertscope report: {html.escape(run_dir.name)}</title>
<style>{CSS}</style></head><body>
<h1>bertscope report: {html.escape(run_dir.name)}</h1>
<p>Heads are numbered <code>layer-head</code> from 1, as in Clark et al. (2019).
Numbers in <span class="paper">this colour</span> are the paper's, with their source.</p>
<nav>{nav}</nav>
{body}
<footer><h2>Sources of the paper numbers</h2><ul>{sources}</ul>
<p>Clark, Khandelwal, Levy and Manning (2019), What Does BERT Look At? An Analysis of BERT's Attention.
Written by bertscope {html.escape(__version__)}.</p></footer>
</body></html>
"""


def _section_html(run_dir: Path, name: str, s: Section) -> str:
    parts = [f'<section id="{html.escape(name)}"><h2>{html.escape(s.title)}</h2>']
    if s.intro:
        parts.append(f"<p>{html.escape(s.intro)}</p>")
    parts.append(s.raw_html)
    if s.findings:
        parts.append('<h3>Findings</h3><ul class="findings">'
                     + "".join(f"<li>{html.escape(f)}</li>" for f in s.findings) + "</ul>")
    parts += [table_html(t) for t in s.tables]
    parts += [_figure_html(run_dir, f) for f in s.figures]
    parts.append("</section>")
    return "".join(parts)


def _figure_html(run_dir: Path, fig: Figure) -> str:
    data = base64.b64encode((run_dir / fig.file).read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(fig.file)}">'
            f"<figcaption><b>{html.escape(fig.file)}</b>: {html.escape(fig.caption)}</figcaption></figure>")


def fmt(x, digits: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return "" if x is None else str(x)


def table_html(t: Table) -> str:
    span = {}
    for c in t.shade:
        i = t.columns.index(c)
        vals = [r[i] for r in t.rows if isinstance(r[i], float)]
        if vals:
            span[i] = (min(vals), (max(vals) - min(vals)) or 1.0)
    head = "".join(f'<th class="{"paper" if c.startswith("paper") else ""}">{html.escape(c)}</th>'
                   for c in t.columns)
    rows = []
    for r in t.rows:
        cells = []
        for i, x in enumerate(r):
            style = ""
            if i in span and isinstance(x, float):
                lo, width = span[i]
                style = f' style="background: rgba(0, 114, 178, {0.6 * (x - lo) / width:.2f})"'
            cls = ' class="paper"' if t.columns[i].startswith("paper") else ""
            cells.append(f"<td{cls}{style}>{html.escape(fmt(x, t.digits))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    wrap = ' class="scroll"' if len(t.rows) > 40 else ""
    return (f"<div{wrap}><table><caption>{html.escape(t.caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")
