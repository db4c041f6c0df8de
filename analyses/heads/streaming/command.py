"""`bertscope heads streaming`: streaming heads against retrieval heads (DuoAttention, Xiao et al.
2024). Per head, how far its attention output moves when it may see only the first --sink tokens
and the last --recent ones (StreamingLLM's attention sink + recent window), in one pass over long
text; then the key/value groups of lowest error made streaming, k at a time, against k random
groups, measured by the next-token loss on held-out text and the needle test of `heads retrieval`.

    bertscope heads streaming --model smollm2-135m-instruct-q4_1
    bertscope heads streaming --model smollm2-135m-instruct-q4_1 --sink 4 --recent 64 --fractions 0.25,0.5,0.75

The error pass is the engine's (`StatsSpec.streaming`, checkpointed: resumed after its last saved
batch); each variant of the curve is saved as it finishes (streaming_variants/, one JSON each), so a
rerun with --resume DIR skips what is done. The split at --keep-fraction is written in DuoAttention's
pattern format (duo_attention/: full_attention_heads.tsv and config.json).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bertscope.analyses.heads.streaming.outputs import (
    CURVE_COLUMNS,
    CURVE_FIGURE,
    CURVE_FILE,
    ERROR_FIGURE,
    HEADS_COLUMNS,
    HEADS_FILE,
    NAME,
    PATTERN_DIR,
    STATS_CHECKPOINT,
    VARIANTS_DIR,
)
from bertscope.cli.args import (
    add_common_arguments,
    check_streaming_window,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

# numpy, torch and the model loader are imported where the run uses them: building this command's
# parser imports this module, and a mistyped option is then refused without waiting for torch
logger = logging.getLogger(__name__)

COMMAND = "heads streaming"
CHECKPOINT_EVERY = 2  # batches of the error pass between checkpoints
HELP = ("streaming heads (attention sink + recent window) against retrieval heads: a per-head streaming error, "
        "then loss and needle test with the lowest-error heads streaming (DuoAttention, Xiao et al. 2024)")
DESCRIPTION = (
    "Xiao et al. (2024): heads whose output the first --sink tokens and the last --recent ones give (streaming "
    "heads) against heads that need every token (retrieval heads). One pass over --limit segments of long text "
    "gives each head's relative error ||o - o_L|| / ||o||, o its attention output and o_L its output over the sink "
    "and the recent window only (computed beside the kernels' other statistics, no attention map), per query head "
    "and per key/value head group. Then, for each fraction of the groups (--fractions), the groups of lowest error "
    "are made streaming against --draws sets of random groups, and each variant is measured by the next-token "
    "loss on --eval-limit held-out segments and the needle test of `heads retrieval` (teacher forced). Needs a "
    "causal model (an encoder is refused; `bertscope data install-decoders` installs two). Writes "
    "streaming_heads.csv, streaming_curve.csv, duo_attention/ (DuoAttention's pattern format), figures and "
    "run.json['analyses']['streaming'].")


def fraction_list(text: str) -> str:
    """An argparse type: comma-separated fractions in (0, 1], kept as the text (run.json)."""
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions, got {text!r}") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"fractions must be in (0, 1], got {text!r}")
    return ",".join(str(v) for v in sorted(set(values)))


def fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction, got {text!r}") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return v


def add_arguments(p):
    p.add_argument("--sink", type=non_negative_int, default=4, metavar="S",
                   help="attention-sink tokens a streaming head keeps: the first S (default: 4, StreamingLLM's)")
    p.add_argument("--recent", type=positive_int, default=64, metavar="W",
                   help="recent tokens a streaming head keeps: the last W, the query's own included, so at least 1 "
                   "(default: 64); --sink + --recent must be shorter than --max-len, else no key is left out")
    p.add_argument("--corpus", default="wiki",
                   help="the long text of the error pass and the loss, and the needle's haystack: 'wiki' (the "
                   "bundled Wikipedia, default) or a corpus file")
    p.add_argument("--limit", type=positive_int, default=8, metavar="N",
                   help="segments of --max-len tokens for the error pass (default: 8)")
    p.add_argument("--eval-limit", type=positive_int, default=8, metavar="N",
                   help="the next N segments, sharing no article with them, for the loss of each variant (default: 8)")
    p.add_argument("--fractions", type=fraction_list, default="0.25,0.5,0.75,1.0", metavar="F,...",
                   help="fractions of the key/value groups made streaming (default: 0.25,0.5,0.75,1.0)")
    p.add_argument("--draws", type=non_negative_int, default=2, metavar="R",
                   help="sets of random groups beside the lowest-error ones, for each fraction (default: 2)")
    p.add_argument("--needles", metavar="FILE|NAME,...", default="san-francisco",
                   help="needles of the needle test, as `heads retrieval` takes them (default: san-francisco)")
    p.add_argument("--needle-length", type=positive_int, default=None, metavar="L",
                   help="haystack length in tokens (default: --max-len)")
    p.add_argument("--depths", default="25,75", metavar="D,...",
                   help="needle depths, percent of the haystack (default: 25,75)")
    p.add_argument("--prompt", choices=("auto", "plain", "chat"), default="auto",
                   help="how the question is put, as in `heads retrieval` (default: auto)")
    p.add_argument("--keep-fraction", type=fraction, default=None, metavar="F",
                   help="the fraction of key/value groups kept full in the DuoAttention pattern written (default: "
                   "the smallest whose curve point loses nothing: see --tolerance)")
    p.add_argument("--tolerance", type=non_negative_float, default=0.02, metavar="NATS",
                   help="a loss change up to this many nats (and no needle answer token lost) counts as no loss "
                   "(default: 0.02)")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")
    add_common_arguments(p, from_word=False, overrides={
        "max_len": {"default": 512, "help": "tokens per segment of long text (default: 512)"},
        "batch_size": {"default": 4, "help": "segments per forward pass (default: 4); results do not depend on it"},
        "seed": {"help": "seed of the segments' articles and of the random groups (default: 0)"},
    })


def main(args) -> int:
    from bertscope.analyses.heads.retrieval.command import refuse_encoder
    from bertscope.analyses.heads.retrieval.haystack import load_needles

    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, command=COMMAND)
    try:
        depths = [int(x) for x in str(args.depths).split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--depths takes comma-separated whole numbers, not {args.depths!r}") from None
    if not depths or any(not 0 <= d <= 100 for d in depths):
        raise UserError(f"--depths are percentages, 0 to 100, not {args.depths!r}")
    check_streaming_window(args.sink, args.recent, args.max_len)  # atlas's rule too (bertscope.cli.args)
    needles = load_needles(args.needles)
    refuse_encoder(args.model, getattr(args, "revision", None), command=COMMAND)
    with ModelRun(NAME, args, task="causal-lm", command=COMMAND, resumable=True) as run:
        streaming(run, args, needles, depths)
    return 0


def error_pass(run: ModelRun, args, segments):
    """HeadStats with the streaming sums over `segments` (checkpointed, resumed)."""
    from dataclasses import replace

    from bertscope.analyses.heads.streaming.stats import streaming_spec
    from bertscope.engine.accumulate import HeadStats
    from bertscope.engine.loop import EngineOptions, fold

    loaded = run.loaded
    base = replace(loaded, model=loaded.model.base_model)  # the statistics need the base model only
    spec = streaming_spec(loaded, args.sink, args.recent)
    acc = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    path = run.dir / STATS_CHECKPOINT
    if args.resume and path.exists():
        acc = HeadStats.load(path)
        if acc.spec.streaming != (args.sink, args.recent):
            raise UserError(f"{path} holds the error of another --sink / --recent")
        run.log(f"resuming the error pass after batch {acc.batches_done}")
    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=run.progress,
                            checkpoint_every=CHECKPOINT_EVERY)
    fold(base, segments, spec, [acc], options, checkpoint=lambda: acc.save(path), desc="streaming error")
    return acc


def kv_heads(loaded) -> int:
    """Key/value heads per layer, as the architecture table says the attention is handed them."""
    try:
        counts = {lay.n_key_value_heads or loaded.n_heads for lay in loaded.architecture.layouts(loaded.model.config)}
    except (AttributeError, UserError):
        counts = {getattr(loaded.model.config, "num_key_value_heads", None) or loaded.n_heads}
    if len(counts) != 1:
        raise UserError(f"the layers of {loaded.path.name} have different numbers of key/value heads "
                        f"({sorted(counts)}): the groups of `heads streaming` need one")
    return int(counts.pop())


def variant_name(order: str, k: int, draw: int) -> str:
    return f"{order}{k}-{draw}"


def measure(run: ModelRun, args, mask, batches, haystacks) -> dict:
    """One variant: the heads of `mask` (layers, H) streaming; the mean token loss and the needle test."""
    from bertscope.analyses.heads.lm_task import mean_token_loss
    from bertscope.analyses.heads.retrieval.stats import score_haystack

    loaded = run.loaded
    gates = loaded.gates
    try:
        gates.set_streaming(mask, args.sink, args.recent)
        loss, n = mean_token_loss(loaded, batches)  # resets the gates when done
        gates.set_streaming(mask, args.sink, args.recent)
        scores = [score_haystack(loaded, hay, backend=args.backend) for hay in haystacks]
    finally:
        gates.reset()
    return {"loss": loss, "targets": n, "copied": [bool(s.copied) for s in scores],
            "token_accuracy": [s.token_accuracy for s in scores], "answer_logprob": [s.answer_logprob for s in scores]}


@dataclass
class Plan:
    """What the run will do, fixed before its error pass (`plan`): the model's shape, the fitting and the
    held-out segments, the group counts k, the haystacks and the variants of the curve."""

    n_layers: int
    n_heads: int
    n_kv: int  # key/value heads per layer: the groups made streaming together
    fit: list  # the error pass's segments
    held: list  # the held-out segments each variant's loss is measured on
    ks: list[int]  # the numbers of groups made streaming
    prompt: str
    length: int  # the haystacks' length in tokens
    haystacks: list
    variants: list[tuple[str, int, int]]  # (order, k, draw)
    folder: Path  # one JSON per finished variant
    done: set  # the variants finished before (a resumed run)

    @property
    def n_groups(self) -> int:
        return self.n_layers * self.n_kv


def streaming(run: ModelRun, args, needles, depths):
    """The command once the model has loaded: the plan, the error pass, the variants, the outputs."""
    from bertscope.analyses.heads.streaming.stats import rank_groups

    plan = plan_run(run, args, needles, depths)
    t0 = time.perf_counter()
    acc = error_pass(run, args, plan.fit)
    error = acc.streaming_error()  # (layers, H)
    kv_error = acc.streaming_error(kv_heads=True)  # (layers, H_kv)
    ranked = rank_groups(kv_error)
    run.log(f"error pass: {time.perf_counter() - t0:.0f} s")
    results = streamed_variants(run, args, plan, ranked, needles, depths)
    rows = curve_rows(plan, results)
    run.write_csv(CURVE_FILE, rows, CURVE_COLUMNS)
    safe = no_loss_fractions(rows, args.tolerance, plan.n_groups)
    full = write_split(run, args, plan, ranked, error, kv_error, safe)
    results_out = summary(args, plan, ranked, kv_error, results[variant_name("none", 0, 0)], safe, full, t0)
    finding_and_figures(run, args, results_out, error, rows, full)
    run.finish(results_out)


def plan_run(run: ModelRun, args, needles, depths) -> Plan:
    """Check the model, split the segments, build the haystacks and list the variants (those saved
    before are done); log what the run will cost."""
    from bertscope.analyses.heads.lm_task import lm_segments
    from bertscope.analyses.heads.retrieval.haystack import HaystackBuilder, corpus_texts, resolve_prompt
    from bertscope.analyses.heads.streaming.stats import counts

    loaded = run.loaded
    if not loaded.architecture.causal:
        raise UserError(f"bertscope {COMMAND} needs a causal language model (a decoder) for the needle test")
    Ly, H, n_kv = loaded.n_layers, loaded.n_heads, kv_heads(loaded)
    n_groups = Ly * n_kv
    segments, _ = lm_segments(loaded, args.corpus, args.max_len, args.limit + args.eval_limit, args.seed)
    if len(segments) <= args.limit:
        raise UserError(f"corpus {args.corpus!r} gives {len(segments)} segments: none left to evaluate after "
                        f"--limit {args.limit}")
    fit, held = segments[:args.limit], segments[args.limit:]
    ks = counts([float(x) for x in args.fractions.split(",")], n_groups)
    ks = [k for k in ks if k > 0]
    prompt = resolve_prompt(args.prompt, loaded.tokenizer)
    builder = HaystackBuilder(loaded.tokenizer, corpus_texts(args.corpus), prompt)
    length = args.needle_length or args.max_len
    if length > loaded.max_len:
        raise UserError(f"--needle-length {length} is longer than the model allows ({loaded.max_len})")
    haystacks = [builder.build(n, length, d) for n in needles for d in depths]
    # every group streaming is one variant: random draws of all of them would repeat it
    variants = [("none", 0, 0)] + [(o, k, d) for k in ks for o, d in [("error", 0)] +
                                   [("random", r + 1) for r in range(args.draws if k < n_groups else 0)]]
    folder = run.dir / VARIANTS_DIR
    done = {v for v in variants if (folder / f"{variant_name(*v)}.json").is_file()}
    passes = (len(variants) - len(done)) * (len(held) + len(haystacks))
    run.log(f"planned: the error pass over {len(fit)} segments of up to {args.max_len} tokens (sink {args.sink}, "
            f"recent {args.recent}); then {len(variants)} variants ({len(done)} done before): none, and for k = "
            f"{', '.join(map(str, ks))} of {n_groups} key/value groups ({Ly} layers x {n_kv}) the lowest-error ones "
            f"and {args.draws} random draws, each over {len(held)} held-out segments and {len(haystacks)} haystacks "
            f"of {length} tokens: {passes} forward passes. To cut it: fewer --fractions, --draws, --eval-limit, "
            "--depths or a smaller --max-len")
    return Plan(Ly, H, n_kv, fit, held, ks, prompt, length, haystacks, variants, folder, done)


def streamed_variants(run: ModelRun, args, plan: Plan, ranked, needles, depths) -> dict:
    """Measure every variant (`measure`): a variant saved before with the same setup and groups is read
    back, each new one is saved as it finishes. Returns variant name -> record."""
    import json

    from tqdm.auto import tqdm

    from bertscope.analyses.heads.lm_task import lm_batches, pad_id
    from bertscope.analyses.heads.streaming.stats import head_mask, random_groups
    from bertscope.files import write_text

    loaded = run.loaded
    Ly, H, n_kv, variants = plan.n_layers, plan.n_heads, plan.n_kv, plan.variants
    batches = lm_batches(plan.held, args.batch_size, pad_id(loaded.tokenizer), next(loaded.model.parameters()).device)
    setup = {"model": loaded.record(), "sink": args.sink, "recent": args.recent, "corpus": args.corpus,
             "needles": [n.name for n in needles], "depths": depths, "length": plan.length, "prompt": plan.prompt}
    setup = json.loads(json.dumps(setup))  # as a saved variant holds it
    results = {}
    first = None
    with tqdm(total=len(variants), initial=len(plan.done), unit="variant", disable=not run.progress,
              desc="streaming variants") as bar:
        for order, k, draw in variants:
            name = variant_name(order, k, draw)
            path = plan.folder / f"{name}.json"
            groups = ranked[:k] if order == "error" else \
                random_groups(Ly, n_kv, k, args.draws, args.seed)[draw - 1] if order == "random" else []
            if path.is_file():
                saved = json.loads(path.read_text(encoding="utf-8"))
                if saved.get("setup") == setup and saved.get("groups") == [list(g) for g in groups]:
                    results[name] = saved
                    continue
            t1 = time.perf_counter()
            bar.set_postfix_str(f"{order} k={k}")
            record = {**measure(run, args, head_mask(groups, Ly, H, n_kv), batches, plan.haystacks),
                      "groups": [list(g) for g in groups], "setup": setup}
            plan.folder.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps(record))  # atomic: a killed run leaves the variant whole or absent
            results[name] = record
            if first is None:
                first = time.perf_counter() - t1
                left = sum(1 for v in variants if variant_name(*v) not in results)
                with tqdm.external_write_mode():
                    run.log(f"the first variant took {first:.0f} s: the rest, about {first * left:.0f} s")
            bar.update()
    return results


def curve_rows(plan: Plan, results: dict) -> list[dict]:
    """streaming_curve.csv's rows: each variant's loss (and its change from no head streaming) and needle test."""
    import numpy as np

    base = results[variant_name("none", 0, 0)]
    rows = []
    for order, k, draw in plan.variants:
        r = results[variant_name(order, k, draw)]
        rows.append({"order": order, "k": k, "fraction": k / plan.n_groups, "draw": draw,
                     "groups": " ".join(f"{lay + 1}-{g + 1}" for lay, g in r["groups"]), "loss": r["loss"],
                     "delta_loss": r["loss"] - base["loss"], "needle_accuracy": float(np.mean(r["copied"])),
                     "needle_token_accuracy": float(np.mean(r["token_accuracy"])),
                     "answer_logprob": float(np.mean(r["answer_logprob"]))})
    return rows


def no_loss_fractions(rows: list[dict], tolerance: float, n_groups: int) -> dict:
    """The largest fraction of the groups made streaming without a loss, by error and at random (every
    group streaming, one variant, counts for both orders)."""
    from bertscope.analyses.heads.streaming.stats import no_loss_fraction

    return {"error": no_loss_fraction(rows, tolerance, "error"),
            "random": no_loss_fraction([r for r in rows if r["k"] < n_groups or r["order"] != "error"]
                                       + [{**r, "order": "random"} for r in rows
                                          if r["order"] == "error" and r["k"] == n_groups], tolerance, "random")}


def write_split(run: ModelRun, args, plan: Plan, ranked, error, kv_error, safe: dict):
    """The split at --keep-fraction (default: the groups the error order cannot stream without a loss):
    DuoAttention's pattern files and streaming_heads.csv. Returns the (layers, H_kv) full-attention mask."""
    from bertscope.analyses.heads.streaming.stats import kv_full, write_pattern
    from bertscope.models.loading import model_name

    Ly, H, n_kv, n_groups = plan.n_layers, plan.n_heads, plan.n_kv, plan.n_groups
    keep = args.keep_fraction if args.keep_fraction is not None else 1 - safe["error"]
    n_stream = n_groups - int(round(keep * n_groups))
    full = kv_full(ranked, n_stream, Ly, n_kv)
    write_pattern(run.dir / PATTERN_DIR, full, args.sink, args.recent,
                  {"model_name": model_name(run.loaded.path), "made_by": f"bertscope {COMMAND}",
                   "full_attention_fraction": float(full.mean()), "corpus": args.corpus, "segments": len(plan.fit),
                   "max_length": args.max_len})
    G = H // n_kv
    rank_of = {g: i + 1 for i, g in enumerate(ranked)}
    run.write_csv(HEADS_FILE, [{"layer": lay + 1, "head": h + 1, "kv_head": h // G + 1, "error": float(error[lay, h]),
                                "kv_error": float(kv_error[lay, h // G]), "kv_rank": rank_of[(lay, h // G)],
                                "full": int(full[lay, h // G])} for lay in range(Ly) for h in range(H)],
                  HEADS_COLUMNS)
    return full


def summary(args, plan: Plan, ranked, kv_error, base: dict, safe: dict, full, t0: float) -> dict:
    """run.json's results: the setup, the loss and needle test with no head streaming, the no-loss
    fractions, the pattern's share of full groups and the groups of lowest and highest error."""
    import numpy as np

    group = lambda g: {"group": f"{g[0] + 1}-{g[1] + 1}", "error": float(kv_error[g])}  # noqa: E731
    return {"sink": args.sink, "recent": args.recent, "segments": len(plan.fit), "eval_segments": len(plan.held),
            "max_len": args.max_len, "groups": plan.n_groups, "kv_heads": plan.n_kv, "haystacks": len(plan.haystacks),
            "haystack_length": plan.length, "tolerance": args.tolerance, "loss": base["loss"],
            "needle_accuracy": float(np.mean(base["copied"])),
            "needle_token_accuracy": float(np.mean(base["token_accuracy"])), "no_loss_fraction": safe,
            "pattern_full_fraction": float(full.mean()),
            "mean_error": float(np.nanmean(kv_error)),
            "lowest_error": [group(g) for g in ranked[:5]],
            "highest_error": [group(g) for g in ranked[::-1][:5]],
            "seconds": round(time.perf_counter() - t0, 1)}


def finding_and_figures(run: ModelRun, args, results_out: dict, error, rows: list[dict], full):
    """The finding and the pattern's folder in the log; the figures (unless --no-figures)."""
    from bertscope.analyses.heads.streaming.section import curve_finding
    from bertscope.models.loading import model_name

    run.log(curve_finding(results_out))
    run.log(f"DuoAttention pattern ({full.mean():.0%} of the groups full) in {run.dir / PATTERN_DIR}")
    if not args.no_figures:
        from bertscope.analyses.heads.streaming import plots

        label = f"{model_name(run.loaded.path)}, sink {args.sink} + recent {args.recent}"
        run.save_figure(plots.plot_error(error, label), ERROR_FIGURE)
        run.save_figure(plots.plot_curve(rows, label), CURVE_FIGURE)
def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the streaming error
    at the default --sink / --recent."""
    from bertscope.analyses.heads.streaming.stats import streaming_spec
    from bertscope.analyses.registry import command_defaults

    d = command_defaults(sys.modules[__name__])
    return {"streaming": streaming_spec(model, d["sink"], d["recent"])}
