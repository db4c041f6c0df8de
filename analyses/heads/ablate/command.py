"""`bertscope heads ablate`: Michel et al. (2019) head ablation of a fine-tuned model.

Masked heads get the ZERO gate (xi_h = 0: the head's slice of the attention output is zeroed
before W_o), through the same `run_variants` as `heads disable` (which uses the UNIFORM gate):
every single head masked, and per layer every "all heads but one" (`--variants`). With an
importance CSV (`--importance`, or importance.csv already in the run directory) it also
reports how well importance ranks the heads by their ablation effect (Spearman).
Definitions: `bertscope.analyses.heads.ablate.stats`.
"""
from __future__ import annotations

from pathlib import Path

from bertscope.analyses.heads.ablate.outputs import (
    ABLATE_FILE,
    BUT_ONE_FIGURE,
    BUT_ONE_FILE,
    HEADS_FIGURE,
    HISTOGRAM_FIGURE,
    IMPORTANCE_FIGURE,
)
from bertscope.analyses.heads.common import add_variant_arguments, figure_title, run_variants
from bertscope.errors import UserError

# the variants, the statistics, the figures, the importance table and the kernels' Gate import numpy or
# torch: they are imported inside the functions that run the analysis, so that building this command's
# parser does not, and a mistyped option is refused at once (tests/cli/test_new_user.py)

HELP = "Michel et al. (2019): task accuracy with each head masked, and with all heads of a layer but one"
DESCRIPTION = (
    "Michel et al. (2019), 'Are Sixteen Heads Really Better than One?': a masked head's output is zeroed "
    "(xi_h = 0 in sum_h xi_h W_o^h Att_h(x)). Evaluates the fine-tuned model (--model, with a "
    "sequence-classification head) on the task split unmasked, with each single head masked (--variants "
    "single) and, for each layer and each head h, with every head of the layer but h masked (--variants "
    "but-one). Per variant: accuracy, its change against the baseline with an exact interval (McNemar's "
    "test inverted), McNemar's exact test and Benjamini-Hochberg q over all variants. With an importance "
    "CSV (--importance, or importance.csv in the run directory, from `bertscope heads importance`): "
    "Spearman's rank correlation between importance and the accuracy lost when the head is masked. Writes "
    "ablate.csv, ablate_but_one.csv, fig_ablate_heads.png, fig_ablate_hist.png, fig_ablate_but_one.png, "
    "fig_ablate_importance.png and run.json['analyses']['ablate'].")
VARIANT_SETS = ("single", "but-one", "both")


def add_arguments(p):
    p.add_argument("--variants", choices=VARIANT_SETS, default="both",
                   help="single heads masked, all heads of a layer but one, or both (default: both)")
    p.add_argument("--importance", metavar="PATH", default=None,
                   help="importance.csv, or a run directory holding one (columns layer, head, importance, "
                   "importance_raw, rank; default: the run directory's own, if --out names one that has it)")
    add_variant_arguments(p)


def main(args) -> int:
    from bertscope.analyses.heads.importance.outputs import IMPORTANCE_FILE, read_importance
    from bertscope.kernels.spec import Gate

    importance, source = None, args.importance
    if source is None and args.out and (Path(args.out) / IMPORTANCE_FILE).is_file():
        source = args.out  # the run directory already holds `heads importance`'s output
    if source is not None:
        if args.variants == "but-one":
            if args.importance is not None:
                raise UserError("--importance compares importance with single-head ablation: use --variants "
                                "single or both")
        else:
            importance = (source, read_importance(source))  # a bad file fails before the model loads
    run_variants(args, "ablate", Gate.ZERO, variants=variant_set(args.variants, importance),
                 outputs=lambda run, rows, results: outputs(run, rows, results, importance), table=ABLATE_FILE)
    return 0


def variant_set(which: str, importance=None):
    """(layers, H) -> the variants of `--variants`; checks the importance table against the
    model's shape first, so a file of another model fails before the evaluation, not after."""
    from bertscope.analyses.heads import variants as V
    from bertscope.analyses.heads.importance.outputs import importance_grid
    from bertscope.kernels.spec import Gate

    def make(n_layers: int, n_heads: int):
        if importance is not None:
            importance_grid(importance[1], n_layers, n_heads)
        single = V.single_heads(n_layers, n_heads, Gate.ZERO) if which != "but-one" else []
        return single + (V.all_but_one(n_layers, n_heads, Gate.ZERO) if which != "single" else [])
    return make


def outputs(run, rows: list[dict], results: dict, importance=None):
    """ablate's figures, but-one table and importance correlation, added to `results`."""
    from bertscope.analyses.heads.ablate import stats as A
    from bertscope.analyses.heads.ablate.plots import plot_but_one, plot_histogram, plot_importance
    from bertscope.analyses.heads.disable.plots import plot_heads
    from bertscope.analyses.heads.importance.outputs import importance_grid, importance_path

    args, L, H = run.args, run.loaded.n_layers, run.loaded.n_heads
    title, figures = figure_title(run), not args.no_figures
    results["variant_set"] = args.variants
    singles = [r for r in rows if r["kind"] == "head"]
    if singles:
        deltas = A.head_deltas(rows, L, H)  # (L, H)
        within = int((abs(deltas) <= A.HALF_POINT + 1e-12).sum())
        results["heads_within_half_point"] = within
        run.log(f"single heads within 0.5 points of the baseline: {within} of {len(singles)}")
        if figures:
            run.save_figure(plot_heads(rows, L, H, title, "zero"), HEADS_FIGURE)
            run.save_figure(plot_histogram(deltas.ravel(), results["examples"], title), HISTOGRAM_FIGURE)
    table = A.but_one_table(rows, args.alpha)
    if table:
        run.write_csv(BUT_ONE_FILE, table, A.BUT_ONE_COLUMNS)
        enough = A.one_head_suffices(table)
        results["but_one"] = {"per_layer": table, "one_head_suffices": enough}
        for r in table:
            run.log(f"layer {r['layer']} with only head {r['best_head']} (its best): {100 * r['delta']:+.1f} points "
                    f"(95% CI [{100 * r['ci_low']:+.1f}, {100 * r['ci_high']:+.1f}], q = {r['q']:.3g}); worst kept "
                    f"head {r['worst_head']} {100 * r['worst_delta']:+.1f}")
        run.log(f"one head suffices (best kept head not significantly worse) in {len(enough)} of {len(table)} "
                f"layers: {', '.join(map(str, enough)) or 'none'}")
        if figures:
            run.save_figure(plot_but_one(rows, table, title), BUT_ONE_FIGURE)
    if importance is not None and singles:
        source, values = importance
        delta = A.head_deltas(rows, L, H)
        corr = {column: A.rank_correlation(importance_grid(values, L, H, column), delta)
                for column in ("importance", "importance_raw")}
        results["importance"] = {"file": str(importance_path(source)), **corr}
        for column, c in corr.items():
            rho = "undefined (constant)" if c["spearman"] is None else f"{c['spearman']:+.3f} (p = {c['p']:.3g})"
            run.log(f"Spearman rho between {column} and the accuracy lost when the head is masked: {rho}, "
                    f"{c['heads']} heads")
        if figures:
            run.save_figure(plot_importance(importance_grid(values, L, H), delta, corr["importance"], title),
                            IMPORTANCE_FIGURE)


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, the ablated variants run
    gated SDPA outside an analysis (heads/variants.py)."""
    return {}
