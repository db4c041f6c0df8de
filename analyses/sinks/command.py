"""`bertscope sinks`: attention sinks on decoders and encoders, streamed over a corpus.

    bertscope sinks --model smollm2-135m-instruct-q4_1 --max-len 4096 --limit 8
    bertscope sinks --model gemma-3-270m-q4_k_m --max-len 32768 --limit 2 --bos both
    bertscope sinks                                  # the embedded all-MiniLM-L6-v2: [CLS] and [SEP]

One pass of the engine (`engine.fold`) over the segments of `bertscope run` (a decoder's: Wikipedia
articles packed up to --max-len; an encoder's: Clark et al.'s sentence pairs) into one `SinkStats`
(analyses/sinks/stats.py: the definitions and the papers they follow), with a forward hook on every
layer's output for Sun et al.'s massive activations. Nothing is kept per token or per map: memory
is the model's activations of one batch plus O(layers x heads x log2 positions) sums.

--bos: a decoder's segments as its tokenizer's template makes them ("auto": Gemma-3 puts a <bos>
first, SmolLM2 nothing), all with a BOS first ("with"), all without one ("without"), or each text
twice, with and without ("both": twice the forward passes; the tables get a row per variant and
the report puts them side by side). The BOS is the tokenizer's bos_token unless --bos-token names
another. An encoder's first token is [CLS]: --bos is for decoders only.

The sums are saved every few batches (sinks.npz); Ctrl-C saves the batches done, and
`bertscope sinks --resume DIR` continues with the recorded settings.
"""
from __future__ import annotations

import logging
import math
from dataclasses import fields
from itertools import chain
from typing import TYPE_CHECKING

from bertscope.analyses.sinks.outputs import (
    EPSILON,
    HEADS_FIGURE,
    INITIAL,
    LAYERS_FIGURE,
    LAYERS_FILE,
    MASSIVE_FIGURE,
    NAME,
    POSITIONS_FIGURE,
    POSITIONS_FILE,
    SINKS_FILE,
    STATS_FILE,
)
from bertscope.analyses.surface.command import check_lone_tokens
from bertscope.cli.args import add_corpus_stream_arguments, add_norms_argument, positive_int, resolve_norms
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

if TYPE_CHECKING:
    from bertscope.analyses.sinks import stats as S

# the statistics (`S`, bertscope.analyses.sinks.stats) import torch: they are imported where the run
# uses them, so that building this command's parser does not, and a mistyped option is refused at once
logger = logging.getLogger(__name__)

HELP = "attention sinks: the mass on the first token(s) per head, layer and query position, with and without a " \
       "BOS (Xiao et al. 2023; Gu et al. 2024; Sun et al. 2024)"
DESCRIPTION = (
    "Stream a corpus through the model and write, per head, Gu et al.'s alpha_1 (mean attention to the first "
    "token over the queries that see it) and the share of segments where it exceeds --epsilon, the mass on the "
    "first --initial tokens (StreamingLLM), the [SEP] and punctuation mass (encoders), and for sliding-window "
    "layers what the queries that cannot see the first token do instead (sinks.csv); per layer the means and "
    "Sun et al.'s massive activations (sinks_layers.csv); the first-token mass per log2 query-position bucket "
    "(sinks_positions.csv); Sink^epsilon per model in run.json; figures and a report section. One command for "
    "decoders and encoders ([CLS] is an encoder's first token).")
BOS_CHOICES = ("auto", "with", "without", "both")
CHECKPOINT_TOKENS = 65536  # padded tokens between two checkpoints of the sums (at most 20 batches)
# settings a resumed run takes from run.json
RESUMED = ("model", "revision", "corpus", "text_field", "limit", "max_len", "seed", "bos", "bos_token", "epsilon",
           "initial", "batch_size", "backend", "device", "dtype", "norms")


def add_arguments(p):
    add_corpus_stream_arguments(p, limit_note="; with --bos both each is run twice")
    p.add_argument("--bos", choices=BOS_CHOICES, default="auto",
                   help="a decoder's first token: as its tokenizer's template puts it (auto), a BOS before every "
                   "segment (with), none (without), or every segment both ways (both); encoders: auto only "
                   "(default: auto)")
    p.add_argument("--bos-token", metavar="TOKEN", default=None,
                   help="the token --bos with/both puts first (default: the tokenizer's bos_token, or the one its "
                   "template adds)")
    p.add_argument("--epsilon", type=float, default=EPSILON,
                   help=f"Gu et al.'s threshold on alpha_1 for a sink head (default: {EPSILON})")
    p.add_argument("--initial", type=positive_int, default=INITIAL, metavar="K",
                   help="the initial tokens whose mass initial_mass sums (StreamingLLM keeps 4) "
                   f"(default: {INITIAL})")
    add_norms_argument(p, "alpha_1_norm, first_mass_norm, sep_mass_norm, punct_mass_norm in sinks.csv")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")


def main(args) -> int:
    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, keys=RESUMED, command="sinks")
    if not 0 < args.epsilon < 1:
        raise UserError(f"--epsilon must lie between 0 and 1, not {args.epsilon}")
    if args.bos_token is not None and args.bos not in ("with", "both"):  # it would be recorded, and not used
        raise UserError(f"--bos-token {args.bos_token} is the BOS that --bos with or --bos both puts first; "
                        f"--bos {args.bos} puts {'none' if args.bos == 'without' else 'what the template adds'}: "
                        "add --bos with (or both), or leave --bos-token out")
    # recorded as run; a resumed run takes its recorded norms (runs from before them: none)
    args.norms = False if args.resume and args.norms is None else resolve_norms(args)
    with ModelRun(NAME, args, command="sinks", resumable=True, open=False) as run:
        return sink_run(run, args)


# --- segments ----------------------------------------------------------------------------------


def bos_plan(loaded, args, causal: bool) -> tuple[list[str], list[int], list[int], int]:
    """(variant names, the template's own prefix, the prefix of the "with" variant, tokens to keep
    free for it): how each text becomes the segments of the variants asked for."""
    from bertscope.text.segments import template_ids

    if not causal:
        if args.bos != "auto" or args.bos_token:
            raise UserError("--bos and --bos-token are for decoders: an encoder's first token is [CLS]")
        return ["cls"], [], [], 0
    tokenizer = loaded.tokenizer
    prefix, _ = template_ids(tokenizer)
    bos = prefix
    if args.bos_token is not None:
        vocab = tokenizer.get_vocab()
        if args.bos_token not in vocab:
            raise UserError(f"--bos-token {args.bos_token!r} is not a token of {loaded.origin}'s vocabulary")
        bos = [vocab[args.bos_token]]
    elif not bos and args.bos in ("with", "both"):
        if tokenizer.bos_token_id is None:
            raise UserError(f"--bos {args.bos}: {loaded.origin}'s tokenizer has no bos_token; "
                            "name one with --bos-token")
        bos = [tokenizer.bos_token_id]
    if args.bos == "auto":
        return ["with" if prefix else "without"], prefix, prefix, 0
    variants = {"with": ["with"], "without": ["without"], "both": ["with", "without"]}[args.bos]
    return variants, prefix, bos, max(0, len(bos) - len(prefix)) if "with" in variants else 0


def sink_segments(corpus, loaded, args, causal: bool, report, plan):
    """The segments of every variant, each text's variants one after the other, each with its
    `SINK_CLASSES` ids. A decoder's are `bertscope run`'s (SegmentOptions.causal), made `room`
    tokens shorter when a BOS the template lacks is put first."""
    from bertscope.analyses.sinks import stats as S  # see the note above `logger`
    from bertscope.text.segments import SegmentOptions, iter_segments

    variants, prefix, bos, room = plan
    if causal:
        options = SegmentOptions(max_len=args.max_len - room, limit=args.limit, seed=args.seed, causal=True)
    else:
        options = SegmentOptions(max_len=args.max_len, limit=args.limit, seed=args.seed)
    table = loaded.class_table
    for s in iter_segments(corpus, loaded.tokenizer, options, report):
        base = {f.name: getattr(s, f.name) for f in fields(s)}
        if not causal or variants == ["with" if prefix else "without"] and bos == prefix:  # the template's own
            yield S.SinkSegment(**{**base, "token_class": S.segment_classes(s.input_ids, table, args.initial)})
            continue
        ids, words = s.input_ids, s.word_ids
        if prefix and ids[: len(prefix)] == prefix:
            ids, words = ids[len(prefix):], words[len(prefix):]
        for v, name in enumerate(variants):
            first = bos if name == "with" else []
            full = first + ids
            yield S.SinkSegment(**{**base, "input_ids": full, "token_type_ids": [0] * len(full),
                                   "word_ids": [-1] * len(first) + words,
                                   "token_class": S.segment_classes(full, table, args.initial)}, variant=v)


def hidden_layers(loaded) -> list | None:
    """Every layer's module (whose output the massive-activation hook reads), as the architecture
    table places them; None where layers share one module (ALBERT), whose hook would fire for each."""
    return loaded.architecture.layer_list(loaded.model)


# --- the run ------------------------------------------------------------------------------------


def checked_sink_segments(loaded, args, causal: bool, plan):
    """(stream, report): `sink_segments` of the corpus args.corpus names, its first segment already
    drawn, so that a corpus with no usable segment is one UserError before anything is written; the
    SegmentReport fills as the stream is read."""
    from bertscope.text.corpus import open_corpus
    from bertscope.text.segments import SegmentReport

    corpus = open_corpus(args.corpus, args.text_field)
    len(corpus)  # a text file is indexed (so checked) before anything is written
    report = SegmentReport()
    stream = sink_segments(corpus, loaded, args, causal, report, plan)
    first = next(stream, None)
    if first is None:
        raise UserError(f"no usable segments in corpus {args.corpus!r}: {report.as_dict()}")
    return chain([first], stream), report


def sink_run(run: ModelRun, args) -> int:
    from bertscope.analyses.sinks import stats as S  # see the note above `logger`
    from bertscope.engine.loop import EngineOptions, fold
    from bertscope.text.corpus import open_corpus, planned_segments

    loaded = run.loaded
    config = loaded.model.config
    causal = loaded.architecture.is_causal(config)
    plan = bos_plan(loaded, args, causal)
    stream, report = checked_sink_segments(loaded, args, causal, plan)
    run.open(args.out)  # the input is good: only now is anything written
    run.announce()

    layouts = loaded.architecture.layouts(config)
    windows = [None if lay.window is None else lay.window[0] for lay in layouts]
    variants = plan[0]
    stats = S.SinkStats(loaded.n_layers, loaded.n_heads, windows, variants, S.n_buckets(loaded.max_len),
                        config.hidden_size, epsilon=args.epsilon, initial=args.initial, norms=args.norms)
    path = run.dir / STATS_FILE
    if args.resume and path.exists():
        try:
            saved = S.SinkStats.load(path)
        except (ValueError, KeyError) as e:
            raise UserError(f"cannot resume from {path}: {e}") from None
        if saved.meta() != stats.meta():
            raise UserError(f"cannot resume: {path} was made with other settings or another model")
        stats = saved
        run.log(f"resuming after batch {stats.batches_done}")
    layers = hidden_layers(loaded)
    if layers is None:
        run.log(f"{loaded.model_type}: no massive activations (its layers share one module: it cannot be "
                "hooked layer by layer)")
    probe = S.HiddenProbe()
    stats.probe = probe if layers is not None else None
    kinds = stats.layer_kinds()
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds)))
    run.log(f"{'decoder' if causal else 'encoder'}, layers: {counts}; "
            f"variants: {', '.join(variants)}; {stats.buckets} log2 position buckets up to {loaded.max_len}")
    every = max(1, min(20, CHECKPOINT_TOKENS // (args.batch_size * args.max_len)))
    planned = planned_segments(args.limit, open_corpus(args.corpus, args.text_field))  # never past the corpus
    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=run.progress,
                            checkpoint_every=every, total=planned * len(variants))
    model = loaded.model
    with probe.attached(model, layers or []):
        fold(loaded, stream, stats.spec, [stats], options, classes=S.SINK_CLASSES,
             checkpoint=lambda: stats.save(path), desc="sinks")
    stats.save(path)
    run.outputs.append(STATS_FILE)
    if (stats.n_rows == stats.n_segments).all():  # one query per segment: every segment one token long
        check_lone_tokens(report, args.corpus, every=True)
    write_outputs(run, stats, report, args)
    return 0


def write_outputs(run: ModelRun, stats: S.SinkStats, report, args):
    from bertscope.analyses.sinks import stats as S  # see the note above `logger`
    from bertscope.models.loading import model_name

    results = S.headline(stats)
    results["segments"] = report.as_dict()
    run.write_csv(SINKS_FILE, S.head_rows(stats), S.head_columns(stats))
    layer_rows = S.layer_rows(stats)
    columns = S.LAYER_COLUMNS if stats.hidden_means(0) else S.LAYER_COLUMNS[:10]
    run.write_csv(LAYERS_FILE, layer_rows, columns)
    run.write_csv(POSITIONS_FILE, S.position_rows(stats), S.POSITION_COLUMNS)
    for line in summary(stats, results):
        run.log(line)
    if not args.no_figures:
        from bertscope.analyses.sinks import plots

        title = model_name(run.loaded.path)
        run.save_figure(plots.plot_positions(stats, title), POSITIONS_FIGURE)
        run.save_figure(plots.plot_heads(stats, title), HEADS_FIGURE)
        run.save_figure(plots.plot_layers(stats, title), LAYERS_FIGURE)
        if stats.hidden_means(0):
            run.save_figure(plots.plot_massive(stats, title), MASSIVE_FIGURE)
    run.finish(results)


def summary(stats: S.SinkStats, results: dict) -> list[str]:
    """The terminal's lines: Sink^eps per variant, the first-token mass by layer, windowed vs global, massive."""
    eps = stats.epsilon
    lines = []
    for name, r in results["variants"].items():
        # a causal segment's first T queries see what a T-token input sees (Gu et al.'s setting); an encoder's do not
        gu = "" if name == "cls" else (f"{_pct(r['sink_metric_64'])} over the first {stats.gu_length} "
                                       f"({r['segments_64']} segments, Gu et al.'s T), ")
        lines.append(f"[{name}] {r['segments']} segments, {r['queries']} queries: Sink^{eps:g}_1 = "
                     f"{_pct(r['sink_metric'])} over each segment's queries, {gu}"
                     f"{_pct(r['pooled_metric'])} of heads by pooled alpha_1")
        lines.append(f"[{name}] first-token mass by layer: " + " ".join(f"{x:.2f}" for x in r["first_mass_by_layer"]))
        if "windowed" in r:
            w, g = r["windowed"], r.get("global")
            lines.append(f"[{name}] windowed layers {w['layers']}: alpha_1 {w['alpha_1']:.3f}, first-token mass "
                         f"{w['first_mass']:.3f}; {_pct(w['unseeing_share'])} of their queries cannot see the first "
                         f"token and put {w['unseeing_edge']:.4f} on the oldest key of their window, "
                         f"{w.get('unseeing_punct', math.nan):.3f} on '.' and ','"
                         + (f"; global layers {g['layers']}: alpha_1 {g['alpha_1']:.3f}, first-token mass "
                            f"{g['first_mass']:.3f}" if g else ""))
        if "massive" in r:
            m = r["massive"]
            lines.append(f"[{name}] massive activations: layer {m['layer']}, max |h| at the first token "
                         f"{m['first_max']:.1f} (dimension {m['first_dim']}) against median {m['median']:.3f} "
                         f"({m['ratio']:.0f}x); elsewhere at most {m['rest_max']:.1f}")
    return lines


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the sink statistics
    (a window adds a runtime offset only), and with --norms their norm-based twins (off by default on the triton
    backend)."""
    from bertscope.analyses.sinks import stats as S

    return {"sinks": S.spec_for([None]), "sinks --norms": S.spec_for([None], norms=True)}
