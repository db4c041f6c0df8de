"""`bertscope atlas compare RUN RUN ...`: the heads of several `bertscope atlas` runs in one table and
one figure: every head a point on the first two principal components of its standardised features,
coloured by its first type and by its model.

The features (`FEATURES`) are the per-head columns every model has: the masses, the entropy ratio, the
log mean distance and the induction probe's scores. Each is standardised over every head of every run
(z-scores; a feature NaN in a run, such as an encoder's, is set to the mean, 0); the principal
components are the SVD's of that matrix (numpy, no fitting library). A feature that no run measured is
left out.
"""
from __future__ import annotations

import math
from pathlib import Path

from bertscope.cli.args import add_quiet_argument
from bertscope.errors import UserError

HELP = "the heads of several atlas runs in one table and one PCA figure"
DESCRIPTION = (
    "Read the atlas_heads.csv of each RUN (run directories of `bertscope atlas`) and write atlas_compare.csv (every "
    "head of every run: model, layer, head, types, the features and their first two principal components) and "
    "fig_atlas_compare.png (the heads on PC 1 and PC 2, coloured by type and by model) into --out, with run.json's "
    "entry atlas_compare. Features: the masses, the entropy ratio, the log mean distance and the induction probe's "
    "scores, standardised over every head of every run.")
FEATURES = ("sink_mass", "first_mass", "prev_mass", "self_mass", "next_mass", "local_mass", "entropy_ratio",
            "log_mean_distance", "induction_score", "duplicate_score", "previous_score", "retrieval_score",
            "duplicate_mass", "prefix_match_mass", "streaming_error")
COLUMNS = ("model", "run", "layer", "head", "types", "pc1", "pc2", *FEATURES)


def add_arguments(p):
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories of `bertscope atlas` (two or more)")
    p.add_argument("--out", metavar="DIR", default=None, help="run directory of the comparison (default: "
                   "runs/<timestamp>)")
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figure")
    add_quiet_argument(p)


def main(args) -> int:
    from bertscope.analyses.atlas.outputs import COMPARE_NAME, read_heads
    from bertscope.run.analysis_run import AnalysisRun

    runs = [Path(r) for r in args.runs]
    if len(runs) < 2:
        raise UserError("atlas compare needs at least two run directories")
    tables = [read_heads(r) for r in runs]  # a run without atlas_heads.csv: one line, before anything is written
    seen = {}
    for r in runs:  # the same run twice would count one model as two and weigh its heads twice in the PCA
        key = r.resolve()
        if key in seen:
            raise UserError(f"atlas compare: {r} is given twice ({seen[key]} and {r}): give each run once")
        seen[key] = r
    with AnalysisRun(COMPARE_NAME, args, command="atlas compare") as run:
        write_comparison(run, args, runs, tables)
    return 0


def features(rows: list[dict]) -> dict[str, list[float]]:
    import numpy as np

    out = {}
    for name in FEATURES:
        if name == "log_mean_distance":
            out[name] = [math.log1p(r["mean_distance"]) if np.isfinite(r["mean_distance"]) else math.nan for r in rows]
        else:
            out[name] = [r.get(name, math.nan) for r in rows]
    return out


def pca(matrix):
    """(points (n, 2), explained variance shares [2], the features kept): z-scores per column (NaN: the
    column's mean), columns with no number or no spread dropped, then the SVD's first two components."""
    import numpy as np

    X = np.asarray(matrix, dtype=float)
    keep = np.isfinite(X).any(0)
    X = X[:, keep]
    mean = np.nanmean(X, 0)
    std = np.nanstd(X, 0)
    spread = std > 1e-12
    X, mean, std = X[:, spread], mean[spread], std[spread]
    Z = np.where(np.isfinite(X), (X - mean) / np.where(std > 0, std, 1), 0.0)
    if Z.shape[1] == 0:
        return np.zeros((len(Z), 2)), [0.0, 0.0], np.zeros(0, bool)
    U, s, _ = np.linalg.svd(Z - Z.mean(0), full_matrices=False)
    pts = U[:, :2] * s[:2]
    if pts.shape[1] < 2:
        pts = np.pad(pts, ((0, 0), (0, 2 - pts.shape[1])))
    var = s ** 2 / max(float((s ** 2).sum()), 1e-30)
    explained = [float(var[k]) if k < len(var) else 0.0 for k in range(2)]
    used = np.zeros(keep.shape, bool)
    used[np.flatnonzero(keep)[spread]] = True
    return pts, explained, used


def write_comparison(run, args, runs: list[Path], tables: list[list[dict]]):
    import numpy as np

    from bertscope.analyses.atlas import head_types as T
    from bertscope.analyses.atlas.outputs import COMPARE_FIGURE, COMPARE_FILE

    rows = [dict(r, run=str(path)) for path, table in zip(runs, tables) for r in table]
    feats = features(rows)
    matrix = np.stack([np.asarray(feats[name], dtype=float) for name in FEATURES], 1)  # (n heads, F)
    points, explained, used = pca(matrix)
    out = [{"model": r["model"], "run": r["run"], "layer": int(r["layer"]), "head": int(r["head"]),
            "types": r["types"], "pc1": float(points[i, 0]), "pc2": float(points[i, 1]),
            **{name: feats[name][i] for name in FEATURES}} for i, r in enumerate(rows)]
    run.write_csv(COMPARE_FILE, out, COLUMNS)
    first = [next((t for t in T.TYPES if t in (r["types"] or "").split("+")), None) for r in rows]
    models = [r["model"] for r in rows]
    if not args.no_figures:
        from bertscope.analyses.atlas.plots import plot_compare

        run.save_figure(plot_compare(points, models, first, explained), COMPARE_FIGURE)
    per_model = {}
    for m in dict.fromkeys(models):
        sel = [i for i, x in enumerate(models) if x == m]
        per_model[m] = {"heads": len(sel), "counts": {t: sum(1 for i in sel if t in (rows[i]["types"] or "").split("+"))
                                                      for t in T.TYPES}}
    results = {"runs": [str(r) for r in runs], "features": [f for f, u in zip(FEATURES, used) if u],
               "explained": explained, "models": per_model}
    run.log(f"{len(rows)} heads of {len(per_model)} models; PC 1 and PC 2 explain {100 * explained[0]:.0f}% and "
            f"{100 * explained[1]:.0f}% of the variance of {len(results['features'])} standardised features")
    for m, r in per_model.items():
        run.log(f"{m}: {r['heads']} heads; " + ", ".join(f"{t} {c}" for t, c in r["counts"].items() if c))
    run.finish(results)
