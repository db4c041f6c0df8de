"""`bertscope heads importance`: Michel et al. (2019)'s head importance I_h = E_x |dL(x)/dxi_h| of a
fine-tuned model on its task's held-out data (`bertscope.analyses.heads.importance.stats` has the definitions), and
`--compare RUN ...`: the rank correlation of importance between runs (Michel's "are important
heads the same across datasets?").

importance.csv has exactly the columns `layer, head, importance, importance_raw, rank` (layer and
head from 1; importance after the chosen normalisation; rank 1 = most important), which
`bertscope heads ablate` reads to set importance against the measured ablation effects.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

from bertscope.analyses.heads import options as LMD
from bertscope.analyses.heads.common import TASK_CHOICES, add_task_data_arguments, load_split
from bertscope.analyses.heads.options import CONVENTIONS
from bertscope.cli.args import add_common_arguments
from bertscope.errors import UserError
from bertscope.files import read_run as read_run_json
from bertscope.run.analysis_run import AnalysisRun, ModelRun

if TYPE_CHECKING:
    import numpy as np

# numpy, torch and what imports them (the statistics, the --task lm loss, the importance table, the
# figures, the model loader) are imported inside the functions that run the analysis: the command line
# imports this module to build the parser of `heads importance` (and of `heads prune`), so a mistyped
# option is refused at once (tests/cli/test_new_user.py)

COMPARE_COLUMNS = ("label_a", "label_b", "run_a", "run_b", "n_heads", "spearman", "p", "spearman_raw",
                   "top_overlap")
TOP_SHARE = 0.1  # the top 10% of heads, for the overlap column
HELP = "head importance E|dL/dxi_h| (Michel et al. 2019), or its rank correlation between runs (--compare)"
DESCRIPTION = (
    "Michel et al. (2019), section 4: the importance of head h is I_h = E_x |dL(x)/dxi_h| at xi = 1, the "
    "first-order estimate of the task loss change when the head is masked (xi_h is the gate on the head's "
    "output). One forward and one backward per batch give every head's score. On the task's held-out split "
    "(default dev) of a fine-tuned model (--model). Writes importance.csv (layer, head, importance, "
    "importance_raw, rank), fig_importance.png and run.json['analyses']['importance']. With --compare RUN RUN ...: "
    "the Spearman correlation of the importance.csv of those run directories, pair by pair "
    "(importance_correlation.csv, fig_importance_correlation.png). With --task lm, a decoder's importance with "
    "the language-modelling loss on --limit segments of running text (--corpus, default Wikipedia) of --max-len "
    "tokens.")
LM_TASK_HELP = ("the task the model was fine-tuned on, or lm: a decoder's next-token loss on running text "
                "(--corpus)")
STATE = "importance_state.npz"  # --task lm: the running sums, for --resume


def add_task_arguments(p, split_help: str, split_default: str):
    """Options shared by `heads importance` and `heads prune`."""
    add_task_data_arguments(p, split_default, split_help, task_required=False, tasks=TASK_CHOICES + (LMD.LM,),
                            task_help=LM_TASK_HELP,
                            limit_help="a seeded sample of N examples of each split used; with --task lm, the "
                            "number of segments (default: all)")
    p.add_argument("--convention", choices=CONVENTIONS, default="michel",
                   help="michel: |dL/dxi| per example, then the mean; batch: the gradient summed over a batch "
                   "before the absolute value, as transformers' bertology example does (default: michel)")
    p.add_argument("--no-normalise", action="store_true",
                   help="skip Michel's per-layer L2 normalisation of the scores")


def add_arguments(p):
    add_task_arguments(p, "the split the gradients are taken on (default: dev, held-out data)", "dev")
    p.add_argument("--compare", nargs="+", metavar="RUN", default=None,
                   help="instead: the rank correlation of importance between these run directories (each with an "
                   "importance.csv), written to --out")
    LMD.add_lm_arguments(p)
    add_common_arguments(p, from_word=False)


def main(args) -> int:
    if args.resume:  # only --task lm runs resume: the task is the recorded run's
        run_lm_importance(args)
        return 0
    if args.task != LMD.LM:
        LMD.drop_lm_options(args, LMD.LM_OPTIONS)
    if args.compare:
        compare_runs(args)
    elif args.task is None:
        raise UserError("heads importance needs --task (or --compare RUN RUN ...)")
    elif args.task == LMD.LM:
        LMD.refuse_task_data_options(args, {"split": "dev", "arct_version": "original"})
        run_lm_importance(args)
    else:
        run_importance(args)
    return 0


def compute(args, run, examples, mask=None):
    """(EncodedTask, Importance) of run.loaded on `examples` of args.task, with `mask`."""
    from bertscope.analyses.heads.importance.stats import head_importance
    from bertscope.tasks.inputs import check_head, encode_task

    check_head(args.task, run.loaded)
    task = encode_task(args.task, examples, run.loaded.tokenizer, args.max_len)
    return task, head_importance(run.loaded, task, args.batch_size, args.convention, not args.no_normalise, mask,
                                 run.progress)


def importance_rows(imp) -> list[dict]:
    """importance.csv's rows, one per head in layer-major order (masked heads: empty scores, rank)."""
    import numpy as np

    ranks = imp.ranks()
    L, H = imp.scores.shape
    cell = lambda x: "" if np.isnan(x) else float(x)  # noqa: E731
    return [{"layer": lay + 1, "head": h + 1, "importance": cell(imp.scores[lay, h]),
             "importance_raw": cell(imp.raw[lay, h]), "rank": int(ranks[lay, h]) or ""}
            for lay in range(L) for h in range(H)]


def run_importance(args):
    examples = load_split(args)  # a missing data set fails before the model loads
    with ModelRun("importance", args, task="sequence-classification", command="heads importance") as run:
        return importance(run, args, examples)


def importance(run: ModelRun, args, examples: list):
    """`run_importance` once the model has loaded."""
    import numpy as np

    from bertscope.analyses.heads.importance.outputs import COLUMNS, FIGURE, IMPORTANCE_FILE
    from bertscope.analyses.heads.importance.plots import plot_importance
    from bertscope.models.loading import model_name

    task, imp = compute(args, run, examples)
    run.log(f"{args.task} {args.split}: {task.n_examples} examples ({task.truncated} rows cut to {args.max_len} "
            f"tokens), mean loss {imp.loss:.4f}, convention {imp.convention}")
    rows = importance_rows(imp)
    run.write_csv(IMPORTANCE_FILE, rows, COLUMNS)
    if not args.no_figures:
        title = f"{args.task} {args.split} ({task.n_examples} examples), {model_name(run.loaded.path)}, " \
                f"{imp.convention} convention"
        run.save_figure(plot_importance(imp.scores, imp.ranks(), title, imp.normalised), FIGURE)
    top = sorted(rows, key=lambda r: r["rank"])[:5]
    per_layer = np.nanmean(imp.raw, axis=1)
    results = {"task": args.task, "split": args.split,
               "arct_version": args.arct_version if args.task == "arct" else None,
               "examples": task.n_examples, "truncated_rows": task.truncated, "convention": imp.convention,
               "normalised": imp.normalised, "loss": imp.loss,
               "top_heads": [f"{r['layer']}-{r['head']}" for r in top],
               "raw_mean_per_layer": [float(x) for x in per_layer],
               "raw_max_over_min": float(np.nanmax(imp.raw) / max(np.nanmin(imp.raw), 1e-30))}
    run.log(f"most important heads: {', '.join(results['top_heads'])}; mean raw I_h per layer: "
            + ", ".join(f"{x:.4f}" for x in per_layer))
    run.finish(results)
    return imp


# ----------------------------------------------------------------------------- --task lm


def run_lm_importance(args):
    if args.resume:
        args = LMD.resumed_lm_args("importance", args, add_arguments, "heads importance")
    with ModelRun("importance", args, task="causal-lm", command="heads importance", resumable=True) as run:
        return lm_importance(run, args)


def lm_importance(run: ModelRun, args):
    """`run_lm_importance` once the model has loaded: importance.csv, the figure, run.json."""
    import numpy as np

    from bertscope.analyses.heads import lm_task as LMD
    from bertscope.analyses.heads.importance.outputs import COLUMNS, FIGURE, IMPORTANCE_FILE
    from bertscope.analyses.heads.importance.plots import plot_importance
    from bertscope.models.loading import model_name

    loaded = run.loaded
    segments, report = LMD.lm_segments(loaded, args.corpus, args.max_len, args.limit, args.seed)
    device = next(loaded.model.parameters()).device
    batches = LMD.lm_batches(segments, args.batch_size, LMD.pad_id(loaded.tokenizer), device)
    state = run.dir / STATE
    sums = LMD.LMSums.load(state) if args.resume and state.is_file() else None
    if sums is not None:
        run.log(f"resuming after batch {sums.batches_done} of {len(batches)}")
    res = LMD.lm_importance(loaded, batches, args.convention, not args.no_normalise, None, run.progress, sums,
                            checkpoint=lambda s: s.save(state))
    imp = res.importance
    run.log(f"{args.corpus}: {imp.n_examples} segments of up to {args.max_len} tokens ({res.targets} targets), mean "
            f"segment loss {imp.loss:.4f}, perplexity {res.perplexity:.2f}, convention {imp.convention}")
    rows = importance_rows(imp)
    run.write_csv(IMPORTANCE_FILE, rows, COLUMNS)
    if not args.no_figures:
        title = (f"language-modelling loss, {imp.n_examples} {args.corpus} segments of <= {args.max_len} tokens, "
                 f"{model_name(loaded.path)}, {imp.convention} convention")
        run.save_figure(plot_importance(imp.scores, imp.ranks(), title, imp.normalised), FIGURE)
    top = sorted(rows, key=lambda r: r["rank"])[:5]
    per_layer = np.nanmean(imp.raw, axis=1)
    results = {"task": LMD.LM, "split": args.corpus, "examples": imp.n_examples, "targets": res.targets,
               "max_len": args.max_len, "segments": report.as_dict(), "convention": imp.convention,
               "normalised": imp.normalised, "loss": imp.loss, "token_loss": res.token_loss,
               "perplexity": res.perplexity, "top_heads": [f"{r['layer']}-{r['head']}" for r in top],
               "raw_mean_per_layer": [float(x) for x in per_layer],
               "raw_max_over_min": float(np.nanmax(imp.raw) / max(np.nanmin(imp.raw), 1e-30)),
               "peak_rss_mb": LMD.peak_rss_mb()}
    run.log(f"most important heads: {', '.join(results['top_heads'])}; mean raw I_h per layer: "
            + ", ".join(f"{x:.4f}" for x in per_layer))
    run.finish(results)
    state.unlink(missing_ok=True)
    return imp


# ----------------------------------------------------------------------------- --compare

def read_run(run_dir: Path) -> tuple[str, np.ndarray, np.ndarray]:
    """(label, importance (layers, H), raw (layers, H)) of a run directory's importance.csv; the label
    names the task (from run.json) and the run."""
    from bertscope.analyses.heads.importance.outputs import importance_grid, read_importance

    table = read_importance(run_dir)
    n_layers, n_heads = max(k[0] for k in table), max(k[1] for k in table)
    label = Path(run_dir).name
    record = Path(run_dir) / "run.json"
    if record.is_file():
        results = (read_run_json(record)["analyses"].get("importance") or {}).get("results") or {}
        if results.get("task"):
            label = f"{results['task']} ({label})"
    return (label, importance_grid(table, n_layers, n_heads, "importance"),
            importance_grid(table, n_layers, n_heads, "importance_raw"))


def correlation_row(a, b, run_a, run_b) -> dict:
    """Spearman's rho of two runs' importance (and raw scores) over the heads scored in both, and the
    share of the top TOP_SHARE heads they have in common."""
    import numpy as np
    from scipy.stats import spearmanr  # here: scipy's start-up, and `bertscope --help` imports this module

    (label_a, imp_a, raw_a), (label_b, imp_b, raw_b) = a, b
    if imp_a.shape != imp_b.shape:
        raise UserError(f"{run_a} has {imp_a.shape[0]} x {imp_a.shape[1]} heads, {run_b} {imp_b.shape[0]} x "
                        f"{imp_b.shape[1]}: importance compares only models of the same shape")
    both = ~np.isnan(imp_a) & ~np.isnan(imp_b)
    rho, p = spearmanr(imp_a[both], imp_b[both])
    rho_raw, _ = spearmanr(raw_a[both], raw_b[both])
    k = max(1, int(TOP_SHARE * both.sum() + 0.5))
    top = lambda g: set(np.argsort(-np.where(both, g, -np.inf).ravel(), kind="stable")[:k])  # noqa: E731
    return {"label_a": label_a, "label_b": label_b, "run_a": str(run_a), "run_b": str(run_b),
            "n_heads": int(both.sum()), "spearman": float(rho), "p": float(p), "spearman_raw": float(rho_raw),
            "top_overlap": len(top(imp_a) & top(imp_b)) / k}


def compare_runs(args):
    runs = [Path(r) for r in args.compare]
    if len(runs) < 2:
        raise UserError("--compare needs at least two run directories")
    data = [read_run(r) for r in runs]
    with AnalysisRun("importance_compare", args) as run:
        write_correlations(run, args, runs, data)


def write_correlations(run: AnalysisRun, args, runs: list[Path], data: list):
    import numpy as np

    from bertscope.analyses.heads.importance.outputs import CORRELATION_FIGURE, CORRELATION_FILE
    from bertscope.analyses.heads.importance.plots import plot_correlation

    rows = [correlation_row(data[i], data[j], runs[i], runs[j]) for i, j in itertools.combinations(range(len(runs)), 2)]
    run.write_csv(CORRELATION_FILE, rows, COMPARE_COLUMNS)
    labels = [d[0] for d in data]
    rho = np.eye(len(runs))
    for (i, j), r in zip(itertools.combinations(range(len(runs)), 2), rows):
        rho[i, j] = rho[j, i] = r["spearman"]
        run.log(f"{r['label_a']} vs {r['label_b']}: Spearman {r['spearman']:+.3f} (p = {r['p']:.2g}; raw scores "
                f"{r['spearman_raw']:+.3f}), top {TOP_SHARE:.0%} overlap {r['top_overlap']:.2f}")
    if not args.no_figures:
        run.save_figure(plot_correlation(rho, labels, f"Spearman rho of head importance over {rows[0]['n_heads']} "
                                         "heads"), CORRELATION_FIGURE)
    run.finish({"runs": [str(r) for r in runs], "labels": labels,
                "pairs": {f"{r['label_a']} | {r['label_b']}": {k: r[k] for k in ("spearman", "p", "spearman_raw",
                                                                                  "top_overlap")} for r in rows}})


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, the gates' gradients run
    SDPA with autograd."""
    return {}
