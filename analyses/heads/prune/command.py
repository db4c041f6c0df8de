"""`bertscope heads prune`: Michel et al. (2019)'s iterative pruning (section 4).

Repeatedly: compute the head importance I_h (`bertscope.analyses.heads.importance.stats`) on held-out data
(--importance-split, default dev) with the heads pruned so far gated to 0; prune the live heads
with the lowest scores, 10% of the ORIGINAL head count per step; evaluate the pruned model on
the evaluation split (--split, default test). Step s prunes round(s x step x heads) heads in all
(rounded half up, cumulative, so each step removes 7 or 8 of MiniLM's 72 heads and step 9
reaches 65 = 90.3%). A head once pruned is never picked again: its importance is NaN.

The baseline beside it: the same counts pruned in a random order (one seeded permutation of
all heads per seed, --random-seeds of them: their min-max band and mean). Pruning here is
masking (ZERO gates, `bertscope.analyses.heads.variants`): every step's model is evaluated in one batched pass
over the split, with no copies of the weights. prune_order.csv lists the heads removed at each
step, for real pruning (removing them from the weights) to read.

The paper's headline (bert-base on MNLI: about 40% of the heads can go with little loss) is
read here as the largest fraction pruned such that every step up to it stays within 1 point
(--tolerance) of the unpruned accuracy.

Outputs: prune.csv (step, fraction_pruned, heads_pruned, order, seed, accuracy, delta),
prune_order.csv (step, fraction_pruned, layer, head: the heads the importance order removes at
each step, layer and head from 1), fig_prune.png, run.json['analyses']['prune'].
"""
from __future__ import annotations

import argparse

from bertscope.analyses.heads import options as LMD
from bertscope.analyses.heads.common import load_split
from bertscope.analyses.heads.importance.command import add_task_arguments
from bertscope.analyses.heads.prune.outputs import (
    FIGURE,
    ORDER_COLUMNS,
    ORDER_FILE,
    PRUNE_FILE,
)
from bertscope.cli.args import add_common_arguments, fraction
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

# numpy, torch and what imports them (the variants, the statistics, the --task lm pruning, the figure,
# the model loader) are imported inside the functions that run the analysis, so that building this
# command's parser does not, and a mistyped option is refused at once (tests/cli/test_new_user.py)

COLUMNS = ("step", "fraction_pruned", "heads_pruned", "order", "seed", "accuracy", "delta")
HELP = "iterative pruning by head importance against random pruning (Michel et al. 2019, section 4)"
DESCRIPTION = (
    "Michel et al. (2019): repeatedly compute the head importance E|dL/dxi_h| on held-out data (default dev) "
    "with the heads pruned so far masked, prune the lowest-scoring 10% of the original heads, and evaluate on "
    "the test split; up to 90% pruned. Beside it, random pruning orders (seeded). Writes prune.csv, "
    "prune_order.csv, fig_prune.png and run.json['analyses']['prune']. With --task lm, a decoder: importance with the "
    "language-modelling loss on --limit segments of running text (--corpus), perplexity on the --eval-limit "
    "segments after them.")




def add_arguments(p):
    add_task_arguments(p, "the evaluation split (default: test)", "test")
    p.add_argument("--importance-split", choices=("train", "dev", "test"), default="dev",
                   help="the held-out split importance is computed on (default: dev)")
    p.add_argument("--step", type=fraction, default=0.1,
                   help="fraction of the original heads pruned per step (default: 0.1)")
    p.add_argument("--max-fraction", type=fraction, default=0.9,
                   help="prune up to this fraction of the heads (default: 0.9)")
    p.add_argument("--random-seeds", type=int, default=5, metavar="N",
                   help="random pruning orders, seeds --seed .. --seed + N - 1 (default: 5; 0 for none)")
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="'within 1 point': the accuracy drop still counted as no loss (default: 0.01)")
    p.add_argument("--max-rows", type=int, default=512, metavar="N",
                   help="model rows per forward pass when evaluating the pruned variants (default: 512)")
    LMD.add_lm_arguments(p, prune=True)
    add_common_arguments(p, from_word=False)


def main(args) -> int:
    from bertscope.analyses.heads.prune.lm_prune import run_lm_prune

    if args.task == LMD.LM or args.resume:  # only --task lm runs resume: the task is the recorded run's
        if args.task == LMD.LM:
            LMD.refuse_task_data_options(args, {"split": "test", "arct_version": "original"})
        run_lm_prune(args, add_arguments)
        return 0
    LMD.drop_lm_options(args, LMD.PRUNE_LM_OPTIONS)
    run_prune(args)
    return 0


def run_prune(args):
    if args.task is None:
        raise UserError("heads prune needs --task")
    if args.max_fraction < args.step:
        raise UserError(f"--max-fraction {args.max_fraction} is below --step {args.step}: nothing to prune")
    if args.random_seeds < 0 or args.max_rows < 0:
        raise UserError("--random-seeds and --max-rows must be >= 0")
    if args.importance_split == args.split:
        raise UserError(f"--importance-split and --split are both {args.split}: importance must come from held-out "
                        "data other than the split the pruned model is scored on")
    held_out = load_split(argparse.Namespace(**{**vars(args), "split": args.importance_split}))
    evaluation = load_split(args)  # missing data fails before the model loads
    with ModelRun("prune", args, task="sequence-classification", command="heads prune") as run:
        return prune(run, args, held_out, evaluation)


def prune(run: ModelRun, args, held_out: list, evaluation: list) -> list[dict]:
    """`run_prune` once the model has loaded."""
    from bertscope.analyses.heads import variants as V
    from bertscope.analyses.heads.prune.plots import plot_prune
    from bertscope.analyses.heads.prune.stats import cumulative_variants, importance_order, prune_counts, random_order
    from bertscope.models.loading import model_name
    from bertscope.tasks.inputs import check_head, encode_task

    loaded = run.loaded
    L, H = loaded.n_layers, loaded.n_heads
    counts = prune_counts(L * H, args.step, args.max_fraction)
    check_head(args.task, loaded)
    dev_task = encode_task(args.task, held_out, loaded.tokenizer, args.max_len)
    test_task = encode_task(args.task, evaluation, loaded.tokenizer, args.max_len)
    run.log(f"{args.task}: importance on {args.importance_split} ({dev_task.n_examples} examples), accuracy on "
            f"{args.split} ({test_task.n_examples}); {len(counts)} steps pruning {', '.join(map(str, counts))} of "
            f"{L * H} heads; {args.random_seeds} random orders")
    removed, steps = importance_order(loaded, dev_task, counts, args.batch_size, args.convention,
                                      not args.no_normalise, run.progress, run.log)
    seeds = [args.seed + i for i in range(args.random_seeds)]
    orders = {("importance", ""): removed} | {("random", s): random_order(L, H, counts, s) for s in seeds}
    variants = [V.baseline(L, H)]
    for (order, seed), heads in orders.items():
        variants += cumulative_variants(f"{order} {seed}".strip(), heads, L, H)
    res = V.evaluate_variants(loaded, test_task, variants, args.batch_size, args.max_rows, run.progress, desc="prune")
    acc = res.accuracy
    base = float(acc[0])
    rows, i = [], 1
    for (order, seed), _heads in orders.items():
        rows.append(dict(step=0, fraction_pruned=0.0, heads_pruned=0, order=order, seed=seed, accuracy=base, delta=0.0))
        for s, n in enumerate(counts, 1):
            rows.append(dict(step=s, fraction_pruned=n / (L * H), heads_pruned=n, order=order, seed=seed,
                             accuracy=float(acc[i]), delta=float(acc[i]) - base))
            i += 1
    run.write_csv(PRUNE_FILE, rows, COLUMNS)
    order_rows = [dict(step=s, fraction_pruned=counts[s - 1] / (L * H), layer=lay + 1, head=h + 1)
                  for s, heads in enumerate(removed, 1) for lay, h in heads]
    run.write_csv(ORDER_FILE, order_rows, ORDER_COLUMNS)
    results = summarise(rows, base, args, dev_task, test_task, steps, counts, L * H, res)
    if not args.no_figures:
        title = (f"{args.task}: importance on {args.importance_split}, accuracy on {args.split} "
                 f"({test_task.n_examples}), {model_name(loaded.path)}")
        run.save_figure(plot_prune(rows, title, args.tolerance), FIGURE)
    for line in results["summary"]:
        run.log(line)
    run.finish(results)
    return rows


def summarise(rows, base, args, dev_task, test_task, steps, counts, n_heads, res) -> dict:
    """run.json's results, and their lines on the terminal."""
    import numpy as np

    from bertscope.analyses.heads.prune.stats import prunable_fraction

    def curve(order, seed=""):
        got = [r for r in rows if r["order"] == order and r["seed"] == seed]
        return [r["fraction_pruned"] for r in got], [r["accuracy"] for r in got]

    fr, imp_acc = curve("importance")
    within = prunable_fraction(fr, imp_acc, base, args.tolerance)
    seeds = sorted({r["seed"] for r in rows if r["order"] == "random"})
    random_within = [prunable_fraction(*curve("random", s), base, args.tolerance) for s in seeds]
    random_acc = np.array([curve("random", s)[1] for s in seeds]) if seeds else None
    results = {
        "task": args.task, "importance_split": args.importance_split, "split": args.split,
        "arct_version": args.arct_version if args.task == "arct" else None,
        "importance_examples": dev_task.n_examples, "examples": test_task.n_examples, "heads": n_heads,
        "convention": args.convention, "normalised": not args.no_normalise, "step": args.step,
        "heads_pruned": counts, "tolerance": args.tolerance, "baseline_accuracy": base,
        "importance_accuracy": imp_acc, "importance_loss_per_step": [s.loss for s in steps],
        "prunable_fraction": within, "random_seeds": seeds,
        "random_mean_accuracy": random_acc.mean(0).tolist() if seeds else None,
        "random_prunable_fraction": random_within, "eval_s": round(res.elapsed_s, 2), "forwards": res.forwards,
    }
    pts = lambda a: f"{100 * a:.1f}"  # noqa: E731
    lines = [f"baseline accuracy {pts(base)}% on {test_task.n_examples} {args.split} examples",
                "by importance: " + ", ".join(f"{f:.0%}: {pts(a)}" for f, a in zip(fr, imp_acc))]
    if seeds:
        lines.append(f"random (mean of {len(seeds)}): "
                        + ", ".join(f"{f:.0%}: {pts(a)}" for f, a in zip(fr, random_acc.mean(0))))
    lines.append(f"prunable within {100 * args.tolerance:g} point: {within:.0%} by importance"
                    + (f", {np.mean(random_within):.0%} on average at random" if seeds else ""))
    results["summary"] = lines
    return results


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, pruning reads importance
    and evaluates the pruned model with SDPA."""
    return {}
