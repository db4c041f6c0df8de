"""`bertscope heads induction`: induction, duplicate-token and previous-token heads of a decoder on
repeated random tokens (Olsson et al. 2022, TransformerLens's definitions: see
`bertscope.analyses.heads.induction.stats`), and the causal check: the next-token loss on the
repeated half against the first half with the top-k induction heads zeroed (head gates, xi = 0),
beside k random heads, and with each head zeroed alone (--per-head).

One pass of the engine over the sequences gives the three scores (offset masses of the kernels,
no attention map) and the unablated losses (the base model's last hidden states through the LM
head in chunks); the gated variants then run several per forward, one gating per sequence row.
Every part checkpoints: `--resume DIR` continues after the last saved batch or variant.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from bertscope.analyses.heads.induction.outputs import (
    ABLATION_COLUMNS,
    ABLATION_FIGURE,
    ABLATION_FILE,
    INDUCTION_COLUMNS,
    INDUCTION_FILE,
    LOSS_FIGURE,
    LOSSES_CHECKPOINT,
    PER_HEAD_FIGURE,
    POSITION_FILE,
    SCORES_CHECKPOINT,
    SCORES_FIGURE,
    VARIANTS_CHECKPOINT,
)
from bertscope.analyses.heads.induction.section import ablation_finding, rho_text
from bertscope.cli.args import add_common_arguments, non_negative_int, positive_int
from bertscope.errors import UserError
from bertscope.files import write_npz
from bertscope.run.analysis_run import ModelRun

if TYPE_CHECKING:
    import numpy as np

    from bertscope.analyses.heads.induction.stats import InductionScores, RepeatedSequence, SequenceLosses

# numpy, the statistics (torch) and the model loader are imported where the run uses them: building this
# command's parser imports this module, and a mistyped option is then refused without waiting for torch
logger = logging.getLogger(__name__)

NAME = "induction"
COMMAND = "heads induction"
CHECKPOINT_EVERY = 4  # batches of the stream between checkpoints
HELP = ("induction, duplicate-token and previous-token heads of a decoder on repeated random tokens, and the loss "
        "with the top induction heads zeroed (Olsson et al. 2022)")
DESCRIPTION = (
    "Olsson et al. (2022), with TransformerLens's definitions: N sequences of a BOS and T random tokens repeated "
    "once; per head, the mean attention of the repeated half's rows i to i - T + 1 (induction), i - T (duplicate "
    "token) and i - 1 (previous token), streamed as offset masses (no attention map is kept). Then the causal check: "
    "the mean next-token loss on the repeated half minus on the first half (the in-context learning score) with the "
    "top-k induction heads zeroed, beside k random other heads (several seeded draws), and with each head zeroed "
    "alone (--per-head). Needs a decoder (an encoder is refused). Writes induction.csv, ablation.csv, "
    "loss_by_position.csv, figures and run.json['analyses']['induction'].")


def add_arguments(p):
    p.add_argument("--corpus", default="random",
                   help="the input: 'random', the only one (sequences of random tokens drawn with --seed, "
                   "repeated once); any other corpus is refused")
    p.add_argument("--seq-len", type=positive_int, default=64, metavar="T",
                   help="random tokens before the repeat (default: 64); a sequence is 2T + 1 tokens with its BOS")
    p.add_argument("--limit", "--n-sequences", type=positive_int, default=32, metavar="N",
                   help="number of random sequences (default: 32)")
    p.add_argument("--top-k", type=positive_int, nargs="+", default=[5], metavar="K",
                   help="how many of the highest-scoring induction heads to zero together, one or several "
                   "values (default: 5)")
    p.add_argument("--random-draws", type=positive_int, default=5, metavar="R",
                   help="sets of k random heads (drawn with --seed from the heads outside the top k) zeroed "
                   "beside the top k, for each k (default: 5)")
    p.add_argument("--per-head", type=non_negative_int, default=8, metavar="N",
                   help="zero each head alone on the first N sequences and correlate the loss change with the "
                   "induction score (one forward per few heads: layers x heads variants; 0 skips it; default: 8)")
    p.add_argument("--no-bos", action="store_true",
                   help="no BOS in front of the sequences (default: the tokenizer's BOS, else the config's; a "
                   "model with neither runs without one, as this option does)")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")
    add_common_arguments(p, from_word=False, overrides={
        "max_len": {"default": None, "help": "the longest input allowed (default: 2T + 1, what the sequences need; "
                    "a smaller one is refused)"},
        "batch_size": {"default": 8, "help": "sequence rows per forward pass, a gated variant's rows included "
                       "(default: 8); results do not depend on it"},
        "seed": {"help": "seed of the random tokens and of the random heads (default: 0)"},
    })


def main(args) -> int:
    from bertscope.analyses.heads.induction.stats import score_offsets  # see the note above `logger`

    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, command=COMMAND)
    if args.corpus != "random":
        raise UserError(f"heads induction reads random repeated tokens (--corpus random), not {args.corpus!r}")
    score_offsets(args.seq_len)  # T too short: refused before the model loads
    needed = 2 * args.seq_len + 1
    length_from = None
    if args.max_len is None:  # a model too short for the sequences is blamed on --seq-len, the option given
        args.max_len = needed
        length_from = f"--seq-len {args.seq_len}, a sequence of {needed} tokens (BOS and T tokens twice),"
    elif args.max_len < needed:
        raise UserError(f"--seq-len {args.seq_len} makes sequences of {needed} tokens (BOS and T tokens twice): "
                        f"more than --max-len {args.max_len}")
    with ModelRun(NAME, args, task="causal-lm", command=COMMAND, resumable=True, length_from=length_from) as run:
        induction(run, args)
    return 0


def bos_token(loaded, no_bos: bool) -> int | None:
    """The BOS id put in front of every sequence: the tokenizer's, else the config's, else None."""
    if no_bos:
        return None
    bos = getattr(loaded.tokenizer, "bos_token_id", None)
    return bos if bos is not None else getattr(loaded.model.config, "bos_token_id", None)


def sequences(loaded, args) -> tuple[np.ndarray, RepeatedSequence, dict]:
    """(ids (N, L), layout, what run.json says of the input)."""
    from bertscope.analyses.heads.induction.stats import (  # see the note above `logger`
        RepeatedSequence,
        random_sequences,
        score_offsets,
        token_pool,
    )

    bos = bos_token(loaded, args.no_bos)
    vocab = min(len(loaded.tokenizer), loaded.model.config.vocab_size)
    pool = token_pool(loaded.tokenizer, vocab)
    ids = random_sequences(args.limit, args.seq_len, pool, bos, args.seed)
    layout = RepeatedSequence(args.seq_len, bos is not None)
    about = {"seq_len": args.seq_len, "sequences": args.limit, "length": layout.length, "bos_id": bos,
             "bos_token": None if bos is None else loaded.tokenizer.convert_ids_to_tokens(bos),
             "token_pool": len(pool), "offsets": score_offsets(args.seq_len)}
    return ids, layout, about


def segments_of(ids: np.ndarray) -> list:
    from bertscope.text.segments import Segment  # the tokenizer stack: imported with the run

    L = ids.shape[1]
    return [Segment(input_ids=[int(t) for t in row], token_type_ids=[0] * L, word_ids=[-1] * L, words=[],
                    doc_id=f"random-{i}", document=i) for i, row in enumerate(ids)]


def stream_scores(run: ModelRun, args, ids: np.ndarray,
                  layout: RepeatedSequence) -> tuple[InductionScores, SequenceLosses]:
    """One engine pass: the three scores and the unablated losses (checkpointed, resumed)."""
    from bertscope.analyses.heads.induction.stats import InductionScores, SequenceLosses, induction_spec
    from bertscope.engine.loop import EngineOptions, fold  # torch: imported with the run

    loaded = run.loaded
    base = replace(loaded, model=loaded.model.base_model)  # the engine runs the base model; the LM head is ours
    spec = induction_spec(args.seq_len, loaded.classes.n_classes)
    scores = InductionScores(loaded.n_layers, loaded.n_heads, layout)
    losses = SequenceLosses(loaded, len(ids), layout)
    score_path, loss_path = run.dir / SCORES_CHECKPOINT, run.dir / LOSSES_CHECKPOINT
    if args.resume and score_path.exists() and loss_path.exists():
        scores = InductionScores.load(score_path)
        losses.load_into(loss_path)
        if scores.layout != layout or scores.batches_done != losses.batches_done:
            raise UserError(f"{score_path} and {loss_path} do not belong to this run's sequences")
        run.log(f"resuming the scores after batch {scores.batches_done}")

    def checkpoint():
        scores.save(score_path)
        losses.save(loss_path)

    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=run.progress,
                            checkpoint_every=CHECKPOINT_EVERY)
    fold(base, segments_of(ids), spec, [scores, losses], options, checkpoint=checkpoint, desc="induction scores")
    return scores, losses


def gated_losses(run: ModelRun, args, name: str, ids: np.ndarray, gates: list) -> np.ndarray:
    """(V, N, L - 1) losses of `ids` under each gating, saved after every forward (resumed)."""
    import numpy as np  # imported with the run: see the note above `logger`
    import torch
    from tqdm.auto import tqdm

    from bertscope.analyses.heads.induction.stats import variant_losses

    path = run.dir / VARIANTS_CHECKPOINT.format(name=name)
    out = np.full((len(gates), *ids.shape[:1], ids.shape[1] - 1), np.nan, dtype=np.float32)
    done = 0
    if args.resume and path.exists():
        with np.load(path) as f:
            if f["losses"].shape == out.shape:
                out[...], done = f["losses"], int(f["done"])
                run.log(f"{name}: resuming after {done} of {len(gates)} variants")
    if done == len(gates):
        return out
    with tqdm(total=len(gates), initial=done, unit="variant", disable=not run.progress, desc=name) as bar:
        def saved(n):
            write_npz(path, losses=out, done=done + n)
            bar.update(done + n - bar.n)

        variant_losses(run.loaded, torch.as_tensor(ids), gates[done:], args.batch_size, out=out[done:],
                       on_forward=saved)
    return out


def induction(run: ModelRun, args):
    """The command once the model has loaded."""
    from bertscope.analyses.heads.induction import plots  # see the note above `logger`
    from bertscope.analyses.heads.induction.stats import half_losses, random_head_sets, rank_heads, zero_gates
    from bertscope.models.loading import model_name

    loaded = run.loaded
    L, H = loaded.n_layers, loaded.n_heads
    ids, layout, about = sequences(loaded, args)
    if about["bos_id"] is None:
        run.log("no BOS: the sequences start with their first random token" + (
            "" if args.no_bos else " (the model's tokenizer and config name none)"))
    ks = sorted(set(args.top_k))
    if ks[-1] > L * H // 2:
        raise UserError(f"--top-k {ks[-1]}: k random heads are drawn outside the top k, so k can be at most half of "
                        f"the model's {L * H} heads ({L * H // 2})")
    scores_acc, losses_acc = stream_scores(run, args, ids, layout)
    scores = scores_acc.scores()
    base = losses_acc.losses  # (N, L - 1)
    base_first, base_rep = (x.mean() for x in half_losses(base, layout))
    ranked = rank_heads(scores["induction"])

    # the top k and k random heads zeroed, for each k
    variants = []  # (ablation, k, draw, heads)
    for k in ks:
        variants.append(("top", k, 0, sorted(ranked[:k])))
        variants += [("random", k, r + 1, hs) for r, hs in
                     enumerate(random_head_sets(L, H, k, ranked[:k], args.random_draws, args.seed + k))]
    var_losses = gated_losses(run, args, "ablation", ids, [zero_gates(L, H, v[3]) for v in variants])
    rows = [ablation_row("none", 0, 0, [], base_first, base_rep, base_first, base_rep)]
    for (kind, k, draw, heads), losses in zip(variants, var_losses):
        first, rep = (x.mean() for x in half_losses(losses, layout))
        rows.append(ablation_row(kind, k, draw, heads, first, rep, base_first, base_rep))
    run.write_csv(ABLATION_FILE, rows, ABLATION_COLUMNS)
    positions = position_rows(base, var_losses, variants, ks, layout)
    run.write_csv(POSITION_FILE, positions, tuple(positions[0]))

    # each head zeroed alone
    per_head = None
    if args.per_head:
        n = min(args.per_head, len(ids))
        heads = [(lay, h) for lay in range(L) for h in range(H)]
        single = gated_losses(run, args, "per_head", ids[:n], [zero_gates(L, H, [hd]) for hd in heads])
        first, rep = half_losses(single, layout)  # (L H, n)
        b_first, b_rep = half_losses(base[:n], layout)  # (n,)
        per_head = {"sequences": n,
                    "delta_loss_repeated": (rep - b_rep).mean(1).reshape(L, H),
                    "delta_loss_first": (first - b_first).mean(1).reshape(L, H)}
        per_head["delta_icl"] = per_head["delta_loss_repeated"] - per_head["delta_loss_first"]

    run.write_csv(INDUCTION_FILE, head_rows(scores, per_head), INDUCTION_COLUMNS)
    results = summarise(about, scores, rows, ks, per_head, base_first, base_rep, args)
    log_summary(run, results)
    if not args.no_figures:
        label = f"{model_name(loaded.path)}, {args.limit} sequences of 2 x {args.seq_len} random tokens"
        run.save_figure(plots.plot_scores(scores, label), SCORES_FIGURE)
        run.save_figure(plots.plot_loss_by_position(positions, ks, layout, label), LOSS_FIGURE)
        run.save_figure(plots.plot_ablation(rows, label), ABLATION_FIGURE)
        if per_head is not None:
            run.save_figure(plots.plot_per_head(scores["induction"], per_head["delta_loss_repeated"],
                                                results["per_head"]["induction_vs_delta_repeated"],
                                                f"{label}; zeroed on the first {per_head['sequences']}"),
                            PER_HEAD_FIGURE)
    run.finish(results)


def head_str(heads) -> str:
    """'3-1 5-2': (layer, head) pairs from 1."""
    return " ".join(f"{lay + 1}-{h + 1}" for lay, h in heads)


def ablation_row(kind, k, draw, heads, first, rep, base_first, base_rep) -> dict:
    return {"ablation": kind, "k": k, "draw": draw, "heads": head_str(heads), "loss_first": float(first),
            "loss_repeated": float(rep), "icl_score": float(rep - first), "delta_loss_first": float(first - base_first),
            "delta_loss_repeated": float(rep - base_rep),
            "delta_icl": float((rep - first) - (base_rep - base_first))}


def position_rows(base, var_losses, variants, ks, layout: RepeatedSequence) -> list[dict]:
    """Mean loss per target position: as trained, top k zeroed, k random zeroed (mean of the draws)."""
    import numpy as np  # see the note above `logger`

    first, repeated = layout.target_halves()
    half = np.full(base.shape[1], "", dtype=object)
    half[first], half[repeated] = "first", "repeated"
    cols = {"position": np.arange(1, base.shape[1] + 1), "half": half, "none": base.mean(0)}
    for k in ks:
        top = [i for i, v in enumerate(variants) if v[:2] == ("top", k)]
        rnd = [i for i, v in enumerate(variants) if v[:2] == ("random", k)]
        cols[f"top_{k}"] = var_losses[top].mean((0, 1))
        cols[f"random_{k}"] = var_losses[rnd].mean((0, 1))
    return [{c: (v[i] if c == "half" else int(v[i]) if c == "position" else float(v[i])) for c, v in cols.items()}
            for i in range(base.shape[1])]


def head_rows(scores: dict, per_head: dict | None) -> list[dict]:
    import numpy as np  # see the note above `logger`

    from bertscope.analyses.heads.induction.stats import SCORES, rank_heads

    L, H = scores["induction"].shape
    ranks = np.empty(L * H, dtype=int)
    ranks[[lay * H + h for lay, h in rank_heads(scores["induction"])]] = np.arange(1, L * H + 1)
    rows = []
    for lay in range(L):
        for h in range(H):
            row = {"layer": lay + 1, "head": h + 1, **{s: float(scores[s][lay, h]) for s in SCORES},
                   "rank": int(ranks[lay * H + h])}
            for c in ("delta_loss_repeated", "delta_loss_first", "delta_icl"):
                row[c] = "" if per_head is None else float(per_head[c][lay, h])
            rows.append(row)
    return rows


def _spread(values) -> dict:
    import numpy as np  # see the note above `logger`

    v = np.asarray(values, float)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max())}


def summarise(about, scores, rows, ks, per_head, base_first, base_rep, args) -> dict:
    import numpy as np  # see the note above `logger`

    from bertscope.analyses.heads.induction.stats import SCORES, rank_heads, spearman

    def top(score, n=10, every=False):
        return [{"head": f"{lay + 1}-{h + 1}", **{s: float(scores[s][lay, h]) for s in (SCORES if every else (score,))}}
                for lay, h in rank_heads(scores[score])[:n]]

    results = {**about, "top_k": ks, "random_draws": args.random_draws, "top_induction": top("induction", every=True),
               "top_duplicate": top("duplicate", 5), "top_previous": top("previous", 5),
               "max": {s: float(scores[s].max()) for s in SCORES},
               "heads_above_0.5": {s: int((scores[s] > 0.5).sum()) for s in SCORES},
               "loss": {"first": float(base_first), "repeated": float(base_rep),
                        "icl_score": float(base_rep - base_first)},
               "ablation": {}}
    for k in ks:
        t = next(r for r in rows if r["ablation"] == "top" and r["k"] == k)
        rnd = [r for r in rows if r["ablation"] == "random" and r["k"] == k]
        results["ablation"][str(k)] = {
            "top": {c: t[c] for c in ("heads", "loss_first", "loss_repeated", "icl_score", "delta_loss_repeated",
                                      "delta_icl")},
            "random": {c: _spread([r[c] for r in rnd]) for c in ("loss_repeated", "icl_score", "delta_loss_repeated",
                                                                  "delta_icl")},
            "random_heads": [r["heads"] for r in rnd]}
    if per_head is not None:
        delta = per_head["delta_loss_repeated"]
        worst = rank_heads(delta)[:5]
        results["per_head"] = {
            "sequences": per_head["sequences"],
            "induction_vs_delta_repeated": spearman(scores["induction"], delta),
            "induction_vs_delta_icl": spearman(scores["induction"], per_head["delta_icl"]),
            "duplicate_vs_delta_repeated": spearman(scores["duplicate"], delta),
            "previous_vs_delta_repeated": spearman(scores["previous"], delta),
            "largest_delta_repeated": [{"head": f"{lay + 1}-{h + 1}", "delta_loss_repeated": float(delta[lay, h]),
                                        **{s: float(scores[s][lay, h]) for s in SCORES}} for lay, h in worst],
            "median_delta_repeated": float(np.median(delta)),
            # the top induction heads zeroed alone: their loss change and its rank among all heads (1 = largest)
            "top_induction_alone": [{"head": f"{lay + 1}-{h + 1}", "induction": float(scores["induction"][lay, h]),
                                     "delta_loss_repeated": float(delta[lay, h]),
                                     "delta_rank": 1 + rank_heads(delta).index((lay, h))}
                                    for lay, h in rank_heads(scores["induction"])[:5]]}
    return results


def log_summary(run, r: dict):
    fmt = lambda t, s: ", ".join(f"{x['head']} {x[s]:.3f}" for x in t)  # noqa: E731
    run.log(f"{r['sequences']} sequences of {r['length']} tokens (BOS {r['bos_token']!r}, T = {r['seq_len']})")
    run.log(f"top induction heads (mean attention to i - T + 1): {fmt(r['top_induction'][:5], 'induction')}")
    run.log(f"top duplicate-token heads (i - T): {fmt(r['top_duplicate'], 'duplicate')}")
    run.log(f"top previous-token heads (i - 1): {fmt(r['top_previous'], 'previous')}")
    loss = r["loss"]
    run.log(f"loss first half {loss['first']:.3f}, repeated half {loss['repeated']:.3f}: ICL score "
            f"{loss['icl_score']:+.3f} nats")
    for k, a in r["ablation"].items():
        run.log(ablation_finding(k, a))
    if "per_head" in r:
        c = r["per_head"]["induction_vs_delta_repeated"]
        rho = rho_text(c)
        run.log(f"one head zeroed at a time ({r['per_head']['sequences']} sequences): Spearman rho of the induction "
                f"score with the repeated-half loss change {rho} over {c['heads']} heads; largest changes: "
                + ", ".join(f"{x['head']} {x['delta_loss_repeated']:+.3f}"
                            for x in r["per_head"]["largest_delta_repeated"]))
        run.log("the top induction heads zeroed alone: " + ", ".join(
            f"{x['head']} {x['delta_loss_repeated']:+.3f} (rank {x['delta_rank']})"
            for x in r["per_head"]["top_induction_alone"])
            + f"; median over all heads {r['per_head']['median_delta_repeated']:+.3f}")


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the induction
    offsets at the default --seq-len."""
    from bertscope.analyses.heads.induction.stats import induction_spec
    from bertscope.analyses.registry import command_defaults

    return {"induction": induction_spec(command_defaults(sys.modules[__name__])["seq_len"], model.classes.n_classes)}
