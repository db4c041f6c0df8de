"""`bertscope heads positions`: attention by query-key distance and by the key's place in the context.

    bertscope heads positions --model smollm2-135m-instruct-q4_1 --max-len 8192 --limit 2 --batch-size 1
    bertscope heads positions --model gemma-3-270m-q4_k_m --max-len 32768 --limit 1 --batch-size 1
    bertscope heads positions                       # the embedded all-MiniLM-L6-v2, Clark et al.'s pairs

One pass of the engine (`engine.fold`) over the segments of `bertscope run` (a decoder's: Wikipedia
articles packed up to --max-len, in its tokenizer's template; an encoder's: Clark et al.'s sentence
pairs) into one `PositionStats` (analyses/heads/positions/stats.py: the definitions). Per head: the
mass by distance |i - j| in log2 buckets and the mean distance, over every query; the mass per tenth
of the query's context (keys 0..i), over the late queries only (the last --late share of each
segment's tokens). Nothing is kept per token or per map: memory is the model's activations of one
batch plus O(layers x heads x 28) sums.

Positions are counted from each segment's first token: the engine pads a batch on the right, so a
key's place j / (i + 1) is its place in the real context (a left-padded batch is refused).

The sums are saved every few batches (positions.npz); Ctrl-C saves the batches done, and
`bertscope heads positions --resume DIR` continues with the recorded settings.
"""
from __future__ import annotations

import logging
from itertools import chain
from typing import TYPE_CHECKING

from bertscope.analyses.heads.positions.outputs import (
    DISTANCE_FIGURE,
    DISTANCE_FILE,
    LATE,
    LAYERS_FILE,
    NAME,
    PROFILE_FIGURE,
    PROFILE_FILE,
    STATS_CHECKPOINT,
    STATS_FILE,
)
from bertscope.analyses.surface.command import check_lone_tokens
from bertscope.cli.args import add_corpus_stream_arguments
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

if TYPE_CHECKING:
    from bertscope.analyses.heads.positions import stats as P

# the statistics (`P`, stats.py) import torch: they are imported where the run uses them, so that building
# this command's parser does not, and a mistyped option is refused at once
logger = logging.getLogger(__name__)

COMMAND = "heads positions"
HELP = "attention by query-key distance (log2 buckets, mean distance) and by the key's place in the context " \
       "(tenths, late queries): the positional profile behind 'lost in the middle' (Liu et al. 2023; Hsieh et " \
       "al. 2024)"
DESCRIPTION = (
    "Stream a corpus through the model and write, per head, the attention mass by query-key distance |i - j| in "
    "log2 buckets (0, 1, 2-3, 4-7, ..., 32768+) and the mean distance over every query (positions_distance.csv), "
    "the mass by the key's place in the query's context in tenths over the late queries, the last --late share of "
    "each segment (positions_profile.csv: is it U-shaped?), the means per layer (positions_layers.csv), figures "
    "and a report section. Sliding-window layers are labelled (Gemma-3: 'window 512'). Decoders and encoders.")
CHECKPOINT_TOKENS = 65536  # padded tokens between two checkpoints of the sums (at most 20 batches)
# settings a resumed run takes from run.json
RESUMED = ("model", "revision", "corpus", "text_field", "limit", "max_len", "seed", "late", "batch_size", "backend",
           "device", "dtype")


def add_arguments(p):
    add_corpus_stream_arguments(p)
    p.add_argument("--late", type=float, default=LATE, metavar="SHARE",
                   help="the late queries, whose mass per tenth of their context is reported: the last SHARE of each "
                   f"segment's tokens, in (0, 1]; 1 takes every query (default: {LATE})")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")


def main(args) -> int:
    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, keys=RESUMED, command=COMMAND)
    if not 0 < args.late <= 1:
        raise UserError(f"--late must lie in (0, 1] (the share of each segment's last tokens), not {args.late:g}")
    with ModelRun(NAME, args, command=COMMAND, distributed=True, resumable=True, open=False) as run:
        return position_run(run, args)


def position_segments(corpus, loaded, args, causal: bool, report):
    """`bertscope run`'s segments (a decoder's: SegmentOptions.causal), each with its `FIRST_CLASSES` ids."""
    from bertscope.analyses.heads.positions import stats as P  # see the note above `logger`
    from bertscope.text.segments import SegmentOptions, iter_segments

    options = SegmentOptions(max_len=args.max_len, limit=args.limit, seed=args.seed, causal=causal)
    for s in iter_segments(corpus, loaded.tokenizer, options, report):
        s.token_class = P.segment_classes(s.n_tokens)
        yield s


def check_backend(args, spec) -> None:
    """A one-line refusal, before anything is written, where the backend chosen does not compute the
    statistics (a Triton kernel without the distance and position statistics: they came to it later
    than to the CPU backends)."""
    from bertscope.kernels.backends import resolve_backend

    try:
        backend = resolve_backend(args.backend, args.device)
    except ValueError:
        return  # the engine says why, in one line
    if backend == "triton":
        from bertscope.kernels.triton_attention import check_computed

        try:
            check_computed(spec)
        except NotImplementedError as e:
            raise UserError(f"{e} (on a GPU: --backend chunked)") from None


def position_run(run: ModelRun, args) -> int:
    from bertscope.analyses.heads.positions import stats as P  # see the note above `logger`
    from bertscope.engine.loop import EngineOptions, fold
    from bertscope.text.corpus import open_corpus, planned_segments
    from bertscope.text.segments import SegmentReport

    loaded = run.loaded
    config = loaded.model.config
    causal = loaded.architecture.is_causal(config)
    check_backend(args, P.spec_for())
    corpus = open_corpus(args.corpus, args.text_field)
    len(corpus)  # a text file is indexed (so checked) before anything is written
    report = SegmentReport()
    stream = position_segments(corpus, loaded, args, causal, report)
    first = next(stream, None)
    if first is None:
        raise UserError(f"no usable segments in corpus {args.corpus!r}: {report.as_dict()}")
    stream = chain([first], stream)
    run.open(args.out)  # the input is good: only now is anything written
    run.announce()

    world = run.world
    windows = [None if lay.window is None else lay.window[0] for lay in loaded.architecture.layouts(config)]
    stats = P.PositionStats(loaded.n_layers, loaded.n_heads, windows, late=args.late)
    path = run.dir / STATS_CHECKPOINT.format(suffix=world.suffix())
    if args.resume and path.exists():
        try:
            saved = P.PositionStats.load(path)
        except (ValueError, KeyError) as e:
            raise UserError(f"cannot resume from {path}: {e}") from None
        if saved.meta() != stats.meta():
            raise UserError(f"cannot resume: {path} was made with other settings or another model")
        stats = saved
        run.log(f"resuming after batch {stats.batches_done}")
    kinds = stats.layer_kinds()
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    run.log(f"{'decoder' if causal else 'encoder'}, layers: {counts}; late queries: the last "
            f"{100 * args.late:g}% of each segment")
    every = max(1, min(20, CHECKPOINT_TOKENS // (args.batch_size * args.max_len)))
    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=run.progress,
                            checkpoint_every=every, total=planned_segments(args.limit, corpus))
    fold(loaded, stream, stats.spec, [stats], options, classes=P.FIRST_CLASSES, checkpoint=lambda: stats.save(path),
         shard=(world.rank, world.size), desc="positions")
    stats.save(path)
    stats = all_reduce(world, stats)
    run.shutdown()
    if not world.is_main:
        return 0
    stats.save(run.dir / STATS_FILE)  # the sums of every rank (under torchrun; else the file saved above)
    run.outputs.append(STATS_FILE)
    if stats.n_rows == stats.n_segments:  # one query per segment: every segment one token long
        check_lone_tokens(report, args.corpus, every=True)
    write_outputs(run, stats, report, args)
    return 0


def all_reduce(world, stats: P.PositionStats) -> P.PositionStats:
    """Every rank's sums added into each rank's copy (torchrun: each rank folded its shard of batches)."""
    if world.size == 1:
        return stats
    import numpy as np
    import torch
    import torch.distributed as dist

    from bertscope.analyses.heads.positions import stats as P  # see the note above `logger`

    for name in P.ARRAYS:
        t = torch.from_numpy(np.atleast_1d(getattr(stats, name)).astype(np.float64))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        setattr(stats, name, t.numpy().reshape(getattr(stats, name).shape).astype(P.ARRAYS[name][1]))
    return stats


def write_outputs(run: ModelRun, stats: P.PositionStats, report, args):
    from bertscope.analyses.heads.positions import stats as P  # see the note above `logger`
    from bertscope.models.loading import model_name

    results = P.headline(stats)
    results["segments_report"] = report.as_dict()
    results["max_len"] = args.max_len
    distance_rows, profile_rows = P.head_rows(stats)
    run.write_csv(DISTANCE_FILE, distance_rows, P.DISTANCE_COLUMNS)
    run.write_csv(PROFILE_FILE, profile_rows, P.PROFILE_COLUMNS)
    run.write_csv(LAYERS_FILE, P.layer_rows(stats), P.LAYER_COLUMNS)
    for line in summary(results):
        run.log(line)
    if not args.no_figures:
        from bertscope.analyses.heads.positions import plots

        corpus = "Wikipedia" if args.corpus == "wiki" else str(args.corpus)
        n = results["segments"]
        title = (f"{model_name(run.loaded.path)}, {n} {corpus} segment{'' if n == 1 else 's'} of up to "
                 f"{args.max_len} tokens")
        run.save_figure(plots.plot_distance(stats, title), DISTANCE_FIGURE)
        run.save_figure(plots.plot_profile(stats, title), PROFILE_FIGURE)
    run.finish(results)


def summary(results: dict) -> list[str]:
    """The terminal's lines: mean distance by layer; per layer kind its profile, reach, window, late profile."""
    lines = [f"{results['segments']} segments, {results['queries']} queries, {results['late_queries']} late; mean "
             "distance by layer: " + " ".join(f"{x:.0f}" for x in results["mean_distance_by_layer"])]
    for kind, k in results["kinds"].items():
        mass = ", ".join(f"{n} {x:.3f}" for n, x in k["distance_mass"].items() if x >= 0.0005)
        window = (f"; mass beyond the window {k['beyond_window']:.3g}" if "beyond_window" in k
                  else f"; beyond 512 {k['mass_beyond_512']:.3f}")
        lines.append(f"[{kind}] layers {k['layers']}: mean distance {k['mean_distance']:.1f}, 90% within "
                     f"{k['reach_90']}, 99% within {k['reach_99']}{window}; by distance: {mass}")
        s, s0 = k["late_shape"], k["late_shape_without_first_token"]
        lines.append(f"[{kind}] late queries by tenth of their context: " + " ".join(
            f"{x:.3f}" for x in k["late_profile"].values()) + f" (first {s['first']:.3f}, middle {s['middle']:.3f}, "
            f"last {s['last']:.3f}: {'U-shaped' if s['u_shaped'] else 'not U-shaped'}; without the first token "
            f"the first tenth is {s0['first']:.3f})")
    return lines


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the position
    statistics."""
    from bertscope.analyses.heads.positions import stats as P

    return {"positions": P.spec_for()}
