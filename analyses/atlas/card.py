"""The head card of one model: Markdown (atlas_card.md) and one self-contained HTML page
(atlas_card.html, its figures embedded): the model's shape, the run, the types with their
thresholds and counts, the grid of every head, the per-layer profiles and the top heads of each
type; what was not measured says so. Also run.json's headline (`headline`) and the terminal's lines.
"""
from __future__ import annotations

import base64
import html as H
import math
from pathlib import Path

import numpy as np

from bertscope.analyses.atlas import head_types as T
from bertscope.analyses.atlas.outputs import COLUMNS

TOP = 5  # heads listed per type
DECODER_ONLY = {"retrieval": "decoders only (needle-in-a-haystack answers)",
                "streaming-safe": "decoders only (StreamingLLM's sink and recent window are a causal cache's)"}
NOT_MEASURED = "not measured in this run"
PENDING = {  # the columns of the kernels' newest statistics, which a run may lack, and where they come from
    "duplicate_mass": "the duplicate-token mass on the corpus",
    "prefix_match_mass": "the prefix-match mass on the corpus",
    "streaming_error": "the streaming error",
}


def _col(table: dict, name: str) -> np.ndarray:
    return np.asarray(table.get(name, []), dtype=float)


def _head(table: dict, i: int) -> str:
    return f"{table['layer'][i]}-{table['head'][i]}"


def status(table: dict, about: dict) -> dict[str, str]:
    """type -> "" when measured, else why not: an encoder's decoder-only type, or not measured."""
    measured = T.measured({k: _col(table, k) for k in table if k not in ("model", "attention", "types")})
    out = {}
    for name in T.TYPES:
        if measured[name]:
            out[name] = ""
        elif not about["decoder"] and name in DECODER_ONLY:
            out[name] = f"not applicable: {DECODER_ONLY[name]}"
        else:
            out[name] = NOT_MEASURED
    return out


def top_heads(table: dict, name: str, n: int = TOP) -> list[dict]:
    """The `n` heads with the strongest score of a type's rule (lowest for an error), typed or not."""
    rule = T.RULE[name]
    x = _col(table, rule.column)
    ok = np.isfinite(x)
    if not ok.any():
        return []
    order = np.argsort(np.where(ok, x if rule.below else -x, np.inf), kind="stable")[: min(n, int(ok.sum()))]
    flags = table[f"type_{name}"]
    return [{"head": _head(table, int(i)), "score": float(x[i]), "typed": bool(flags[i])} for i in order]


def headline(table: dict, about: dict) -> dict:
    """run.json's results: the model's shape, the type counts (None: not measured), the top heads."""
    n = len(table["layer"])
    why = status(table, about)
    counts = {name: (int(sum(table[f"type_{name}"])) if not why[name] else None) for name in T.TYPES}
    return {**{k: about[k] for k in ("model", "decoder", "layers", "heads", "kv_heads", "kinds", "segments", "tokens",
                                      "max_len", "quantised")},
            "n_heads": n, "typed": int(sum(1 for t in table["types"] if t)), "counts": counts,
            "not_measured": {k: v for k, v in why.items() if v},
            "pending_columns": [c for c in PENDING if not np.isfinite(_col(table, c)).any()
                                and (about["decoder"] or c != "streaming_error")],
            "thresholds": {r.name: {"column": r.column, "threshold": r.threshold,
                                    "at_most" if r.below else "at_least": True} for r in T.RULES},
            "top": {name: top_heads(table, name) for name in T.TYPES if not why[name]},
            "stage_seconds": about.get("seconds", {})}


def summary_lines(results: dict) -> list[str]:
    counts = ", ".join(f"{name} {c}" for name, c in results["counts"].items() if c is not None)
    lines = [f"{results['model']}: {results['layers']} layers x {results['heads']} heads ({results['kv_heads']} KV "
             f"heads); {results['typed']} of {results['n_heads']} heads typed: {counts}"]
    for name, why in results["not_measured"].items():
        lines.append(f"{name}: {why}")
    for name, top in results["top"].items():
        lines.append(f"top {name}: " + ", ".join(f"{t['head']} {t['score']:.3f}" for t in top))
    return lines


def shape_rows(about: dict) -> list[tuple[str, str]]:
    kinds = about["kinds"]
    groups = {}
    for i, k in enumerate(kinds):
        groups.setdefault(k, []).append(i + 1)
    attention = "; ".join(f"{k}: {_ranges(v)}" for k, v in groups.items())
    rows = [("model", about["model"] + (f" ({about['quantised']} weights: every number below is of the 4-bit "
                                        "model)" if about.get("quantised") else "")),
            ("kind", "decoder (causal)" if about["decoder"] else "encoder (bidirectional)"),
            ("layers", str(about["layers"])), ("query heads per layer", str(about["heads"])),
            ("key/value heads per layer", str(about["kv_heads"])), ("attention by layer", attention)]
    return rows


def run_rows(about: dict) -> list[tuple[str, str]]:
    rows = [("streamed pass", f"{about['segments']} segments of up to {about['max_len']} tokens of "
             f"{'Wikipedia' if about['corpus'] == 'wiki' else about['corpus']} ({about['tokens']:,} query rows)"),
            ("induction probe", f"{about['induction']['sequences']} sequences of 2 x {about['induction']['seq_len']} "
             "random tokens, repeated once")]
    r = about.get("retrieval")
    rows.append(("retrieval probe", "not applicable: an encoder" if not about["decoder"] else "not run" if r is None
                 else f"needle(s) {', '.join(r['needles'])}, length(s) {', '.join(map(str, r['lengths']))}, depths "
                 f"{r['depths']}: {r['answered']['answered']} of {r['answered']['haystacks']} haystacks answered"
                 + ("" if r['answered']['answered'] else " (the scores are then over every haystack)")))
    imp = about.get("importance")
    rows.append(("LM importance", "not applicable: an encoder" if not about["decoder"] else "not run" if imp is None
                 else f"{imp['segments']} segments of {imp['max_len']} tokens"))
    if about["decoder"]:
        rows.append(("streaming error", f"sink S = {about['streaming'][0]}, recent W = {about['streaming'][1]}"))
    return rows


def type_rows(table: dict, about: dict) -> list[tuple[str, str, str, str]]:
    """(type, rule, heads, what) per type."""
    why = status(table, about)
    n = len(table["layer"])
    out = []
    for r in T.RULES:
        rule = f"{r.column} {'<=' if r.below else '>='} {r.threshold:g}"
        count = why[r.name] or f"{sum(table[f'type_{r.name}'])} of {n}"
        out.append((f"{r.letter} {r.name}", rule, count, r.what))
    return out


def pending_lines(table: dict, about: dict, code: str = "`") -> list[str]:
    """The pending columns that are empty in this run (an encoder's streaming error is not applicable,
    and said so above, not here)."""
    return [f"{code}{c}{code} ({what}): {NOT_MEASURED}" for c, what in PENDING.items()
            if not np.isfinite(_col(table, c)).any() and (about["decoder"] or c != "streaming_error")]


def markdown(table: dict, about: dict, results: dict, figures: dict[str, str]) -> str:
    out = [f"# Head card: {about['model']}", ""]
    out += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in shape_rows(about) + run_rows(about)] + [""]
    if not about["decoder"]:
        out += ["An encoder: its first token is [CLS] and the sink type reads the [CLS] + [SEP] mass; retrieval and "
                "LM importance are decoders' probes and are not run; the streaming error is a causal cache's and is "
                "not measured.", ""]
    out += ["## Types", "", "Fixed thresholds (analyses/atlas/head_types.py says why each has its value); a head "
            "may carry several types.", "", "| type | rule | heads | what |", "|---|---|---|---|"]
    out += [f"| {a} | `{b}` | {c} | {d} |" for a, b, c, d in type_rows(table, about)] + [""]
    pend = pending_lines(table, about)
    if pend:
        out += ["Columns of atlas_heads.csv left empty:", ""] + [f"- {p}" for p in pend] + [""]
    if "grid" in figures:
        out += ["## Every head", "", f"![grid]({figures['grid']})", "",
                "*Every head (columns) of every layer (rows), coloured by its first type in the order of the table "
                "above; the letters are all its types; grey: none.*", ""]
    if "layers" in figures:
        out += ["## Per layer", "", f"![layers]({figures['layers']})", "",
                f"*{LAYERS_CAPTION}*", ""]
    out += ["## Top heads of each type", "", "Layer-head from 1; the score is the type's rule column; a * marks a "
            "head over the threshold.", "", "| type | heads (score) |", "|---|---|"]
    for name in T.TYPES:
        top = results["top"].get(name)
        cell = status(table, about)[name] if top is None else \
            ", ".join(f"{t['head']} ({t['score']:.3f}{'*' if t['typed'] else ''})" for t in top)
        out.append(f"| {name} | {cell} |")
    out += ["", "Units of every column: docs/atlas.md. Made by `bertscope atlas`."]
    return "\n".join(out) + "\n"


def _img(path: Path | None) -> str:
    if path is None or not Path(path).is_file():
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{H.escape(Path(path).name)}" src="data:image/png;base64,{data}">'


def grid_html(table: dict) -> str:
    """The grid as an HTML table: a cell per head, coloured by its first type, its letters inside,
    every column of the head in the tooltip."""
    layers, heads = max(table["layer"]), max(table["head"])
    first = T.first_type({name: np.asarray(table[f"type_{name}"], bool) for name in T.TYPES})
    show = ("types", "sink_mass", "prev_mass", "induction_score", "duplicate_score", "retrieval_score",
            "local_mass", "entropy_ratio", "mean_distance", "streaming_error", "importance")
    rows = ["<tr><th>layer \\ head</th>" + "".join(f"<th>{h}</th>" for h in range(1, heads + 1)) + "</tr>"]
    for layer in range(1, layers + 1):
        cells = []
        for h in range(1, heads + 1):
            i = (layer - 1) * heads + (h - 1)
            colour = T.RULE[first[i]].colour if first[i] else T.NONE_COLOUR
            letters = "".join(T.RULE[n].letter for n in T.TYPES if table[f"type_{n}"][i])
            tip = "\n".join(f"{k}: {_fmt(table[k][i])}" for k in show if k in table)
            cells.append(f'<td style="background:{colour}" title="{H.escape(f"{layer}-{h}" + chr(10) + tip)}">'
                         f"{H.escape(letters)}</td>")
        rows.append(f"<tr><th>{layer}</th>{''.join(cells)}</tr>")
    return f'<table class="grid">{"".join(rows)}</table>'


LAYERS_CAPTION = ("Per layer, mean over its heads: the sink, previous-token and local (distance < 8) mass and the "
                  "entropy over its uniform baseline (left); the mean distance (middle; log scale when it spans a "
                  "decade); the heads of each type (right; a head of several types counts in each).")


def _figure(path, caption: str) -> str:
    img = _img(path)
    return f"<figure>{img}<figcaption>{H.escape(caption)}</figcaption></figure>" if img else ""


def _fmt(x) -> str:
    if isinstance(x, str):
        return x or "-"
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def html(table: dict, about: dict, results: dict, run_dir: Path, figures: dict) -> str:
    def rows(pairs):
        return "".join(f"<tr><th>{H.escape(a)}</th><td>{H.escape(b)}</td></tr>" for a, b in pairs)

    legend = "".join(f'<span class="key" style="background:{r.colour}">{r.letter} {H.escape(r.name)}</span>'
                     for r in T.RULES)
    types = "".join(f"<tr><td>{H.escape(a)}</td><td><code>{H.escape(b)}</code></td><td>{H.escape(c)}</td>"
                    f"<td>{H.escape(d)}</td></tr>" for a, b, c, d in type_rows(table, about))
    tops = ""
    why = status(table, about)
    for name in T.TYPES:
        top = results["top"].get(name)
        cell = why[name] if top is None else \
            ", ".join(f"{t['head']} ({t['score']:.3f}{'*' if t['typed'] else ''})" for t in top)
        tops += f"<tr><td>{H.escape(name)}</td><td>{H.escape(cell)}</td></tr>"
    pend = "".join(f"<li>{H.escape(p)}</li>" for p in pending_lines(table, about, code=""))
    encoder = ("<p>An encoder: its first token is [CLS] and the sink type reads the [CLS] + [SEP] mass; retrieval "
               "and LM importance are decoders' probes and are not run; the streaming error is a causal cache's and "
               "is not measured.</p>" if not about["decoder"] else "")
    units = "".join(f"<tr><td><code>{H.escape(k)}</code></td><td>{H.escape(u)}</td><td>{H.escape(w)}</td></tr>"
                    for k, (u, w) in COLUMNS.items())
    figs = {k: v for k, v in (figures or {}).items() if v}
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Head card: {H.escape(about['model'])}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: left; font-size: 14px; }}
table.grid td {{ width: 28px; height: 22px; text-align: center; font-size: 11px; font-family: monospace; }}
.key {{ display: inline-block; padding: 2px 6px; margin: 2px; font-size: 13px; }}
img {{ max-width: 100%; }} figcaption {{ font-style: italic; font-size: 14px; }}
</style></head><body>
<h1>Head card: {H.escape(about['model'])}</h1>
<table>{rows(shape_rows(about) + run_rows(about))}</table>
{encoder}
<h2>Types</h2>
<p>Fixed thresholds (analyses/atlas/head_types.py says why each has its value); a head may carry several types.</p>
<table><tr><th>type</th><th>rule</th><th>heads</th><th>what</th></tr>{types}</table>
{f'<p>Columns of atlas_heads.csv left empty:</p><ul>{pend}</ul>' if pend else ''}
<h2>Every head</h2>
<p>{legend}</p>
{grid_html(table)}
<p><small>Hover a cell for the head's numbers. Colour: its first type in the order of the table above; letters:
all its types.</small></p>
{_figure(figs.get("grid"), "The same grid as a figure.")}
<h2>Per layer</h2>
{_figure(figs.get("layers"), LAYERS_CAPTION)}
<h2>Top heads of each type</h2>
<p>Layer-head from 1; the score is the type's rule column; * marks a head over the threshold.</p>
<table><tr><th>type</th><th>heads (score)</th></tr>{tops}</table>
<h2>Columns of atlas_heads.csv</h2>
<table><tr><th>column</th><th>unit</th><th>what</th></tr>{units}
<tr><td><code>d_0 .. d_32768+</code></td><td>probability mass, 0-1</td>
<td>the distance profile: mass per log2 distance bucket</td></tr></table>
</body></html>
"""


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3, 5"."""
    out, start, prev = [], None, None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = v
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(out)
