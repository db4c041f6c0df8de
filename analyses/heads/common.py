"""What the `bertscope heads` commands share: the task-data options, and `run_variants`,
which evaluates gated variants of a fine-tuned model against its baseline.

A command that evaluates gated variants (`heads disable`, `heads ablate`) takes
`add_variant_arguments` and calls `run_variants` with its gate, its variant set and an
`outputs` hook for its figures and results. Every variant runs on the same weights through the
model's head gates, several variants per forward pass (`bertscope.analyses.heads.variants`). Outputs: a CSV
with one row per variant (the name in the command's outputs.py), the figures of the command's
hook, and its entry in run.json.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from bertscope.cli.args import add_common_arguments, fraction, limit_arg
from bertscope.data.paths import seeded_sample
from bertscope.data.readers.tasks import read_task
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

if TYPE_CHECKING:
    from bertscope.kernels.spec import Gate

# numpy, torch and what imports them (the variants, the paired tests, the kernels' Gate, the task
# inputs) are imported inside the functions that run the analysis: the `heads` commands import this
# module to build their parsers, so a mistyped option is refused at once (tests/cli/test_new_user.py)

ENCODERS_ONLY = ("it scores a fine-tuned sentence classifier on its task; on a decoder, heads importance and heads "
                 "prune read the language-modelling loss")

COLUMNS = ("variant", "kind", "layer", "head", "metric", "accuracy", "delta", "ci_low", "ci_high", "b", "c", "p",
           "q", "significant")
TASK_CHOICES = ("rte", "polarity", "arct")


def add_task_data_arguments(p, split_default: str, split_help: str, splits=("train", "dev", "test"),
                            task_required: bool = True, task_help: str = "the task the model was fine-tuned on",
                            limit_help: str | None = "a seeded sample of N examples of each split used (default: all)",
                            tasks: tuple[str, ...] = TASK_CHOICES):
    """--task (one of `tasks`), --split, --arct-version and (unless limit_help is None) --limit: the
    task data of every `heads` subcommand."""
    p.add_argument("--task", required=task_required, default=None, choices=tasks, help=task_help)
    p.add_argument("--split", choices=splits, default=split_default, help=split_help)
    p.add_argument("--arct-version", choices=("original", "adversarial"), default="original",
                   help="ARCT data: the original or Niven & Kao's adversarial set (default: original)")
    if limit_help is not None:
        p.add_argument("--limit", type=limit_arg, default=None, metavar="N", help=limit_help)


def add_variant_arguments(d):
    """The options of every command that evaluates gated variants through `run_variants`."""
    add_task_data_arguments(d, "test", "evaluation split (default: test; RTE test is RTE3's 800 pairs)",
                            splits=("dev", "test"),
                            limit_help="a seeded sample of N examples of the split (default: all)")
    d.add_argument("--alpha", type=fraction, default=0.05,
                   help="false discovery rate: variants with BH-adjusted q below it are significant; each "
                   "variant's interval is at level 1 - alpha (default: 0.05)")
    d.add_argument("--max-rows", type=int, default=512, metavar="N",
                   help="model rows per forward pass: ceil(N / batch rows) variants share one batch; 0 runs the "
                   "variants one by one (default: 512)")
    add_common_arguments(d, from_word=False)


def load_split(args):
    """The examples of the task split (a seeded sample with --limit)."""
    examples = read_task(args.task, args.split, args.data_dir, seed=0, version=args.arct_version)
    if not examples:
        raise UserError(f"the {args.task} {args.split} split has no examples")
    return seeded_sample(examples, args.limit, args.seed)


def run_variants(args, name: str, gate: Gate, outputs, variants=None, table: str | None = None):
    """Evaluate the baseline and `variants` on the task split; write the CSV `table` (default
    `<name>.csv`), run.json's entry and, through `outputs`, the figures and anything else the
    command adds.

    variants: a list of `Variant`, or a function (layers, H) -> list for sets that depend on
      the model's shape (known once it has loaded); default every single head and every whole
      layer under `gate` (`heads disable`).
    outputs: a function (run, rows, results) called after the CSV and the summary, before
      run.json is written: it saves figures and may add to `results`. run.loaded and
      run.args give the model and the options.
    """
    if args.max_rows < 0:
        raise UserError(f"--max-rows must be >= 0, not {args.max_rows}")
    examples = load_split(args)  # a missing data set fails before the model loads
    with ModelRun(name, args, task="sequence-classification", command=f"heads {args.heads}",
                  encoders_only=ENCODERS_ONLY) as run:
        return evaluate(run, args, name, gate, outputs, variants, table, examples)


def evaluate(run: ModelRun, args, name: str, gate: Gate, outputs, variants, table: str | None, examples) -> list[dict]:
    """`run_variants` once the model has loaded."""
    from bertscope.analyses.heads import variants as V
    from bertscope.tasks.inputs import check_head, encode_task

    loaded = run.loaded
    check_head(args.task, loaded)
    task = encode_task(args.task, examples, loaded.tokenizer, args.max_len)
    L, H = loaded.n_layers, loaded.n_heads
    if variants is None:
        variants = V.single_heads(L, H, gate) + V.whole_layers(L, H, gate)
    elif callable(variants):
        variants = variants(L, H)
    variants = [V.baseline(L, H)] + list(variants)
    run.log(f"{args.task} {args.split}: {task.n_examples} examples ({task.truncated} rows cut to {args.max_len} "
            f"tokens), {len(variants)} variants ({gate.name.lower()} gate)")
    res = V.evaluate_variants(loaded, task, variants, args.batch_size, args.max_rows, run.progress, desc=name)
    rows = variant_rows(res, args.alpha)
    run.write_csv(table or f"{name}.csv", rows, COLUMNS)
    results = summarise(rows, task, res, gate, args)
    for line in summary_lines(results):
        run.log(line)
    outputs(run, rows, results)
    run.finish(results)
    return rows


def figure_title(run) -> str:
    """`task split, model folder` (or Hub id): the first line of every figure's title."""
    source = run.loaded.source
    return f"{run.args.task} {run.args.split}, {source.hub_id if source and source.hub_id else run.loaded.path.name}"


def variant_rows(res, alpha: float) -> list[dict]:
    """One CSV row per variant: accuracy, delta vs the baseline (variant 0), its exact interval at
    level 1 - alpha (McNemar's test inverted: it excludes 0 iff p < alpha), McNemar's (b, c, p) and
    the BH q over the non-baseline variants."""
    import numpy as np

    from bertscope.analyses.heads.paired import bh_adjust, disagreements, mcnemar_exact, mcnemar_interval

    correct, acc = res.correct, res.accuracy  # (V, N), (V,)
    base = correct[0]
    b, c = disagreements(correct, base)
    p = mcnemar_exact(b, c)
    low, high = mcnemar_interval(b, c, correct.shape[1], level=1 - alpha)
    q = np.full(len(p), np.nan)
    q[1:] = bh_adjust(p[1:])
    rows = []
    for i, v in enumerate(res.variants):
        first = i == 0
        rows.append({"variant": v.name, "kind": v.kind, "layer": v.layer or "", "head": v.head or "",
                     "metric": "accuracy", "accuracy": float(acc[i]), "delta": float(acc[i] - acc[0]),
                     "ci_low": "" if first else float(low[i]), "ci_high": "" if first else float(high[i]),
                     "b": int(b[i]), "c": int(c[i]), "p": "" if first else float(p[i]),
                     "q": "" if first else float(q[i]), "significant": "" if first else bool(q[i] < alpha)})
    return rows


def summarise(rows, task, res, gate, args) -> dict:
    """run.json's results: baseline, best and worst variants, the significant ones."""
    import numpy as np

    base = rows[0]["accuracy"]
    heads = [r for r in rows if r["kind"] == "head"]
    layers = [r for r in rows if r["kind"] == "layer"]
    return {
        "task": args.task, "split": args.split, "arct_version": args.arct_version if args.task == "arct" else None,
        "gate": gate.name.lower(), "examples": task.n_examples, "truncated_rows": task.truncated,
        "variants": len(rows), "forwards": res.forwards, "eval_s": round(res.elapsed_s, 2),
        "interval": f"exact, McNemar inverted (Clopper-Pearson on the discordant pairs), level {1 - args.alpha:g}",
        "alpha": args.alpha, "baseline_accuracy": base,
        "mean_delta_heads": float(np.mean([r["delta"] for r in heads])) if heads else None,
        "heads_better": sum(r["delta"] > 0 for r in heads), "heads_worse": sum(r["delta"] < 0 for r in heads),
        "best_head": _extreme(heads, max), "worst_head": _extreme(heads, min),
        "layers": {r["variant"]: {"accuracy": r["accuracy"], "delta": r["delta"], "ci": [r["ci_low"], r["ci_high"]],
                                  "p": r["p"], "q": r["q"], "significant": r["significant"]} for r in layers},
        "significant": [r["variant"] for r in rows[1:] if r["significant"]],
    }


def _extreme(rows, pick) -> dict | None:
    """The row with the largest (pick=max) or smallest (min) delta, in brief."""
    if not rows:
        return None
    r = pick(rows, key=lambda r: r["delta"])
    return {k: r[k] for k in ("variant", "accuracy", "delta", "q")}


def summary_lines(results: dict) -> list[str]:
    pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    lines = [f"baseline accuracy {100 * results['baseline_accuracy']:.1f}% on {results['examples']} examples"]
    if results["best_head"]:
        best, worst = results["best_head"], results["worst_head"]
        lines.append(f"single heads: {results['heads_better']} better, {results['heads_worse']} worse, mean "
                     f"{pts(results['mean_delta_heads'])} points; best {best['variant']} {pts(best['delta'])}, "
                     f"worst {worst['variant']} {pts(worst['delta'])}")
    for name, r in results["layers"].items():
        lines.append(f"{name} disabled: {100 * r['accuracy']:.1f}% ({pts(r['delta'])} points, 95% CI "
                     f"[{pts(r['ci'][0])}, {pts(r['ci'][1])}], q = {r['q']:.3g})")
    sig = results["significant"]
    lines.append(f"significant at q < {results['alpha']}: {', '.join(sig) if sig else 'none'}")
    return lines
