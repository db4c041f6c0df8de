"""The report's sections, one per analysis (see bertscope.report for the registry).

Each builder gets a `RunFiles` and returns a `Section`, or None when its files are not in
the run directory: a missing analysis is skipped, never an error. Findings are sentences
generated from the run's numbers, with the paper's number beside ours where it has one.
"""
from __future__ import annotations

import html
import math
import zipfile

import numpy as np

from bertscope import paper_numbers as paper
from bertscope.report import section
from bertscope.report_page import Figure, RunFiles, Section, Table, heads_str, num, pct
from bertscope.segments import describe_lengths

PREV_NEXT_CUT = 0.5  # "> 50% of attention on the previous / next token" (Clark 3.1)
SEP_SEP_CUT = 0.9  # "[SEP] attends to [SEP] with > 90%" (Clark 3.2)


# ----------------------------------------------------------------------------- provenance

@section("provenance")
def provenance(run: RunFiles) -> Section:
    r = run.record
    model = r.get("model") or {}
    rows = [("status", r.get("status")), ("command", r.get("command")),
            ("bertscope", r.get("bertscope_version")),
            ("model", f"{model.get('path')} ({model.get('type')}, {model.get('layers')} layers x "
                      f"{model.get('heads')} heads)" if model else None),
            ("tokens", r.get("n_tokens")), ("elapsed (s)", r.get("elapsed_s")),
            ("kernel", r.get("kernel")), ("attention output", r.get("output")),
            ("processes", r.get("world_size"))]
    for group in ("corpus", "segments", "versions", "settings"):
        for k, v in (r.get(group) or {}).items():
            rows.append((f"{group}: {k}", describe_lengths(v) if k == "lengths" and v else v))
    rows.append(("outputs", ", ".join(r.get("outputs") or [])))
    probes = r.get("probes") or {}
    for name, p in probes.items():
        rows.append((f"probe {name}", f"{p.get('status')}, command: {p.get('command', '?')}"))
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td style=\"text-align:left\">{html.escape(str(v))}</td></tr>"
                    for k, v in rows if v not in (None, "", {}))
    return Section("Settings and provenance", intro="From run.json: what was run, on what, with which versions.",
                   raw_html=f"<table>{cells}</table>")


# ----------------------------------------------------------------------------- surface

SURFACE_FIGURES = {
    "fig_tokens_by_layer.png": (
        "Average attention to [CLS], [SEP] and '. or ,' by layer (Clark et al. Fig. 2). Each dot is one head, "
        "the line the layer mean; the last panel separates [SEP] rows attending to [SEP] from all other rows. "
        "Read it for where each special token takes the attention: in bert-base, [CLS] early, [SEP] in layers "
        "6-10, punctuation at the end."),
    "fig_entropy_by_layer.png": (
        "Mean attention entropy in nats by layer, over all rows and over [CLS] rows only (Clark et al. Fig. 4). "
        "Dots are heads; the dashed line is the entropy of uniform attention over the same tokens. Heads near "
        "it attend broadly (a bag of vectors), low values mean focused heads."),
    "fig_offsets_heatmap.png": (
        "Layer x head attention mass on the previous, same and next token. A bright cell above 0.5 is a "
        "positional head (Clark et al. section 3.1: four previous-token and five next-token heads in bert-base)."),
    "fig_special_heatmap.png": (
        "Layer x head attention mass on [CLS], [SEP], '. or ,' and, for [SEP] rows, on [SEP]. Bright "
        "columns of a layer show which special token that layer's heads lean on."),
    "fig_entropy_heatmap.png": (
        "Layer x head mean attention entropy in nats (Clark et al. Fig. 4, head by head). Bright: broad heads, "
        "dark: heads that put their attention on a few tokens."),
}


def _grid(rows: list[dict], col: str, layers: int, heads: int) -> np.ndarray:
    g = np.full((layers, heads), np.nan)
    for r in rows:
        v = num(r.get(col))
        if v is not None:
            g[int(r["layer"]) - 1, int(r["head"]) - 1] = v
    return g


def _over(grid: np.ndarray, cut: float) -> list[str]:
    return [f"{i + 1}-{j + 1}" for i, j in zip(*np.nonzero(np.nan_to_num(grid, nan=-np.inf) > cut))]


def _uniform_entropy(run: RunFiles) -> float | None:
    """Entropy of uniform attention over the run's rows, from stats.npz (exact), else None."""
    if not run.has("stats.npz"):
        return None
    try:
        from bertscope.accumulate import HeadStats

        return HeadStats.load(run.dir / "stats.npz").uniform_entropy()
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # an unreadable checkpoint only costs the broad-head finding
        return None


@np.errstate(invalid="ignore")
def surface_findings(rows: list[dict], uniform: float | None) -> tuple[list[str], Table]:
    """The findings list and the per-layer table of the surface analysis. A layer whose heads
    were all removed (bertscope.head_removal) is NaN throughout: its means are NaN, quietly."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        return _surface_findings(rows, uniform)


def _surface_findings(rows: list[dict], uniform: float | None) -> tuple[list[str], Table]:
    layers = max(int(r["layer"]) for r in rows)
    heads = max(int(r["head"]) for r in rows)
    g = {c: _grid(rows, c, layers, heads) for c in ("prev", "next", "cls", "sep", "punct", "entropy",
                                                    "sep_sep", "rest_sep", "cls_entropy")}
    S, T = paper.SURFACE_NUMBERS, paper.SURFACE_TEXT
    out = []
    for col, name in (("prev", "previous"), ("next", "next")):
        hits = _over(g[col], PREV_NEXT_CUT)
        out.append(f"{len(hits)} {name}-token heads (more than {pct(PREV_NEXT_CUT)} of their attention on the "
                   f"{name} token): {heads_str(hits)}. Paper: {T[col + '_heads']} [{S[col + '_heads'].source.short}].")
    if uniform:
        from bertscope.analyses.cluster import Thresholds

        cut = Thresholds.broad * uniform
        broad = _over(g["entropy"], cut)
        out.append(f"{len(broad)} broad heads (mean entropy above {Thresholds.broad:.0%} of uniform attention's "
                   f"{uniform:.2f} nats): {heads_str(broad)}.")
    flat = np.nan_to_num(g["entropy"], nan=np.inf).ravel()
    low = [f"{i // heads + 1}-{i % heads + 1} ({g['entropy'].ravel()[i]:.2f})" for i in np.argsort(flat)[:3]]
    out.append(f"Most focused heads (lowest entropy, nats): {', '.join(low)}.")
    layer_sep = np.nanmean(g["sep"], axis=1)
    layer_cls = np.nanmean(g["cls"], axis=1)
    sep_layers = [str(i + 1) for i in np.nonzero(layer_sep > paper.SURFACE_NUMBERS["sep_layers_half"].value)[0]]
    out.append(f"Attention to [SEP] per layer ranges from {pct(np.nanmin(layer_sep))} to "
               f"{pct(np.nanmax(layer_sep))} (highest in layer {int(np.nanargmax(layer_sep)) + 1}); layers with "
               f"over half of it on [SEP]: {', '.join(sep_layers) or 'none'}. Paper: {T['sep_layers']} "
               f"[{S['sep_layers_half'].source.short}].")
    out.append(f"Attention to [CLS] per layer ranges from {pct(np.nanmin(layer_cls))} to "
               f"{pct(np.nanmax(layer_cls))} (highest in layer {int(np.nanargmax(layer_cls)) + 1}).")
    sep_self = _over(g["sep_sep"], SEP_SEP_CUT)
    out.append(f"{len(sep_self)} of {layers * heads} heads have [SEP] rows putting more than {pct(SEP_SEP_CUT)} "
               f"on [SEP]. Paper: {T['sep_sep']} [{S['sep_sep'].source.short}].")
    sep_heads = _over(g["sep"], 0.5)
    noop = (f"[SEP] as a no-op: {len(sep_heads)} heads put more than half of all attention on [SEP]"
            + (f", and in {len(set(sep_heads) & set(sep_self))} of them [SEP] rows attend to [SEP] > "
               f"{pct(SEP_SEP_CUT)}, so attending to [SEP] mixes in little but [SEP]'s own state, the pattern "
               "the paper reads as a no-op" if sep_heads else ", so the no-op pattern does not show here")
            + f". The paper's evidence is a gradient test ({T['no_op']}): `bertscope heads attention-grad` "
            "measures it (section 'Attention gradients').")
    out.append(noop)
    if "cls_entropy" in rows[0]:  # runs made before the column existed lack it
        last = np.nanmean(g["cls_entropy"][-1])
        out.append(f"[CLS] entropy in the last layer: {last:.2f} nats. Paper: {T['cls_entropy_last']} "
                   f"[{S['cls_entropy_last'].source.short}].")
    table = Table("Per layer: mean over heads", ["layer", "[CLS]", "[SEP]", ". or ,", "entropy (nats)"],
                  [[i + 1, float(layer_cls[i]), float(layer_sep[i]), float(np.nanmean(g["punct"][i])),
                    float(np.nanmean(g["entropy"][i]))] for i in range(layers)],
                  shade={"[CLS]", "[SEP]", ". or ,", "entropy (nats)"})
    return out, table


@section("surface")
def surface(run: RunFiles) -> Section | None:
    rows = run.csv("heads.csv")
    if not rows:
        return None
    findings, per_layer = surface_findings(rows, _uniform_entropy(run))
    cols = [c for c in rows[0] if c != "n_tokens"]
    shaded = set(cols) - {"layer", "head"}
    table = Table("Per head (heads.csv): mean attention mass and entropy", cols,
                  [[int(r[c]) if c in ("layer", "head") else num(r[c]) for c in cols] for r in rows], shade=shaded)
    figures = [f for name, cap in SURFACE_FIGURES.items() if (f := run.figure(name, cap))]
    return Section("Surface-level attention patterns (Clark et al. 2019, section 3)",
                   intro="Where each head's attention goes on average over the corpus: relative positions, "
                   "special tokens, and how broad it is.",
                   findings=findings, tables=[per_layer, table], figures=figures)


# ----------------------------------------------------------------------------- probes

BASELINE_MARGIN = 10  # points: a head this far above word position tracks the relation itself
MIN_WORDS = 20  # fewer scored words make a percentage too noisy for a finding


@section("syntax")
def syntax(run: RunFiles) -> Section | None:
    rows = run.csv("syntax_table.csv")
    if rows is None:
        return None
    best: dict[tuple[str, str], dict] = {}  # (treebank, relation) -> the better direction's row
    for r in rows:
        key = (r["treebank"], r["relation"])
        if num(r["accuracy"]) is not None and (key not in best or num(r["accuracy"]) > num(best[key]["accuracy"])):
            best[key] = r
    table_rows, findings = [], []
    for (tb, rel), r in best.items():
        ref = paper.SYNTAX_TABLE1.get("all" if rel == "all" else r.get("sd_label", ""))
        acc, base = 100 * num(r["accuracy"]), 100 * (num(r["baseline_accuracy"]) or 0)
        table_rows.append([tb, rel, r.get("sd_label", ""), r["direction"], r["best_head"], acc, base, int(r["n"]),
                           ref["best_head"] if ref else "", ref["accuracy"].value if ref else "",
                           ref["baseline"].value if ref else ""])
        if ref and rel != "all":
            findings.append(f"{tb}: {rel} ({r.get('sd_label')}) best head {r['best_head']} at {acc:.1f}% vs the "
                            f"paper's {ref['best_head']} at {ref['accuracy'].value}% [{paper.TABLE1.where}].")
    for tb in sorted({tb for tb, _ in best}):
        rels = [(rel, 100 * (num(r["accuracy"]) - (num(r["baseline_accuracy"]) or 0)))
                for (t, rel), r in best.items() if t == tb and rel != "all" and int(r["n"]) >= MIN_WORDS]
        above = sorted((x for x in rels if x[1] >= BASELINE_MARGIN), key=lambda x: -x[1])
        findings.insert(0, f"{tb}: {len(above)} of {len(rels)} relations (those with {MIN_WORDS}+ words) have a head at least {BASELINE_MARGIN} "
                        f"points above the best fixed-offset baseline: "
                        f"{', '.join(f'{rel} (+{d:.1f})' for rel, d in above[:6]) or 'none'}.")
    figures = [run.figure(n, "Best head per relation (bars) against the best fixed-offset baseline; a head well "
                          "above its baseline tracks that relation beyond word position.")
               for n in run.figures("syntax_best_heads_*.png")]
    figures += [run.figure(n, "Layer x head accuracy per relation: where in the network each relation is found.")
                for n in run.figures("syntax_heatmaps_*.png")]
    table = Table(f"Best head per relation, accuracy % (ours, better direction) beside {paper.TABLE1}",
                  ["treebank", "relation", "SD label", "direction", "head", "accuracy", "baseline", "n",
                   "paper head", "paper accuracy", "paper baseline"], table_rows, digits=1)
    return Section("Dependency syntax per head (Clark et al. 2019, section 4.2)",
                   intro="For every word, the word a head attends to most is its predicted syntactic head "
                   "(or dependent); accuracy per relation of the best head. Our data are UD (EWT, GUM), the "
                   "paper's PTB with Stanford Dependencies, so relations are matched by label.",
                   findings=findings[:8], tables=[table], figures=figures)


# datasets scored as Table 2 is (antecedent selection over every mention); GAP picks one of two names
TABLE2_DATASETS = {"gum"}


@section("coref")
def coref(run: RunFiles) -> Section | None:
    rows = run.csv("coref_table.csv")
    if rows is None:
        return None
    ref = paper.COREF_TABLE2
    table_rows, findings = [], []
    for r in rows:
        t = r["type"]
        v = {k: num(r.get(k)) for k in ("accuracy", "overall_head_accuracy", "nearest", "head_match", "sieve")}
        comparable = r["dataset"] in TABLE2_DATASETS
        p = {k: ref[k][t].value if comparable and t in ref[k] else "" for k in ref}
        table_rows.append([r["dataset"], t, r["best_head"]] +
                          [100 * v[k] if v[k] is not None else "" for k in v] +
                          [p["head 5-4"], p["nearest"], p["head_match"], p["sieve"], int(r["n"] or 0)])
        if t == "All" and v["accuracy"] is not None:
            findings.append(f"{r['dataset']}: best head {r['best_head']} picks a correct antecedent "
                            f"{100 * v['accuracy']:.1f}% of the time (n = {r['n']})" +
                            (f", vs the paper's head 5-4 at {ref['head 5-4']['All'].value}% [{paper.TABLE2.where}]."
                             if comparable else "; no paper number: not Table 2's task."))
    figures = [run.figure("coref_bars.png", "Antecedent accuracy by mention type: the best head against the "
                          "baselines (nearest mention, head-word match, sieve)."),
               run.figure("coref_heads.png", "Layer x head antecedent accuracy: where coreference is found.")]
    table = Table(f"Antecedent selection accuracy % beside {paper.TABLE2}",
                  ["dataset", "type", "best head", "accuracy", "All-best head acc", "nearest", "head match", "sieve",
                   "paper head 5-4", "paper nearest", "paper head match", "paper sieve", "n"], table_rows, digits=1)
    return Section("Coreference per head (Clark et al. 2019, section 4.3)",
                   intro="How often the head word of a coreferent mention attends most to the head of one of its "
                   "antecedents.", findings=findings, tables=[table], figures=[f for f in figures if f])


@section("classifier")
def classifier(run: RunFiles) -> Section | None:
    rows = run.csv("classifier_table.csv")
    if rows is None:
        return None
    ref = paper.CLASSIFIER_TABLE3
    table_rows = [[r["model"], num(r["uas"]), num(r["uas_with_punct"]),
                   ref[r["model"]].value if r["model"] in ref else ""] for r in rows]
    findings = [f"{r[0]}: UAS {r[1]:.1f} vs the paper's {r[3]} [{paper.TABLE3.where}]." for r in table_rows
                if r[1] is not None and r[3] != ""]
    figures = [run.figure("fig_classifier_training.png", "Dev UAS by epoch for each probe: flat curves mean "
                          "training converged."),
               run.figure("fig_classifier_head_weights.png", "Learned weight of each head (w: attention from "
                          "dependent to head, u: the reverse): the heads the attention-only probe relies on.")]
    return Section("Attention-based probing classifiers (Clark et al. 2019, section 5)",
                   intro="Dependency parsing from attention maps alone (Attn) and with GloVe word vectors.",
                   findings=findings, tables=[Table(f"UAS beside {paper.TABLE3}",
                                                    ["model", "UAS", "UAS with punct", "paper UAS"],
                                                    table_rows, digits=1)],
                   figures=[f for f in figures if f])


@section("cluster")
def cluster(run: RunFiles) -> Section | None:
    rows = run.csv("cluster_mds.csv")
    if rows is None:
        return None
    counts: dict[str, list[str]] = {}
    for r in rows:
        counts.setdefault(r["behaviour"], []).append(f"{r['layer']}-{r['head']}")
    findings = [f"{b}: {len(h)} heads ({heads_str(h, 8)})" for b, h in sorted(counts.items(), key=lambda x: -len(x[1]))]
    figures = [run.figure("fig_cluster_mds.png", "Heads embedded in 2-D by multidimensional scaling of their "
                          "Jensen-Shannon distances: heads close together attend alike; markers give each head's "
                          "behaviour (Clark et al. Fig. 6)."),
               run.figure("fig_cluster_layers.png", "Mean Jensen-Shannon divergence between the heads of two "
                          "layers: dark diagonal blocks mean heads of nearby layers behave alike.")]
    return Section("Head clustering (Clark et al. 2019, section 6)", intro="Behaviour of each head, from its "
                   "surface statistics, as grouped in the MDS plot.", findings=findings,
                   figures=[f for f in figures if f])


# ----------------------------------------------------------------------------- comparison, per-example

@section("compare")
def compare(run: RunFiles) -> Section | None:
    from bertscope.compare import read_comparison

    found = read_comparison(run.dir)
    if found is None:
        return None
    record, rows = found
    changed = sorted((r for r in rows if r.get("source") == "heads.csv" and num(r["diff"]) is not None),
                     key=lambda r: -abs(num(r["diff"])))[:15]
    table = Table("Heads that changed most (heads.csv statistics), diff = b - a",
                  ["statistic", "layer", "head", "a", "b", "diff", "q", "significant"],
                  [[r["statistic"], int(r["layer"]), int(r["head"]), num(r["a"]), num(r["b"]), num(r["diff"]),
                    r.get("q", ""), r.get("significant", "")] for r in changed])
    findings = [f"a = {record.get('a')} ({record.get('model_a')}), b = {record.get('b')} ({record.get('model_b')})."]
    if record.get("test"):
        findings.append(f"Test: {record.get('test_description')}; significant heads per statistic at q < "
                        f"{record.get('alpha')}: {record.get('significant')}.")
    figures = [run.figure(n, f"Per-head change of {n[len('fig_compare_'):-4]}, b - a: purple higher in b, orange "
                          "lower, white unchanged; framed cells are significant where a test ran.")
               for n in run.figures("fig_compare_*.png")]
    return Section("Comparison of two runs", intro="Per-head differences between two run directories "
                   "(bertscope compare).", findings=findings, tables=[table], figures=figures)


@section("cues")
def cues(run: RunFiles) -> Section | None:
    rows = run.csv("cues.csv")
    if rows is None:
        return None
    task = rows[0]["task"] if rows else ""
    findings, tables = [], []
    for data, split in (("original", "all"), ("original", "test"), ("adversarial", "test")):
        sel = [r for r in rows if r["data"] == data and r["split"] == split and r["ngram"] == "1"
               and num(r["productivity"]) > (num(r["base_rate"]) if r["base_rate"] else 0.5)]
        sel = sorted(sel, key=lambda r: (-num(r["strength"]), r["cue"]))[:8]
        if not sel and not any(r["data"] == data and r["split"] == split for r in rows):
            continue
        tables.append(Table(f"{task.upper()} {data}, {split}: strongest unigram cues above chance",
                            ["cue", "applicability", "productivity", "coverage", "n"],
                            [[r["cue"], int(r["applicability"]), num(r["productivity"]), num(r["coverage"]),
                              int(r["n"])] for r in sel]))
    not_all = next((r for r in rows if r["cue"] == "not" and r["data"] == "original" and r["split"] == "all"), None)
    if task == "arct" and not_all:
        ref = paper.NOT_CUE
        settings = run.record.get("probes", {}).get("cues", {}).get("settings", {})
        expand = " (negated contractions read as 'not': --expand-not)" if settings.get("expand_not") else \
            " (\"don't\" and other contractions are tokens of their own here)"
        findings.append(f"\"not\" over all splits: productivity {num(not_all['productivity']):.2f}, coverage "
                        f"{num(not_all['coverage']):.2f}; {paper.NIVEN} report {ref['productivity'].value} and "
                        f"{ref['coverage'].value} [{paper.CUES.where}]{expand}.")
    adversarial = [num(r["productivity"]) for r in rows if r["data"] == "adversarial" and r["split"] == "test"]
    if adversarial:
        findings.append(f"Adversarial test set: every cue's productivity lies in [{min(adversarial):.2f}, "
                        f"{max(adversarial):.2f}] (0.5 = no signal).")
    figures = [run.figure("cues.png", "Each dot is a unigram cue: coverage (share of data points where it occurs in "
                          "one warrant only, or in the hypothesis for RTE) against productivity (how often it points "
                          "to the right answer). Red: the strongest cues above chance.")]
    return Section(f"Dataset cues (Niven & Kao 2019), {task.upper()}",
                   intro="Unigram and bigram cues of lower-cased word tokens; every cue is in cues.csv.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])


@section("per_example")
def per_example(run: RunFiles) -> Section | None:
    info = run.record.get("per_example")
    if not info or not run.has(info.get("file", "")):
        return None
    return Section("Per-example statistics", intro=f"{info['file']}: {info.get('rows')} rows, one per (segment, "
                   "layer, head), for significance tests across runs (bertscope compare).")


# ----------------------------------------------------------------------------- the rest

@section("other_figures")
def other_figures(run: RunFiles) -> Section | None:
    """Every PNG no section claimed, so no figure is left out of the report."""
    rest = [n for n in run.figures("*.png") if n not in run.claimed]
    if not rest:
        return None
    return Section("Other figures", intro="Figures in the run directory that no report section describes yet.",
                   figures=[Figure(n, "no caption: no report section knows this file yet.") for n in rest])


# ----------------------------------------------------------------------------- Kovaleva et al. 4.4

FEATURE_NAMES = {"cls": "[CLS]", "sep": "[SEP]", "noun": "nouns", "verb": "verbs", "pron": "pronouns",
                 "punct": "punctuation", "nsubj": "subjects", "obj": "objects", "neg": "negation"}


def feature_findings(rows: list[dict], uniform: dict) -> tuple[list[str], list[list]]:
    """Per data set: which feature wins each head, the strongest head of the specials and of
    the linguistic features, how often the most-attended token is [CLS] or [SEP], and the
    score uniform attention would give any token (`uniform`: data -> mean 1 / length)."""
    findings, table = [], []
    for data in dict.fromkeys(r["data"] for r in rows):
        mine = [r for r in rows if r["data"] == data]
        by_head: dict[tuple, dict] = {}
        for r in mine:
            by_head.setdefault((r["layer"], r["head"]), {})[r["feature"]] = num(r["score"])
        won = [max(scores, key=lambda f: scores[f]) for scores in by_head.values()]
        special = sum(w in ("cls", "sep") for w in won)
        best = {}
        for f in dict.fromkeys(r["feature"] for r in mine):
            fr = [r for r in mine if r["feature"] == f]
            top = max(fr, key=lambda r: num(r["score"]))
            share = sum(num(r["top_share"]) for r in fr) / len(fr)
            best[f] = num(top["score"])
            mean = sum(num(r["score"]) for r in fr) / len(fr)
            table.append([data, FEATURE_NAMES.get(f, f), int(top["n_inputs"]), mean,
                          f"{top['layer']}-{top['head']}", num(top["score"]), share])
        ling = {f: v for f, v in best.items() if f not in ("cls", "sep")}
        top_ling = max(ling, key=ling.get) if ling else None
        shares = [num(r["top_share"]) for r in mine if r["feature"] in ("cls", "sep")]
        n_heads = len(by_head)
        findings.append(
            f"{data}: in {special} of {n_heads} heads the highest-scoring feature is [CLS] or [SEP]; strongest "
            f"special-token head {max(best.get('cls', 0), best.get('sep', 0)):.2f}"
            + (f", strongest linguistic-feature head ({FEATURE_NAMES.get(top_ling, top_ling)}) {ling[top_ling]:.2f}"
               if top_ling else "")
            + f"; the most-attended token of an (input, head) is [CLS] or [SEP] in "
            f"{pct(sum(shares) / n_heads)} of them"
            + (f"; uniform attention would score any token {uniform[data]:.3f}." if data in uniform else "."))
    return findings, table


@section("features")
def features(run: RunFiles) -> Section | None:
    rows = run.csv("features_scores.csv")
    if not rows:
        return None
    results = ((run.record.get("probes") or {}).get("features") or {}).get("results") or {}
    uniform = {d: r["uniform_score"] for d, r in results.items() if "uniform_score" in r}
    findings, table_rows = feature_findings(rows, uniform)
    last = max(int(r["layer"]) for r in rows)
    for data in dict.fromkeys(r["data"] for r in rows):
        mean = {}
        for r in rows:
            if r["data"] == data and int(r["layer"]) == last:
                mean.setdefault(r["feature"], []).append(num(r["cls_mass"]))
        ranked = sorted(((sum(v) / len(v), f) for f, v in mean.items()), reverse=True)
        findings.append(f"{data}, layer {last} [CLS] row (Figure 7), mean over heads: "
                        + ", ".join(f"{FEATURE_NAMES.get(f, f)} {v:.2f}" for v, f in ranked[:4]) + ".")
    T = paper.FEATURES_TEXT
    findings.append(f"Paper [{paper.FEATURES.short}]: {T['stripes']}; {T['layers']}; {T['features']}; {T['cls_last']}.")
    table = Table("Per data set and feature: inputs with the feature, mean score over heads, the best head, and the "
                  "share of (input, head) pairs whose most-attended token is of the feature",
                  ["data", "feature", "inputs", "mean score", "best head", "best score", "top-token share"],
                  table_rows, shade={"mean score", "best score", "top-token share"})
    figures = [run.figure(n, f"Layer x head score per feature on {n[len('fig_features_'):-4].upper()} (Kovaleva et "
                          "al. Fig. 6): attention all tokens give to the feature's most-attended token, divided by "
                          "the input's length, averaged over inputs with the feature; one colour scale for all "
                          "panels, so linguistic features read against [CLS] and [SEP].")
               for n in run.figures("fig_features_*.png")
               if n not in ("fig_features_cls_last_layer.png", "fig_features_layers.png")]
    figures += [run.figure("fig_features_cls_last_layer.png", "Last layer: the [CLS] row's attention on each "
                           "feature's tokens, per head (Kovaleva et al. Fig. 7), averaged over inputs with the "
                           "feature."),
                run.figure("fig_features_layers.png", "Mean score over the heads of each layer, per feature: "
                           "where in depth [CLS] and [SEP] take the attention.")]
    return Section("Attention to linguistic features (Kovaleva et al. 2019, section 4.4)",
                   intro="Does a head's vertical stripe fall on nouns, verbs, pronouns, subjects, objects, negation "
                   "or punctuation, or on [CLS] and [SEP]? Gold UPOS and UD relations on the treebanks; only "
                   "negation, punctuation and the special tokens on the task data.",
                   findings=findings, tables=[table], figures=[f for f in figures if f])
# ----------------------------------------------------------------------------- Kovaleva 4.2 and 4.5

RELATION_FIGURES = (
    ("relations_heatmap_{}.png", "Mean over sentences of each head's largest word-level attention between a "
     "predicate and one of its core arguments (gold UD nsubj, nsubj:pass, obj, iobj, obl; either direction), "
     "pooled ('all') and per relation (Kovaleva et al. Fig. 3, with UD in place of FrameNet). Red boxes: heads "
     "above the 99th percentile of all heads; white dots: previous/next-token heads."),
    ("tokens_heatmap_{}.png", "Mean directed word-level attention from a verb to its subject and from a pronoun "
     "to its nearest noun antecedent (GUM coreference), per link; '_far' keeps the links whose words are at "
     "least 2 apart. White dots mark previous/next-token heads (mean offset -1 or +1 mass > 0.5 on the same "
     "inputs): Kovaleva et al. section 4.5 found the top heads were mostly those."),
)


@section("relations")
def relations(run: RunFiles) -> Section | None:
    rows = run.csv("relations_summary.csv")
    if rows is None:
        return None
    record = ((run.record.get("probes") or {}).get("relations") or {}).get("results") or {}
    pooled = max((r["data"] for r in rows), key=len)  # "ewt+gum" when both data sets ran
    table = Table("Per group: inputs (sentences for relations, links for tokens), the 99th percentile of the heads' "
                  "means, the heads above it, the top heads, and how many of the top heads are previous/next-token "
                  "heads", ["analysis", "data", "group", "n", "p99", "flagged", "top", "prev/next in top"],
                  [[r["analysis"], r["data"], r["group"], int(r["n"]), num(r["p99"]), r["flagged"],
                    " ".join(r["top"].split()[:5]), f"{r['top_prev_next']} of {r['top_k']}"] for r in rows])
    rh = paper.RELATION_HEADS
    findings = [f"Paper ({rh['sentences'].source}): {rh['flagged_heads'].value:.0f} of {rh['heads'].value:.0f} heads "
                f"above the 99th percentile, mean max weights {rh['flagged_scores'][0].value} and "
                f"{rh['flagged_scores'][1].value}. The 99th percentile of n <= 100 heads always leaves exactly one "
                "head above it (two for 101-200 heads), so the count itself says nothing; the values and ranks do.",
                f"Paper ({paper.KOVALEVA_45}): {paper.TOKEN_TO_TOKEN_TEXT}."]
    for r in rows:
        if r["data"] == pooled and r["group"] in ("all", "verb_subject", "verb_subject_far", "pronoun_antecedent"):
            findings.append(f"{r['analysis']} / {r['group']} on {pooled} (n = {r['n']}): flagged {r['flagged'] or 'none'}; "
                            f"{r['top_prev_next']} of the top {r['top_k']} heads are previous/next-token heads "
                            f"({r['prev_next_heads']} such heads in the model on these inputs); Spearman rho between "
                            f"the heads' scores and their previous/next mass {r.get('rho_prev_next', '?')}.")
    if record.get("adjacent_mass") is not None:
        findings.append(f"A previous/next-token head puts more than {record['adjacent_mass']} of its attention, on "
                        "average over every token of the same inputs, on offset -1 or on +1.")
    labels = [pooled] + sorted({r["data"] for r in rows} - {pooled})  # pooled first, then each data set
    figures = [run.figure(name.format(data.replace("+", "_")), caption + ("" if data == pooled else f" ({data} only.)"))
               for name, caption in RELATION_FIGURES for data in labels]
    figures += [run.figure("relations_examples.png", "Word-level maps of the top relation heads on one random short "
                           "sentence; red boxes are its gold predicate-argument cells (both directions)."),
                run.figure("tokens_examples.png", "Word-level maps of the top verb -> subject heads (links 2+ words "
                           "apart) on one random input; red boxes are the verb -> subject cells.")]
    return Section("Relation heads and token-to-token attention (Kovaleva et al. 2019, sections 4.2 and 4.5)",
                   intro="bertscope relations: word-level attention between gold-linked words, averaged per head; "
                   "UD core arguments stand in for FrameNet frame elements.", findings=findings, tables=[table],
                   figures=[f for f in figures if f])
# ----------------------------------------------------------------------------- Kovaleva et al.: pattern types

@section("patterns")
def patterns(run: RunFiles) -> Section | None:
    """Kovaleva et al. (2019) section 4.1: type proportions per data set beside the paper's statements."""
    rows = run.csv("patterns.csv")
    if rows is None:
        return None
    from bertscope.analyses.patterns import TYPES

    overall: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["scope"] == "all":
            overall.setdefault(r["data"], {})[r["type"]] = num(r["proportion"])
    ref = paper.PATTERNS
    table = Table(f"% of (example, head) maps per type, beside {paper.PATTERNS_SOURCE}",
                  ["data"] + list(TYPES) + ["paper Heterogeneous range"],
                  [[d] + [100 * (v.get(t) or 0.0) for t in TYPES]
                   + [f"{ref['heterogeneous_min'].value:.0f}-{ref['heterogeneous_max'].value:.0f}%"]
                   for d, v in overall.items()], digits=1)
    results = run.record.get("probes", {}).get("patterns", {}).get("results", {})
    thresholds = results.get("thresholds", {})
    findings = [f"{d}: Heterogeneous {100 * v.get('Heterogeneous', 0):.1f}%, the first three types together "
                f"{100 * sum(v.get(t, 0) for t in TYPES[:3]):.1f}%, Block {100 * v.get('Block', 0):.1f}%."
                for d, v in overall.items()]
    findings.append(paper.PATTERNS_TEXT)
    rules = ", ".join(f"{k} {v}" for k, v in thresholds.items())
    findings.append(f"Not the paper's method: bertscope labels maps by rules on streamed statistics (thresholds: {rules}), "
                    "not by a CNN trained on hand labels; model and data differ too.")
    figures = [run.figure("fig_patterns.png", "Share of each pattern type among all (example, head) maps, one bar "
                          "per data set, stacked as the paper's Figure 2."),
               run.figure("fig_patterns_layers.png", "The same shares per layer: which layers hold which types.")]
    figures += [run.figure(n, f"One real map per type from {n[len('fig_patterns_examples_'):-4]}, the clearest "
                           "among the first segments (the paper's Figure 1); titles give the rule statistics.")
                for n in run.figures("fig_patterns_examples_*.png")]
    return Section("Attention pattern types (Kovaleva et al. 2019, section 4.1)",
                   intro="Every (example, head) map is one of Vertical ([CLS]/[SEP]), Diagonal (previous/next "
                   "token), Vertical+Diagonal, Block (within the query's own part of a pair) or Heterogeneous.",
                   findings=findings, tables=[table], figures=[f for f in figures if f])


# ----------------------------------------------------------------------------- heads disable

@section("disable")
def disable(run: RunFiles) -> Section | None:
    """Kovaleva et al. 4.6: each head and each layer disabled (bertscope heads disable)."""
    rows = run.csv("disable.csv")
    entry = ((run.record.get("probes") or {}).get("disable") or {}).get("results") or {}
    if rows is None or not rows:
        return None
    base = num(rows[0]["accuracy"])
    heads = [r for r in rows if r["kind"] == "head"]
    layers = [r for r in rows if r["kind"] == "layer"]
    pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    sig = [r["variant"] for r in rows[1:] if r["significant"] == "True"]
    findings = [f"{entry.get('task', '?')} {entry.get('split', '')}, {entry.get('examples', '?')} examples: baseline "
                f"accuracy {pct(base)}; significant changes (BH q < {entry.get('alpha', 0.05)}, exact McNemar): "
                f"{heads_str(sig)}."]
    if heads:
        deltas = [num(r["delta"]) for r in heads]
        best, worst = max(heads, key=lambda r: num(r["delta"])), min(heads, key=lambda r: num(r["delta"]))
        findings.append(f"Single heads: {sum(d > 0 for d in deltas)} of {len(deltas)} help, {sum(d < 0 for d in deltas)} "
                        f"hurt, mean {pts(float(np.mean(deltas)))} points; best {best['variant']} "
                        f"{pts(num(best['delta']))}, worst {worst['variant']} {pts(num(worst['delta']))}. Paper: "
                        f"{paper.DISABLE_TEXT['heads']} [{paper.DISABLE.short}].")
    if layers:
        first = layers[0]
        findings.append(f"Layer 1 disabled: {pts(num(first['delta']))} points, 95% CI [{pts(num(first['ci_low']))}, "
                        f"{pts(num(first['ci_high']))}], q = {num(first['q']):.3g}. Paper: "
                        f"{paper.DISABLE_TEXT['layers']} [{paper.DISABLE.short}].")
    table = Table("Whole layers disabled, and the 8 single heads that change accuracy most (points; 95% paired "
                  "bootstrap interval; b / c = examples only the baseline / only the variant gets right)",
                  ["variant", "accuracy %", "delta", "CI low", "CI high", "b", "c", "p", "q", "significant"],
                  [[r["variant"], 100 * num(r["accuracy"]), 100 * num(r["delta"]), 100 * num(r["ci_low"]),
                    100 * num(r["ci_high"]), int(r["b"]), int(r["c"]), num(r["p"]), num(r["q"]), r["significant"]]
                   for r in layers + sorted(heads, key=lambda r: -abs(num(r["delta"])))[:8]], digits=3)
    figures = [run.figure("fig_disable_heads.png", "Accuracy with one head disabled at a time (Kovaleva et al. "
                          "Fig. 8): colour centred on the baseline (orange on the colour bar), cells give the change "
                          "in points, framed cells are significant."),
               run.figure("fig_disable_layers.png", "Accuracy with one whole layer disabled at a time (Fig. 9), "
                          "with 95% paired bootstrap intervals; the orange line is the baseline, * significant.")]
    return Section("Disabling heads and layers (Kovaleva et al. 2019, section 4.6)",
                   intro="A disabled head attends uniformly to every valid token (its output is the mean of V). "
                   "Each single head and each whole layer of the fine-tuned model is disabled in turn; the change "
                   "of accuracy is tested against the baseline on the same examples (paired).",
                   findings=findings, tables=[table], figures=[f for f in figures if f])


# ----------------------------------------------------------------------------- fine-tuning (Kovaleva 4.3)

@section("finetune")
def finetune(run: RunFiles) -> Section | None:
    """Table 1's three columns per task next to Kovaleva's bert-base row, the ARCT probes next to
    Niven & Kao, and the Figure 5 heatmaps of attention change."""
    rows = run.csv("finetune_summary.csv")
    if not rows:
        return None
    test = [r for r in rows if r["split"] == "test"]
    cell = {(r["task"], r["data"], r["input"], r["init"]): r for r in test}
    column_init = dict(zip(paper.FINETUNE_COLUMNS, ("probe", "random", "pretrained")))

    def mean_sd(r):
        if r is None:
            return "-"
        return f"{100 * num(r['accuracy_mean']):.1f} ± {100 * num(r['accuracy_sd']):.1f} (n={r['n_seeds']})"

    table_rows, findings = [], []
    for task in ("rte", "polarity"):
        ours = {c: cell.get((task, "-", "-", i)) for c, i in column_init.items()}
        if not any(ours.values()):
            continue
        theirs = paper.kovaleva_accuracy(task) or {}
        table_rows.append([task] + [mean_sd(ours[c]) for c in paper.FINETUNE_COLUMNS]
                          + [paper.KOVALEVA_ROW_OF[task]] + [theirs[c].value if c in theirs else "-"
                                                              for c in paper.FINETUNE_COLUMNS])
        pre, rnd = ours["pretrained_ft"], ours["random_ft"]
        if pre and rnd:
            findings.append(f"{task}: fine-tuned from pre-trained minus fine-tuned from a normal init: "
                            f"{100 * (num(pre['accuracy_mean']) - num(rnd['accuracy_mean'])):+.1f} points "
                            f"(Kovaleva: {theirs['pretrained_ft'].value - theirs['random_ft'].value:+.1f} on "
                            f"{paper.KOVALEVA_ROW_OF[task]}).")
    tables = []
    if table_rows:
        tables.append(Table("Table 1 (Kovaleva et al.): test accuracy %, mean ± sd over seeds; the linear probe is "
                            "deterministic (n=1). Paper: bert-base on GLUE dev (SST-2 for polarity)",
                            ["task", "pre-trained, no FT (probe)", "FT from normal init", "FT from pre-trained",
                             "paper row", "paper: no FT", "paper: normal", "paper: pre-trained"], table_rows, digits=1))
    arct = sorted({(r["data"], r["input"]) for r in test if r["task"] == "arct"},
                  key=lambda k: (k[0] != "original", ("full", "W", "RW", "CW").index(k[1])))
    if arct:
        arct_rows = []
        for data, variant in arct:
            nk = paper.NIVEN_KAO_NUMBERS.get((data, variant), {})
            arct_rows.append([data, variant] + [mean_sd(cell.get(("arct", data, variant, i)))
                                                for i in ("probe", "random", "pretrained")]
                             + [nk["mean"].value if "mean" in nk else "-", nk["peak"].value if "peak" in nk else "-"])
        tables.append(Table("ARCT (Niven & Kao): test accuracy %, one logit per warrant, softmax over the pair; "
                            "W = warrants only, RW = reason + warrant, CW = claim + warrant; adversarial = trained "
                            "on train-swapped, tested on test-adv-negated. Chance is 50%.",
                            ["data", "input", "probe", "FT normal init", "FT pre-trained", "paper mean",
                             "paper peak"], arct_rows, digits=1))
    figures = [run.figure(n, f"Per-head cosine similarity between the attention maps of the pre-trained and the "
                          f"fine-tuned model ({n[len('fig_finetune_cosine_'):-4]}), averaged over up to 1,000 dev "
                          "inputs and over the seeds (Kovaleva et al. Fig. 5). Darker cells changed more; in "
                          "bert-base the last two layers changed most.")
               for n in run.figures("fig_finetune_cosine_*.png")]
    cosine = run.csv("finetune_cosine.csv") or []
    by_task: dict[str, dict[int, list[float]]] = {}
    for r in cosine:
        by_task.setdefault(r["task"] if r["task"] != "arct" else f"arct-{r['data']}-{r['input']}", {}) \
            .setdefault(int(r["layer"]), []).append(num(r["cosine"]))
    for name, layers in sorted(by_task.items()):
        means = {l: float(np.mean(v)) for l, v in layers.items()}
        low = sorted(means, key=means.get)[:2]
        findings.append(f"{name}: mean cosine per layer " + ", ".join(f"{l}: {means[l]:.3f}" for l in sorted(means))
                        + f"; changed most: layers {', '.join(map(str, sorted(low)))}.")
    return Section("Fine-tuning and what it changes (Kovaleva et al. 2019, section 4.3; Niven & Kao 2019)",
                   intro="bertscope finetune: fine-tuned from the pre-trained weights and from a normal init, and a "
                   "linear probe on the frozen pre-trained [CLS] vector; per-head attention change.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])


# ----------------------------------------------------------------------------- attention gradients

@section("attention_grad")
def attention_grad(run: RunFiles) -> Section | None:
    """Clark et al. section 3, Fig. 5: mean |dL/dP| per layer and key class, beside the attention
    (bertscope heads attention-grad)."""
    rows = run.csv("attention_grad_layers.csv")
    if not rows:
        return None
    entry = ((run.record.get("probes") or {}).get("attention_grad") or {}).get("results") or {}
    classes = ("cls", "sep", "punct", "other")
    labels = {"cls": "[CLS]", "sep": "[SEP]", "punct": ". or ,", "other": "other"}
    by = {(int(r["layer"]), r["key_class"]): r for r in rows}
    layers = sorted({int(r["layer"]) for r in rows})
    objective = entry.get("objective", "?")
    data = (f"{entry.get('task')} {entry.get('split')}" if objective == "task" else entry.get("corpus", "?"))
    findings = [f"{objective} loss on {data}, {entry.get('inputs', '?')} inputs, mean loss "
                f"{num(entry.get('mean_loss')) or float('nan'):.3f}."]
    value = lambda lay, c, col: num(by[(lay, c)][col])  # noqa: E731  (None for NaN: a class without keys)
    ratio = lambda x: "-" if x is None else f"x{x:.2f}"  # noqa: E731
    for lay in layers:
        findings.append(f"Layer {lay}, attention and gradient relative to other tokens: " + "; ".join(
            f"{labels[c]} {pct(value(lay, c, 'attention') or 0)}, {ratio(value(lay, c, 'grad_vs_other'))}"
            for c in classes[:-1]) + ".")
    src = paper.CLARK_GRADIENT
    findings.append(f"Paper: {paper.CLARK_GRADIENT_TEXT} [{src.short}]."
                    + (" Clark used the masked-LM loss; a fine-tuned task loss reads one label through [CLS], so its "
                       "gradients say what the task needs, not what pre-training needs." if objective == "task" else ""))
    sci = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731  (gradients span orders of magnitude)
    table = Table("Per layer: mean |d loss / d P_ij| over (query, key) pairs by the key's class (x other's), and "
                  "the mean attention mass a row puts on the class",
                  ["layer"] + [f"{labels[c]} |grad|" for c in classes] + [f"{labels[c]} / other" for c in classes[:-1]]
                  + [f"{labels[c]} attention" for c in classes],
                  [[lay] + [sci(value(lay, c, "mean_abs_grad")) for c in classes]
                   + [num(by[(lay, c)]["grad_vs_other"]) for c in classes[:-1]]
                   + [num(by[(lay, c)]["attention"]) for c in classes] for lay in layers], digits=3)
    figures = [run.figure("fig_attention_grad.png", "Clark et al. Fig. 5: by layer, the attention mass on each key "
                          "class, the mean |gradient| of the loss with respect to an attention weight to it (log "
                          "scale), and that gradient relative to other tokens' (1 = as other tokens). A class with "
                          "much attention and a gradient far below 1 is attended to as a no-op."),
               run.figure("fig_attention_grad_heads.png", "Per head, for [CLS], [SEP] and '. or ,': the attention "
                          "mass on the class (top) and log10 of its mean |gradient| over other tokens' (bottom; red: "
                          "smaller). A head with much attention on a class and a red cell below it uses that "
                          "class as a no-op.")]
    return Section("Attention gradients (Clark et al. 2019, section 3, Fig. 5)",
                   intro="How much the loss depends on each attention weight, by the kind of key: |dL/dP_ij| summed "
                   "inside backward (the maps are never kept), averaged per layer over heads and valid (query, key) "
                   "pairs; punctuation is the tokens '.' and ','.",
                   findings=findings, tables=[table], figures=[f for f in figures if f])


# ----------------------------------------------------------------------------- importance and pruning (Michel)

@section("importance")
def importance(run: RunFiles) -> Section | None:
    """Michel et al. section 4: head importance (bertscope heads importance, --compare) and
    iterative pruning (bertscope heads prune)."""
    probes = run.record.get("probes") or {}
    imp, pairs, prune = run.csv("importance.csv"), run.csv("importance_correlation.csv"), run.csv("prune.csv")
    if not (imp or pairs or prune):
        return None
    findings, tables, figures = [], [], []
    if imp:
        res = (probes.get("importance") or {}).get("results") or {}
        ranked = [f"{r['layer']}-{r['head']}" for r in sorted((r for r in imp if r["rank"]), key=lambda r: int(r["rank"]))]
        findings.append(f"{res.get('task', '?')} {res.get('split', '')}, {res.get('examples', '?')} examples, "
                        f"{res.get('convention', '?')} convention, mean loss {num(res.get('loss')) or float('nan'):.4f}: "
                        f"most important heads {heads_str(ranked[:5])}; least important {heads_str(ranked[-5:])}.")
        per_layer = res.get("raw_mean_per_layer")
        if per_layer:
            findings.append("Mean raw importance E|dL/dxi_h| per layer: "
                            + ", ".join(f"{i + 1}: {v:.4f}" for i, v in enumerate(per_layer)) + ".")
        figures.append(run.figure("fig_importance.png", "Head importance I_h = E_x |dL(x)/dxi_h| at xi = 1 (Michel et "
                                  "al. section 4), per layer L2-normalised unless --no-normalise; each cell shows the "
                                  "head's rank, 1 = the head whose masking the loss is most sensitive to (first order)."))
    if pairs:
        tables.append(Table("Rank correlation of head importance between runs (Spearman over the heads; raw: before the "
                            "per-layer normalisation; overlap: share of the top 10% heads in common)",
                            ["run A", "run B", "heads", "Spearman", "p", "Spearman (raw)", "top-10% overlap"],
                            [[r["label_a"], r["label_b"], int(r["n_heads"]), num(r["spearman"]), num(r["p"]),
                              num(r["spearman_raw"]), num(r["top_overlap"])] for r in pairs]))
        findings.append(f"Paper: {paper.MICHEL_IMPORTANCE_TEXT} [{paper.MICHEL_IMPORTANCE.short}]. Here the runs are "
                        "different fine-tuned models on different tasks, a stronger test than one model on two domains.")
        figures.append(run.figure("fig_importance_correlation.png", "Spearman rho of head importance between the runs "
                                  "compared: are the important heads the same across tasks?"))
    if prune:
        res = (probes.get("prune") or {}).get("results") or {}
        tol = num(res.get("tolerance")) or 0.01
        mine = [r for r in prune if r["order"] == "importance"]
        rnd = [r for r in prune if r["order"] == "random"]
        steps = [r["step"] for r in mine]
        rand_mean = {s: float(np.mean([num(r["accuracy"]) for r in rnd if r["step"] == s])) for s in steps} if rnd else {}
        tables.append(Table(f"Accuracy (%) on {res.get('split', 'test')} with the heads pruned; importance recomputed "
                            f"on {res.get('importance_split', 'dev')} at every step",
                            ["step", "% of heads pruned", "heads pruned", "by importance", "delta (points)",
                             "random, mean of seeds"],
                            [[int(r["step"]), 100 * num(r["fraction_pruned"]), int(r["heads_pruned"]),
                              100 * num(r["accuracy"]), 100 * num(r["delta"]),
                              100 * rand_mean[r["step"]] if rand_mean else "-"] for r in mine], digits=1))
        if res:
            rp = res.get("random_prunable_fraction") or []
            findings.append(f"{res.get('task')}: {pct(res.get('prunable_fraction', 0))} of the heads can be pruned by "
                            f"importance with every step within {100 * tol:g} point of the unpruned "
                            f"{pct(res.get('baseline_accuracy', 0))}"
                            + (f"; in a random order {pct(float(np.mean(rp)))} on average over {len(rp)} seeds" if rp
                               else "")
                            + f". Paper: {paper.MICHEL_PRUNING_TEXT} [{paper.MICHEL_PRUNING.short}].")
        figures.append(run.figure("fig_prune.png", "Iterative pruning (Michel et al. section 4): accuracy against the "
                                  "fraction of heads pruned (masked), by importance and in random orders (band: "
                                  "min-max over seeds); dotted: the baseline minus the tolerance."))
    return Section("Head importance and pruning (Michel et al. 2019)",
                   intro="Head importance is the first-order (Taylor) estimate of the loss change when a head is "
                   "masked, I_h = E_x |dL(x)/dxi_h|, from one forward and one backward per batch. Iterative pruning "
                   "masks the least important 10% of the original heads per step, recomputing importance on held-out "
                   "data each time.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])


# ----------------------------------------------------------------------------- heads ablate (Michel)

@section("ablate")
def ablate(run: RunFiles) -> Section | None:
    """Michel et al. (2019): single heads masked, all heads of a layer but one, importance vs
    ablation (bertscope heads ablate)."""
    rows = run.csv("ablate.csv")
    if not rows:
        return None
    entry = ((run.record.get("probes") or {}).get("ablate") or {}).get("results") or {}
    pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    heads = [r for r in rows if r["kind"] == "head"]
    findings = [f"{entry.get('task', '?')} {entry.get('split', '')}, {entry.get('examples', '?')} examples: baseline "
                f"accuracy {pct(num(rows[0]['accuracy']))}; {len(rows) - 1} variants, BH over all of them."]
    if heads:
        deltas = np.array([num(r["delta"]) for r in heads])
        within = int(np.sum(np.abs(deltas) <= 0.005 + 1e-12))
        worst = min(heads, key=lambda r: num(r["delta"]))
        sig = [r["variant"] for r in heads if r["significant"] == "True"]
        findings.append(f"One head masked: {within} of {len(heads)} heads within 0.5 points of the baseline; mean "
                        f"{pts(float(deltas.mean()))}, worst {worst['variant']} {pts(num(worst['delta']))}; "
                        f"significant: {heads_str(sig)}. Paper: {paper.MICHEL_ABLATION_TEXT['single']} "
                        f"[{paper.MICHEL_ABLATION.short}].")
    table_rows = run.csv("ablate_but_one.csv") or []
    tables = []
    if table_rows:
        enough = [r["layer"] for r in table_rows if num(r["delta"]) >= 0 or r["significant"] != "True"]
        findings.append(f"All heads but one: the best kept head alone is not significantly worse than the full model "
                        f"in {len(enough)} of {len(table_rows)} layers ({', '.join(enough) or 'none'}). Paper: "
                        f"{paper.MICHEL_ABLATION_TEXT['but_one']} [{paper.MICHEL_ABLATION.short}]. The best head is "
                        "picked on the evaluation data itself (as in the paper), so its delta is optimistic.")
        tables.append(Table("All heads of a layer masked but one: the best kept head per layer (Michel et al.'s "
                            "table), its change in points with the 95% paired bootstrap interval and BH q; the worst "
                            "kept head and the mean over kept heads; heads within = kept heads within 0.5 points",
                            ["layer", "best head", "delta", "CI low", "CI high", "q", "worst head", "worst delta",
                             "mean delta", "heads within"],
                            [[r["layer"], r["best_head"], 100 * num(r["delta"]), 100 * num(r["ci_low"]),
                              100 * num(r["ci_high"]), num(r["q"]), r["worst_head"], 100 * num(r["worst_delta"]),
                              100 * num(r["mean_delta"]), int(r["heads_within"])] for r in table_rows], digits=2))
    corr = entry.get("importance")
    if corr:
        for column in ("importance", "importance_raw"):
            c = corr.get(column) or {}
            rho = "undefined (a constant side)" if c.get("spearman") is None else \
                f"{c['spearman']:+.3f} (p = {c['p']:.3g})"
            findings.append(f"Spearman rho between {column} ({corr['file']}) and the accuracy lost when the head is "
                            f"masked: {rho} over {c.get('heads', '?')} heads.")
    figures = [run.figure("fig_ablate_heads.png", "Accuracy with one head masked (zero gate) at a time: colour centred "
                          "on the baseline, cells give the change in points, framed cells are significant."),
               run.figure("fig_ablate_hist.png", "Distribution of the single-head changes (one bin per example "
                          "flipped); shaded: within 0.5 points, Michel et al.'s 'most heads'."),
               run.figure("fig_ablate_but_one.png", "All heads of a layer masked but one: grey, every kept head; "
                          "purple, the best one with its 95% interval (label: its number)."),
               run.figure("fig_ablate_importance.png", "Head importance (x) against the accuracy lost when the head "
                          "is masked (y), by layer; Spearman's rho in the title.")]
    return Section("Ablating heads (Michel et al. 2019)",
                   intro="A masked head's output is zeroed before the output projection (xi_h = 0). Each single head "
                   "is masked in turn, and in each layer every head but one; the change of accuracy is tested "
                   "against the unmasked model on the same examples (paired bootstrap, exact McNemar, BH).",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
