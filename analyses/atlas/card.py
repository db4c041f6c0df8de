"""The head card of one model: Markdown (atlas_card.md) and one self-contained HTML page
(atlas_card.html, its figures embedded): the model's shape, the run, the types with their
thresholds and counts, the grid of every head, the sink heads' weight against their norm share
(the no-op sinks), the per-layer profiles and the top heads of each type; what was not measured
says so. Also run.json's headline (`headline`) and the terminal's lines.
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
NORMS_OFF = ("the norm-based twins were not computed: --no-norms, or the triton backend without --norms "
             "(docs/norms.md)")
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
    """type -> "" when measured, else why not: an encoder's decoder-only type, a retrieval probe with
    fewer than `head_types.MIN_ANSWERED` answered haystacks, or not measured."""
    measured = T.measured({k: _col(table, k) for k in table if k not in ("model", "attention", "types")})
    out = {}
    for name in T.TYPES:
        if measured[name]:
            out[name] = ""
        elif not about["decoder"] and name in DECODER_ONLY:
            out[name] = f"not applicable: {DECODER_ONLY[name]}"
        elif name == "retrieval" and (about.get("retrieval") or {}).get("answered"):
            out[name] = too_few_answered(about["retrieval"]["answered"])
        elif T.RULE[name].column.endswith("_norm"):
            out[name] = f"{NOT_MEASURED} ({NORMS_OFF})"
        else:
            out[name] = NOT_MEASURED
    return out


def too_few_answered(answered: dict) -> str:
    """Why the retrieval type is not measured: too few answered haystacks."""
    return (f"not measured: {answered['answered']} of {answered['haystacks']} haystacks answered, and a retrieval "
            f"type needs at least {T.MIN_ANSWERED} (Wu et al.'s retrieval score is a mean over the retrievals that "
            "succeed; a haystack the model does not answer scores no head)")


def top_heads(table: dict, name: str, n: int = TOP) -> list[dict]:
    """The `n` heads with the strongest score of a type's rule (lowest for an error), typed or not; for a
    type that refines another (`Rule.within`), among that type's heads only (the no-op sinks' lowest norm
    shares among the sinks, not among heads that never attend to the sink)."""
    rule = T.RULE[name]
    x = _col(table, rule.column)
    ok = np.isfinite(x)
    if rule.within:
        ok &= np.asarray(table[f"type_{rule.within}"], bool)
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
                                    "at_most" if r.below else "at_least": True, **({"within": r.within} if r.within
                                                                                   else {})} for r in T.RULES},
            "top": {name: top_heads(table, name) for name in T.TYPES if not why[name]},
            "overlap": [{"types": [a, b], "heads": k} for a, b, k in overlap(table)],
            "top_importance": top_importance(table),
            "corpus_rows": about.get("corpus_rows"),
            "retrieval_probe": about.get("retrieval"),
            "stage_seconds": about.get("seconds", {})}


def overlap(table: dict) -> list[tuple[str, str, int]]:
    """The pairs of types that share heads, with how many (`head_types.overlap`)."""
    return T.overlap({name: np.asarray(table[f"type_{name}"], bool) for name in T.TYPES})


def top_importance(table: dict, n: int = TOP) -> list[dict]:
    """The `n` heads with the largest LM importance (not a type: no threshold), [] where not measured."""
    x = _col(table, "importance")
    ok = np.isfinite(x)
    if not ok.any():
        return []
    order = np.argsort(np.where(ok, -x, np.inf), kind="stable")[: min(n, int(ok.sum()))]
    return [{"head": _head(table, int(i)), "score": float(x[i])} for i in order]


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


def induction_text(induction: dict) -> str:
    """The induction probe's input in words, its length said: "8 sequences of 129 tokens each: a BOS, then 64
    random tokens, then the same 64 again"."""
    t, first = induction["seq_len"], induction.get("first")
    n = 2 * t + (first is not None)
    return (f"{induction['sequences']} sequences of {n} tokens each: " + (f"{first}, then " if first else "")
            + f"{t} random tokens, then the same {t} again")


def retrieval_text(r: dict) -> str:
    """The retrieval probe's haystacks and how many were answered, in words."""
    a = r["answered"]
    how = (" in the model's own words (greedy decoding, as `heads retrieval --answer greedy`: its answer recalls "
           "more than half of the reference answer's words, Wu et al.'s criterion)" if r.get("answer") == "greedy"
           else " (the reference answer copied exactly)")
    text = (f"needle(s) {', '.join(r['needles'])}, length(s) {', '.join(map(str, r['lengths']))}, depths "
            f"{r['depths']}: {a['answered']} of {a['haystacks']} haystacks answered{how}")
    if a["answered"] < T.MIN_ANSWERED:
        text += f"; fewer than {T.MIN_ANSWERED}, so the retrieval type is not measured"
    return text


def corpus_rows_text(counts: list[int]) -> str:
    """Per-layer row counts in words: "15,599 (every layer)", or "12,000 (layers 1-5), 15,599 (layer 6)"."""
    groups: dict[int, list[int]] = {}
    for i, c in enumerate(counts):
        groups.setdefault(int(c), []).append(i + 1)
    def rows(c: int) -> str:
        return f"{c:,} row{'' if c == 1 else 's'}"
    if len(groups) == 1:
        return f"{rows(int(counts[0]))} (every layer)"
    return ", ".join(f"{rows(c)} (layer{'s' if len(v) > 1 else ''} {_ranges(v)})" for c, v in groups.items())


def run_rows(about: dict) -> list[tuple[str, str]]:
    rows = [("streamed pass", f"{about['segments']} segments of up to {about['max_len']} tokens of "
             f"{'Wikipedia' if about['corpus'] == 'wiki' else about['corpus']} ({about['tokens']:,} query rows)")]
    counts = about.get("corpus_rows")
    if counts:
        rows += [("duplicate_mass is over", corpus_rows_text(counts["duplicate_rows"])
                  + " of the pass: those with an earlier copy of their token among the keys they see"),
                 ("prefix_match_mass is over", corpus_rows_text(counts["prefix_match_rows"])
                  + " of the pass: those that see a key right after an earlier copy of their token")]
    rows.append(("induction probe", induction_text(about["induction"])))
    r = about.get("retrieval")
    rows.append(("retrieval probe", "not applicable: an encoder" if not about["decoder"] else "not run" if r is None
                 else retrieval_text(r)))
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
        count = why[r.name] or f"{sum(table[f'type_{r.name}'])} of {n}"
        out.append((f"{r.letter} {r.name}", r.text(), count, r.what))
    return out


# --- the sinks by weight and by norm (Kobayashi et al. 2020) -------------------------------------------------

NOOP = T.RULE["no-op-sink"]
SINK = T.RULE[NOOP.within]


def sink_norm_intro(about: dict) -> str:
    """What the sink table shows, in words, with the no-op sink's bar."""
    where = "the first token" if about["decoder"] else "[CLS] and [SEP]"
    return (f"Attention is one factor of a head's output sum_j a_ij f(x_j); the length of the key's transformed "
            f"value vector, ||f(x_j)||, is the other (Kobayashi et al. 2020, docs/norms.md). For each sink head "
            f"({SINK.text()}): its weight on {where} ({SINK.column}) beside their share of its weighted value norms "
            f"sum_j a_ij ||f(x_j)|| ({NOOP.column}). A no-op sink ({NOOP.letter}) has a norm share of at most "
            f"{NOOP.threshold:g}: it parks its attention on vectors so short that the parking adds little to its "
            "output.")


def sink_norm_rows(table: dict) -> list[tuple[str, float, float, float, bool]]:
    """(head, weight, norm share, norm / weight, no-op sink) for every sink head, layer-major; [] when the norm
    shares were not measured."""
    norm = _col(table, NOOP.column)
    if not np.isfinite(norm).any():
        return []
    weight = _col(table, SINK.column)
    sinks = np.flatnonzero(np.asarray(table[f"type_{SINK.name}"], bool))
    noop = np.asarray(table[f"type_{NOOP.name}"], bool)
    return [(_head(table, int(i)), float(weight[i]), float(norm[i]),
             float(norm[i] / weight[i]) if weight[i] > 0 else math.nan, bool(noop[i])) for i in sinks]


def noop_sink_line(table: dict, about: dict) -> str:
    """The no-op sinks in one line ("2 of 3 sink heads are no-op sinks: 1-1, 2-3"), or why there are none."""
    why = status(table, about)[NOOP.name]
    if why:
        return f"No-op sinks: {why}."
    rows = sink_norm_rows(table)
    noop = [r[0] for r in rows if r[4]]
    if not rows:
        return "No sink head, so no no-op sink."
    return (f"{len(noop)} of {len(rows)} sink heads {'is a no-op sink' if len(noop) == 1 else 'are no-op sinks'}"
            + (f": {', '.join(noop)}." if noop else "."))


def pending_lines(table: dict, about: dict, code: str = "`") -> list[str]:
    """The pending columns that are empty in this run (an encoder's streaming error is not applicable,
    and said so above, not here)."""
    return [f"{code}{c}{code} ({what}): {NOT_MEASURED}" for c, what in PENDING.items()
            if not np.isfinite(_col(table, c)).any() and (about["decoder"] or c != "streaming_error")]


def overlap_rows(table: dict, about: dict) -> list[tuple[str, str, str]]:
    """(type pair, heads of both, what share of each type's heads that is), for every pair of measured
    types that share a head; the largest first."""
    n = {name: int(sum(table[f"type_{name}"])) for name in T.TYPES}
    return [(f"{a} + {b}", str(k), f"{k} of {n[a]} {a}, {k} of {n[b]} {b}") for a, b, k in overlap(table)]


OVERLAP_INTRO = ("A head carries every type whose rule it meets, so the types overlap: these pairs share heads (a "
                 "head of three types counts in each of its three pairs).")


def legend_text() -> str:
    """The grid's letters, e.g. "R retrieval, I induction, ..., S sink, ..., W streaming-safe"."""
    return ", ".join(f"{r.letter} {r.name}" for r in T.RULES)


def importance_status(about: dict) -> str:
    """Why a run has no LM importance, or "" when it has."""
    if not about["decoder"]:
        return "not applicable: an encoder (LM importance reads a decoder's language-modelling loss)"
    return "" if about.get("importance") else "not run (--no-importance)"


def importance_grid(table: dict) -> list[list[float]]:
    """(layers, heads) LM importance, layer-major, NaN where not measured."""
    layers, heads = max(table["layer"]), max(table["head"])
    return _col(table, "importance").reshape(layers, heads).tolist()


IMPORTANCE_WHAT = ("Michel et al.'s I_h = E|dL/dxi_h| with the language-modelling loss, L2-normalised per layer (each "
                   "layer's heads squared sum to 1): how much the loss moves when the head's gate moves. Not a type: "
                   "no threshold.")


def importance_top_cell(results: dict, about: dict) -> str:
    """The top-heads table's LM importance cell: the heads of the largest I_h, or why there are none."""
    imp = results.get("top_importance") or []
    return ", ".join(f"{t['head']} ({t['score']:.3f})" for t in imp) or importance_status(about) or NOT_MEASURED


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
    pairs = overlap_rows(table, about)
    out += ["## Types that share heads", "", OVERLAP_INTRO, ""]
    out += (["| types | heads of both | of each type |", "|---|---|---|"]
            + [f"| {a} | {b} | {c} |" for a, b, c in pairs] if pairs else ["No head carries two types."]) + [""]
    pend = pending_lines(table, about)
    if pend:
        out += ["Columns of atlas_heads.csv left empty:", ""] + [f"- {p}" for p in pend] + [""]
    out += ["## Sinks: weight against norm", "", sink_norm_intro(about), "", noop_sink_line(table, about), ""]
    sinks = sink_norm_rows(table)
    if sinks:
        out += [f"| head | {SINK.column} (weight) | {NOOP.column} (norm) | norm / weight | no-op sink |",
                "|---|---|---|---|---|"]
        out += [f"| {h} | {_fmt(w)} | {_fmt(x)} | {_fmt(q, 2)} | {'yes' if k else ''} |" for h, w, x, q, k in sinks]
        out += [""]
    if "grid" in figures:
        out += ["## Every head", "", f"![grid]({figures['grid']})", "",
                "*Every head (columns) of every layer (rows), coloured by its first type in the order of the table "
                f"above; the letters are all its types ({legend_text()}); grey: none.*", ""]
    if "layers" in figures:
        out += ["## Per layer", "", f"![layers]({figures['layers']})", "",
                f"*{layers_caption(about)}*", ""]
    out += ["## LM importance", ""]
    why = importance_status(about)
    if why or not np.isfinite(_col(table, "importance")).any():
        out += [why or NOT_MEASURED, ""]
    else:
        grid = importance_grid(table)
        out += [IMPORTANCE_WHAT, "", "| layer \\ head | " + " | ".join(str(h + 1) for h in range(len(grid[0]))) + " |",
                "|---" * (len(grid[0]) + 1) + "|"]
        out += [f"| {i + 1} | " + " | ".join(_fmt(x, 2) for x in row) + " |" for i, row in enumerate(grid)] + [""]
    out += ["## Top heads of each type", "", "Layer-head from 1; the score is the type's rule column; a * marks a "
            "head over the threshold.", "", "| type | heads (score) |", "|---|---|"]
    for name in T.TYPES:
        top = results["top"].get(name)
        cell = status(table, about)[name] if top is None else \
            ", ".join(f"{t['head']} ({t['score']:.3f}{'*' if t['typed'] else ''})" for t in top)
        out.append(f"| {name} | {cell} |")
    out.append(f"| LM importance (not a type) | {importance_top_cell(results, about)} |")
    out += ["", "Units of every column: docs/atlas.md. The CSV files hold every number at full precision, as the "
            "Parquet file does. Made by `bertscope atlas`."]
    return "\n".join(out) + "\n"


def _img(path: Path | None) -> str:
    if path is None or not Path(path).is_file():
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{H.escape(Path(path).name)}" src="data:image/png;base64,{data}">'


def importance_html(table: dict, about: dict) -> str:
    """LM importance as an HTML grid (a cell per head, its value printed, shaded by it), or why there is none."""
    why = importance_status(about)
    grid = importance_grid(table)
    finite = [x for row in grid for x in row if math.isfinite(x)]
    if why or not finite:
        return f"<p>{H.escape(why or NOT_MEASURED)}</p>"
    top = max(max(finite), 1e-12)
    rows = ["<tr><th>layer \\ head</th>" + "".join(f"<th>{h + 1}</th>" for h in range(len(grid[0]))) + "</tr>"]
    for i, row in enumerate(grid):
        cells = "".join(f'<td style="background:rgba(214,39,40,{max(0.0, x) / top:.2f})">{_fmt(x, 2)}</td>'
                        if math.isfinite(x) else "<td>-</td>" for x in row)
        rows.append(f"<tr><th>{i + 1}</th>{cells}</tr>")
    return f"<p>{H.escape(IMPORTANCE_WHAT)}</p><table class=\"grid\">{''.join(rows)}</table>"


def grid_html(table: dict) -> str:
    """The grid as an HTML table: a cell per head, coloured by its first type, its letters inside,
    every column of the head in the tooltip."""
    layers, heads = max(table["layer"]), max(table["head"])
    first = T.first_type({name: np.asarray(table[f"type_{name}"], bool) for name in T.TYPES})
    show = ("types", "sink_mass", "sink_mass_norm", "prev_mass", "induction_score", "duplicate_score",
            "retrieval_score", "local_mass", "entropy_ratio", "mean_distance", "streaming_error", "importance")
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


LAYERS_CAPTION = ("Per layer, mean over its heads: the sink mass (and, dashed, its norm-based twin where the run "
                  "computed it), the previous-token and local (distance < 8) mass and the "
                  "entropy over its uniform baseline (left); the mean distance (middle; log scale when it spans a "
                  "decade); the heads of each type (right; a head of several types counts in each).")


def windowed(kinds) -> bool:
    """Whether any layer has a sliding window (its `attention` is not "global")."""
    return any(k != "global" for k in kinds or ())


def layers_caption(about: dict) -> str:
    """`LAYERS_CAPTION`, naming the grey sliding-window layers only where the model has some."""
    if not windowed(about.get("kinds")):
        return LAYERS_CAPTION
    return LAYERS_CAPTION.replace("(middle;", "(middle; the sliding-window layers shaded grey;")


def _figure(path, caption: str) -> str:
    img = _img(path)
    return f"<figure>{img}<figcaption>{H.escape(caption)}</figcaption></figure>" if img else ""


def _fmt(x, digits: int = 3) -> str:
    if isinstance(x, str):
        return x or "-"
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


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
    tops += f"<tr><td>LM importance (not a type)</td><td>{H.escape(importance_top_cell(results, about))}</td></tr>"
    pend = "".join(f"<li>{H.escape(p)}</li>" for p in pending_lines(table, about, code=""))
    sinks = "".join(f"<tr><td>{H.escape(h)}</td><td>{_fmt(w)}</td><td>{_fmt(x)}</td><td>{_fmt(q, 2)}</td>"
                    f"<td>{'yes' if k else ''}</td></tr>" for h, w, x, q, k in sink_norm_rows(table))
    sinks = (f"<table><tr><th>head</th><th>{SINK.column} (weight)</th><th>{NOOP.column} (norm)</th>"
             f"<th>norm / weight</th><th>no-op sink</th></tr>{sinks}</table>") if sinks else ""
    encoder = ("<p>An encoder: its first token is [CLS] and the sink type reads the [CLS] + [SEP] mass; retrieval "
               "and LM importance are decoders' probes and are not run; the streaming error is a causal cache's and "
               "is not measured.</p>" if not about["decoder"] else "")
    units = "".join(f"<tr><td><code>{H.escape(k)}</code></td><td>{H.escape(u)}</td><td>{H.escape(w)}</td></tr>"
                    for k, (u, w) in COLUMNS.items())
    figs = {k: v for k, v in (figures or {}).items() if v}
    pairs = overlap_rows(table, about)
    shared = ("<table><tr><th>types</th><th>heads of both</th><th>of each type</th></tr>"
              + "".join(f"<tr><td>{H.escape(a)}</td><td>{b}</td><td>{H.escape(c)}</td></tr>" for a, b, c in pairs)
              + "</table>") if pairs else "<p>No head carries two types.</p>"
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
<h2>Types that share heads</h2>
<p>{H.escape(OVERLAP_INTRO)}</p>
{shared}
{f'<p>Columns of atlas_heads.csv left empty:</p><ul>{pend}</ul>' if pend else ''}
<h2>Sinks: weight against norm</h2>
<p>{H.escape(sink_norm_intro(about))}</p>
<p>{H.escape(noop_sink_line(table, about))}</p>
{sinks}
<h2>Every head</h2>
<p>{legend}</p>
{grid_html(table)}
<p><small>Hover a cell for the head's numbers. Colour: its first type in the order of the table above; letters:
all its types ({H.escape(legend_text())}).</small></p>
{_figure(figs.get("grid"), "The same grid as a figure.")}
<h2>Per layer</h2>
{_figure(figs.get("layers"), layers_caption(about))}
<h2>LM importance</h2>
{importance_html(table, about)}
<h2>Top heads of each type</h2>
<p>Layer-head from 1; the score is the type's rule column; * marks a head over the threshold.</p>
<table><tr><th>type</th><th>heads (score)</th></tr>{tops}</table>
<h2>Columns of atlas_heads.csv</h2>
<table><tr><th>column</th><th>unit</th><th>what</th></tr>{units}
<tr><td><code>d_0 .. d_32768+</code></td><td>probability mass, 0-1</td>
<td>the distance profile: mass per log2 distance bucket; empty where no row of the layer could reach the bucket
(beyond the longest segment or the layer's window)</td></tr></table>
<p>Every number of the CSV files is written in full, as in atlas_heads.parquet. atlas_layers.csv's columns,
n_&lt;type&gt; and duplicate_rows included: docs/atlas.md.</p>
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
