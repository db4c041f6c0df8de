"""`bertscope heads prune --task lm`: Michel et al.'s iterative pruning of a decoder's query heads,
scored by perplexity on held-out running text (`bertscope.analyses.heads.lm_task` has the data and the loss).

Each step computes I_h with the language-modelling loss on the --limit importance segments, with
the heads pruned so far gated to 0, and prunes the live heads with the lowest scores (10% of the
original heads per step, `stats.prune_counts`); seeded random orders beside it (`stats.random_order`).
Every step of every order is scored by perplexity on the --eval-limit segments after the importance
ones (no article in both), the pruned heads gated to 0.

Resume: prune_state.json holds the heads removed by each finished step and every perplexity
measured; prune_state.npz the sums of the importance step in progress. `--resume DIR` takes them
up where the run stopped.

Outputs: prune.csv (step, fraction_pruned, heads_pruned, order, seed, loss, perplexity,
perplexity_ratio: against the unpruned model), prune_order.csv (as for a classifier: `heads remove
--from-prune` reads it), prune_importance.csv (step, layer, head, importance, importance_raw, rank:
the importance each step pruned by; step 1's is the unpruned model's, what `heads importance --task
lm` writes), fig_prune.png, run.json['analyses']['prune'].
"""
from __future__ import annotations

import json

import numpy as np

from bertscope.analyses.heads import lm_task as LMD
from bertscope.analyses.heads.importance.command import importance_rows
from bertscope.analyses.heads.importance.stats import least_important
from bertscope.analyses.heads.prune.outputs import (
    FIGURE,
    IMPORTANCE_STEPS_FILE,
    LM_COLUMNS,
    ORDER_COLUMNS,
    ORDER_FILE,
    PRUNE_FILE,
)
from bertscope.analyses.heads.prune.plots import plot_lm_prune
from bertscope.analyses.heads.prune.stats import prune_counts, random_order
from bertscope.errors import UserError
from bertscope.files import write_text
from bertscope.models.loading import model_name
from bertscope.run.analysis_run import ModelRun

STATE = "prune_state.json"
SUMS = "prune_state.npz"


def run_lm_prune(args, add_arguments):
    """The command's `main` for --task lm; `add_arguments`: the command's, to check a resumed run's settings."""
    if args.resume:
        args = LMD.resumed_lm_args("prune", args, add_arguments, "heads prune")
    if args.max_fraction < args.step:
        raise UserError(f"--max-fraction {args.max_fraction} is below --step {args.step}: nothing to prune")
    if args.random_seeds < 0:
        raise UserError("--random-seeds must be >= 0")
    if args.limit is None:
        raise UserError("heads prune --task lm needs --limit N: the importance segments (perplexity is measured on "
                        "the --eval-limit segments after them)")
    if args.eval_limit is not None and args.eval_limit < 1:
        raise UserError(f"--eval-limit must be at least 1, not {args.eval_limit}")
    with ModelRun("prune", args, task="causal-lm", command="heads prune", resumable=True) as run:
        return lm_prune(run, args)


class State:
    """prune_state.json: {"removed": [[[layer, head], ...] per finished step], "losses": {variant: [loss, targets]}}."""

    def __init__(self, run, resume: bool):
        self.path, self.sums_path = run.dir / STATE, run.dir / SUMS
        data = json.loads(self.path.read_text()) if resume and self.path.is_file() else {}
        self.removed = [[tuple(h) for h in step] for step in data.get("removed", [])]
        self.importance = data.get("importance", [])  # per finished step: importance_rows, loss, perplexity
        self.losses = {k: tuple(v) for k, v in data.get("losses", {}).items()}
        self.resumed = bool(data)

    def save(self):
        write_text(self.path, json.dumps({"removed": self.removed, "importance": self.importance,
                                          "losses": self.losses}))

    def clear(self):
        self.path.unlink(missing_ok=True)
        self.sums_path.unlink(missing_ok=True)


def lm_prune(run: ModelRun, args) -> list[dict]:
    loaded = run.loaded
    L, H = loaded.n_layers, loaded.n_heads
    counts = prune_counts(L * H, args.step, args.max_fraction)
    n_eval = args.eval_limit or args.limit
    segments, report = LMD.lm_segments(loaded, args.corpus, args.max_len, args.limit + n_eval, args.seed)
    imp_segments, eval_segments = segments[:args.limit], segments[args.limit:]
    if not eval_segments:
        raise UserError(f"{args.corpus} gives {len(segments)} segments of up to {args.max_len} tokens: none is left "
                        f"for perplexity after the {args.limit} importance segments (lower --limit)")
    device = next(loaded.model.parameters()).device
    pad = LMD.pad_id(loaded.tokenizer)
    imp_batches = LMD.lm_batches(imp_segments, args.batch_size, pad, device)
    eval_batches = LMD.lm_batches(eval_segments, args.batch_size, pad, device)
    state = State(run, bool(args.resume))
    run.log(f"{args.corpus}: importance on {len(imp_segments)} segments, perplexity on the next {len(eval_segments)} "
            f"(up to {args.max_len} tokens each); {len(counts)} steps pruning {', '.join(map(str, counts))} of "
            f"{L * H} query heads; {args.random_seeds} random orders"
            + (f"; resuming after step {len(state.removed)}" if state.resumed else ""))

    # the importance order, step by step (each step's importance with the heads pruned before it masked)
    live, done = np.ones((L, H), bool), 0
    for s, n in enumerate(counts, 1):
        if s <= len(state.removed):
            heads = state.removed[s - 1]
        else:
            sums = LMD.LMSums.load(state.sums_path) if state.sums_path.is_file() else None
            res = LMD.lm_importance(loaded, imp_batches, args.convention, not args.no_normalise,
                                    live.astype(np.int8), run.progress, sums,
                                    checkpoint=lambda sums: sums.save(state.sums_path))
            heads = least_important(res.importance.scores, live, n - done)
            state.removed.append(heads)
            state.importance.append({"rows": importance_rows(res.importance), "loss": res.importance.loss,
                                     "token_loss": res.token_loss})
            state.sums_path.unlink(missing_ok=True)
            state.save()
            run.log(f"step {s}: {n} heads pruned ({n / (L * H):.0%}), importance-segment perplexity before it "
                    f"{np.exp(res.token_loss):.3f}; removed " + ", ".join(f"{a + 1}-{b + 1}" for a, b in heads))
        for lay, h in heads:
            live[lay, h] = False
        done = n

    seeds = [args.seed + i for i in range(args.random_seeds)]
    orders = {("importance", ""): state.removed} | {("random", s): random_order(L, H, counts, s) for s in seeds}

    def measured(name, pruned):
        if name not in state.losses:
            state.losses[name] = LMD.mean_token_loss(loaded, eval_batches, pruned)
            state.save()
        return state.losses[name]

    base_loss, targets = measured("baseline", [])
    rows = []
    for (order, seed), steps in orders.items():
        rows.append(row(0, 0, L * H, order, seed, base_loss, base_loss))
        so_far = []
        for s, heads in enumerate(steps, 1):
            so_far = so_far + [tuple(h) for h in heads]
            loss, _ = measured(f"{order} {seed} step {s}".replace("  ", " "), so_far)
            rows.append(row(s, counts[s - 1], L * H, order, seed, loss, base_loss))
            run.log(f"{order}{f' (seed {seed})' if seed != '' else ''}, {counts[s - 1] / (L * H):.0%} pruned: "
                    f"perplexity {np.exp(loss):.3f}")
    run.write_csv(PRUNE_FILE, rows, LM_COLUMNS)
    order_rows = [dict(step=s, fraction_pruned=counts[s - 1] / (L * H), layer=lay + 1, head=h + 1)
                  for s, heads in enumerate(state.removed, 1) for lay, h in heads]
    run.write_csv(ORDER_FILE, order_rows, ORDER_COLUMNS)
    imp_rows = [{"step": s, **r} for s, step in enumerate(state.importance, 1) for r in step["rows"]]
    run.write_csv(IMPORTANCE_STEPS_FILE, imp_rows, ("step", "layer", "head", "importance", "importance_raw", "rank"))
    results = summarise(rows, args, counts, L * H, state, len(imp_segments), len(eval_segments), targets, report)
    if not args.no_figures:
        title = (f"{model_name(loaded.path)}: importance on {len(imp_segments)} {args.corpus} segments, perplexity on "
                 f"{len(eval_segments)} held-out ({targets:,} tokens), <= {args.max_len} tokens each")
        run.save_figure(plot_lm_prune(rows, title), FIGURE)
    for line in results["summary"]:
        run.log(line)
    run.finish(results)
    state.clear()
    return rows


def row(step, pruned, n_heads, order, seed, loss, base_loss) -> dict:
    return dict(step=step, fraction_pruned=pruned / n_heads, heads_pruned=pruned, order=order, seed=seed,
                loss=float(loss), perplexity=float(np.exp(loss)), perplexity_ratio=float(np.exp(loss - base_loss)))


def summarise(rows, args, counts, n_heads, state, n_imp, n_eval, targets, report) -> dict:
    def curve(order, seed=""):
        got = [r for r in rows if r["order"] == order and r["seed"] == seed]
        return [r["fraction_pruned"] for r in got], [r["perplexity"] for r in got]

    fr, imp_ppl = curve("importance")
    seeds = sorted({r["seed"] for r in rows if r["order"] == "random"})
    rnd = np.array([curve("random", s)[1] for s in seeds]) if seeds else None
    first = state.importance[0]["rows"] if state.importance else []
    top = [f"{r['layer']}-{r['head']}" for r in sorted((r for r in first if r["rank"]), key=lambda r: r["rank"])[:5]]
    results = {
        "task": LMD.LM, "corpus": args.corpus, "max_len": args.max_len, "importance_segments": n_imp,
        "eval_segments": n_eval, "eval_targets": targets, "segments": report.as_dict(), "heads": n_heads,
        "convention": args.convention, "normalised": not args.no_normalise, "step": args.step,
        "heads_pruned": counts, "fractions": fr, "baseline_perplexity": imp_ppl[0],
        "importance_perplexity": imp_ppl, "random_seeds": seeds,
        "random_perplexity": rnd.tolist() if seeds else None,
        "random_geomean_perplexity": np.exp(np.log(rnd).mean(0)).tolist() if seeds else None,
        "importance_segment_perplexity_per_step": [float(np.exp(s["token_loss"])) for s in state.importance],
        "top_heads_unpruned": top, "peak_rss_mb": LMD.peak_rss_mb(),
    }
    lines = [f"perplexity of the unpruned model on {n_eval} held-out segments ({targets:,} targets): {imp_ppl[0]:.3f}",
             "by importance: " + ", ".join(f"{f:.0%}: {p:.2f}" for f, p in zip(fr, imp_ppl))]
    if seeds:
        lines.append(f"random (geometric mean of {len(seeds)}): "
                     + ", ".join(f"{f:.0%}: {p:.2f}" for f, p in zip(fr, results["random_geomean_perplexity"])))
    lines.append(f"most important heads of the unpruned model: {', '.join(top)}")
    results["summary"] = lines
    return results
