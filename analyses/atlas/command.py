"""`bertscope atlas`: one card per model that types every head, and `bertscope atlas compare RUN...`.

    bertscope atlas                                              # the embedded all-MiniLM-L6-v2
    bertscope atlas --model smollm2-135m-instruct-q4_1
    bertscope atlas --model gemma-3-270m-q4_k_m --out runs/gemma-atlas
    bertscope atlas compare runs/minilm runs/smollm2 runs/gemma --out runs/atlas-compare

Four stages, each saved as it goes, so that `bertscope atlas --resume DIR` redoes none of them:
1. one streamed pass over the corpus (`stats.StreamStats`: `bertscope run`'s, `sinks`' and `heads
   positions`' accumulators fed by one engine pass), checkpointed every few batches, sharded
   under torchrun as those commands are;
2. induction on repeated random tokens (analyses/heads/induction's `InductionScores`), sharded;
3. decoders: a small retrieval grid (analyses/heads/retrieval's haystacks and scores, one JSON per
   haystack in retrieval_cells/, dealt out to the ranks);
4. decoders: LM importance (analyses/heads/lm_task's `lm_importance`, rank 0, saved per batch).
Then the per-head table (atlas_heads.csv and .parquet), the per-layer table, the figures, the head
card (atlas_card.md and atlas_card.html) and run.json's entry. The plan and an estimate of its time
are logged before the first stage.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from bertscope.analyses.atlas.outputs import (
    CARD_HTML,
    CARD_MD,
    GRID_FIGURE,
    HEADS_FILE,
    IMPORTANCE_STATE,
    INDUCTION_FILE,
    LAYERS_FIGURE,
    LAYERS_FILE,
    NAME,
    PARQUET_FILE,
    STATE_FILE,
    STREAM_FILES,
)
from bertscope.cli.args import (
    add_common_arguments,
    add_norms_argument,
    check_streaming_window,
    non_negative_int,
    positive_int,
    resolve_norms,
)
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

# torch, numpy and the statistics are imported where the run uses them: building this command's
# parser imports this module, and a mistyped option is then refused at once
logger = logging.getLogger(__name__)

COMMAND = "atlas"
HELP = ("one card per model typing every head (sink, no-op sink, previous-token, duplicate, induction, retrieval, "
        "streaming-safe, broad, local) from one streamed pass and short probes; `atlas compare RUN...` sets "
        "several models' heads side by side")
DESCRIPTION = (
    "One streamed pass over a corpus (default: the bundled Wikipedia) with every per-head statistic (entropy, "
    "previous/self/next mass, first-token mass and its norm-based twin, the distance profile, and where this "
    "bertscope computes them the duplicate and prefix-match masses and the streaming error), then short probes: "
    "induction on repeated random tokens, and for decoders a small needle-in-a-haystack grid (retrieval heads) and "
    "LM importance. Writes atlas_heads.csv and atlas_heads.parquet (one row per head; docs/atlas.md gives every "
    "column's unit), atlas_layers.csv, a head card (atlas_card.md, atlas_card.html: the model's shape, a grid of "
    "every head coloured by type, per-layer profiles, the top heads of each type) and run.json['analyses']['atlas']."
    " Types come from the fixed thresholds of analyses/atlas/head_types.py; a head may carry several. Resumable "
    "(--resume DIR), sharded under torchrun. `bertscope atlas compare RUN RUN ...`: the heads of several runs in one"
    " table and one figure (standardised features, PCA).")
CHECKPOINT_TOKENS = 65536  # padded tokens between two checkpoints of the streamed sums (at most 20 batches)
# the defaults that depend on the model: (encoder, decoder)
DEFAULT_LIMIT = (100, 32)
DEFAULT_MAX_LEN = (128, 1024)
DEFAULT_NEEDLES = "san-francisco"
DEFAULT_DEPTHS = "10,30,50,70,90"  # five haystacks: a retrieval type needs 3 answered (head_types.MIN_ANSWERED)
RETRIEVAL_ANSWER = "greedy"  # `heads retrieval --answer greedy`: the model's own answer, Wu et al.'s criterion
MIN_INDUCTION_LEN = 3  # analyses/heads/induction's MIN_SEQ_LEN (said here without importing torch)
MIN_IMPORTANCE_LEN = 8  # bertscope.text.segments.MIN_MAX_LEN: the shortest segment the importance probe can make
IMPORTANCE_LEN = 256  # --importance-len's default, at most the model's limit
STREAMING_RECENT = 256  # --streaming-recent's default, at most a quarter of --max-len (`resolve_defaults`)
RETRIEVAL_LENGTH = 1024  # the haystack length (at most the model's limit)
SETTINGS_KEYS = ("model", "revision", "corpus", "text_field", "limit", "max_len", "seed", "batch_size", "backend",
                 "device", "dtype", "induction_sequences", "induction_len", "needles", "retrieval_lengths",
                 "depths", "no_retrieval", "importance_segments", "importance_len", "no_importance",
                 "streaming_sink", "streaming_recent", "norms")


def add_arguments(p):
    from bertscope.analyses.heads.retrieval.command import int_list  # no torch: the retrieval command's parser

    add_common_arguments(p, from_word=False, overrides={
        "batch_size": {"default": 8, "help": "segments per forward pass of the streamed pass (default: 8); results "
                       "do not depend on it"},
        "max_len": {"default": None, "help": f"tokens per segment of the streamed pass (default: {DEFAULT_MAX_LEN[0]} "
                    f"for an encoder, {DEFAULT_MAX_LEN[1]} for a decoder, at most the model's limit)"},
        "seed": {"help": "seed of the segment sample, the random tokens and the importance segments (default: 0)"}})
    p.add_argument("--corpus", default="wiki",
                   help="the streamed pass's corpus: 'wiki' (Wikipedia lead sections), a text file, JSON Lines, "
                   "Parquet or a datasets directory, as `bertscope run` reads it; also the retrieval haystacks' and "
                   "the importance segments' text (default: wiki)")
    p.add_argument("--text-field", metavar="NAME", default=None,
                   help="the text column of a JSON Lines, Parquet or datasets corpus (default: 'text')")
    p.add_argument("--limit", type=atlas_limit, default=None, metavar="N",
                   help=f"segments of the streamed pass, sampled with --seed; 'all' for every one (default: "
                   f"{DEFAULT_LIMIT[0]} for an encoder, {DEFAULT_LIMIT[1]} for a decoder)")
    p.add_argument("--induction-sequences", type=positive_int, default=8, metavar="N",
                   help="random sequences of the induction probe (default: 8)")
    p.add_argument("--induction-len", type=positive_int, default=64, metavar="T",
                   help="random tokens before the repeat (default: 64: sequences of 2T + 1 tokens)")
    p.add_argument("--needles", metavar="NAME,...", default=DEFAULT_NEEDLES,
                   help="the retrieval probe's needles (decoders): names of `heads retrieval`'s needles or a file "
                   f"(default: {DEFAULT_NEEDLES})")
    p.add_argument("--retrieval-lengths", type=int_list(2, None, "length"), default=None, metavar="L,...",
                   help=f"haystack lengths in tokens (default: {RETRIEVAL_LENGTH}, at most the model's limit)")
    p.add_argument("--depths", type=int_list(0, 100, "depth"), default=DEFAULT_DEPTHS, metavar="D,...",
                   help=f"needle depths, percent (default: {DEFAULT_DEPTHS})")
    p.add_argument("--no-retrieval", action="store_true", help="skip the retrieval probe")
    p.add_argument("--importance-segments", type=positive_int, default=4, metavar="N",
                   help="corpus segments of the LM importance probe (decoders; default: 4)")
    p.add_argument("--importance-len", type=positive_int, default=None, metavar="L",
                   help=f"tokens per importance segment (default: {IMPORTANCE_LEN}, at most the model's limit; a "
                   "longer one given is refused)")
    p.add_argument("--no-importance", action="store_true", help="skip the LM importance probe")
    p.add_argument("--streaming-sink", type=non_negative_int, default=4, metavar="S",
                   help="the streaming error's sink: the first S keys kept (default: 4, StreamingLLM's; 0: a plain "
                   "sliding window)")
    p.add_argument("--streaming-recent", type=positive_int, default=None, metavar="W",
                   help=f"the streaming error's recent window: the last W keys kept, the query's own included "
                   f"(default: {STREAMING_RECENT}, at most a quarter of --max-len); S + W must be shorter than "
                   "--max-len, else every head's error is 0")
    add_norms_argument(p, "alpha_1_norm, first_mass_norm, sep_mass_norm and sink_mass_norm in atlas_heads.csv, "
                       "and the no-op-sink type")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings; finished stages are not run "
                   "again")
    sub = p.add_subparsers(dest="atlas_command", metavar="[compare RUN ...]", required=False)
    from bertscope.analyses.atlas import compare  # no torch either

    c = sub.add_parser("compare", help=compare.HELP, description=compare.DESCRIPTION)
    compare.add_arguments(c)


def main(args) -> int:
    if getattr(args, "atlas_command", None) == "compare":
        from bertscope.analyses.atlas import compare

        return compare.main(args)
    restart = set()
    if args.resume:
        args, restart = resumed_args(args)
    if args.induction_len < MIN_INDUCTION_LEN:
        raise UserError(f"--induction-len must be at least {MIN_INDUCTION_LEN} (at T = 2 the induction key is the "
                        f"previous token), not {args.induction_len}")
    if args.importance_len is not None and args.importance_len < MIN_IMPORTANCE_LEN:
        raise UserError(f"--importance-len must be at least {MIN_IMPORTANCE_LEN} tokens, not {args.importance_len}")
    # recorded as run (the default: on, off on the triton backend unless --norms); a resumed run takes its recorded
    # norms (runs from before them: none)
    args.norms = False if args.resume and args.norms is None else resolve_norms(args)
    causal = model_is_causal(args.model, getattr(args, "revision", None))
    from bertscope.analyses.heads.retrieval.haystack import load_needles

    needles = load_needles(args.needles) if causal and not args.no_retrieval else []  # refused before the model loads
    default_len = resolve_defaults(args, causal)
    with ModelRun(NAME, args, task="causal-lm" if causal else None, command=COMMAND, distributed=True,
                  resumable=True, open=False) as run:
        if default_len is not None:
            args.max_len = min(default_len, run.loaded.max_len)
            run.record["settings"]["max_len"] = args.max_len
        if args.importance_len is None:
            args.importance_len = min(IMPORTANCE_LEN, run.loaded.max_len)
            run.record["settings"]["importance_len"] = args.importance_len
        if args.streaming_recent is None:
            args.streaming_recent = default_recent(args.max_len)
            run.record["settings"]["streaming_recent"] = args.streaming_recent
        return atlas_run(run, args, needles, restart)


# Which stages each setting of the run feeds: a `--resume` may give another value to a setting whose
# stages have not finished (that stage then starts again); the settings of a finished stage, and those
# no stage owns alone (the model, --device, --dtype, --batch-size, --backend), stay the run's.
STAGES_OF = {
    "corpus": ("stream", "retrieval", "importance"), "text_field": ("stream", "retrieval", "importance"),
    "limit": ("stream",), "max_len": ("stream",), "streaming_sink": ("stream",), "streaming_recent": ("stream",),
    "norms": ("stream",),
    "seed": ("stream", "induction", "importance"),
    "induction_sequences": ("induction",), "induction_len": ("induction",),
    "needles": ("retrieval",), "retrieval_lengths": ("retrieval",), "depths": ("retrieval",),
    "no_retrieval": ("retrieval",),
    "importance_segments": ("importance",), "importance_len": ("importance",), "no_importance": ("importance",),
}


def resumed_args(args) -> tuple[Namespace, set[str]]:
    """`--resume DIR`: the run's recorded settings (`ModelRun.resumed_args`), except the options this
    command line gives another value whose stages (`STAGES_OF`) have not finished: those are taken,
    and the stages they feed start afresh (returned). Another value for a finished stage's option is
    refused in one line, as any other changed setting."""
    from bertscope.analyses.atlas.stats import read_state
    from bertscope.run.rundir import recorded_run, settings_parser

    recorded = recorded_run(args.resume, NAME, COMMAND)["settings"]
    state = read_state(Path(args.resume) / STATE_FILE)
    defaults = settings_parser(add_arguments)
    free = {k for k, stages in STAGES_OF.items()
            if k in vars(args) and getattr(args, k) != defaults.get_default(k) and k in recorded
            and getattr(args, k) != recorded[k] and not any(state.get(stage) for stage in stages)}
    resumed = ModelRun.resumed_args(NAME, args, add_arguments, keys=tuple(k for k in SETTINGS_KEYS if k not in free),
                                    command=COMMAND)
    restart = {stage for k in free for stage in STAGES_OF[k]}
    for k in sorted(free):
        logger.info(f"--resume: --{k.replace('_', '-')} {getattr(args, k)} (the run's: {recorded[k]}) is taken: "
                    f"{' and '.join(STAGES_OF[k])} not finished, so started afresh")
    return resumed, restart


def default_recent(max_len: int) -> int:
    """--streaming-recent's default: `STREAMING_RECENT`, at most a quarter of the segment, so that the
    streaming window leaves most keys out (a window as long as the segment makes every error 0)."""
    return max(1, min(STREAMING_RECENT, max_len // 4))


def model_is_causal(model: str | None, revision: str | None = None) -> bool:
    """Whether the model is a decoder, read off its config before it loads (the LM head is loaded
    for a decoder's probes); False where the config cannot be read here (the loader then says why)."""
    try:
        from transformers import AutoConfig

        from bertscope.models.loading import check_supported
        from bertscope.models.source import resolve_model

        path = resolve_model(model, revision).path
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        return bool(check_supported(config).is_causal(config))
    except (UserError, ValueError, OSError):
        return False


def atlas_limit(text: str) -> int | str:
    """--limit: a count, or 'all' (kept as the word: the default, None, depends on the model)."""
    return "all" if text.lower() in ("all", "none") else positive_int(text)


def resolve_defaults(args, causal: bool) -> int | None:
    """The defaults that depend on the model (`DEFAULT_LIMIT`, `DEFAULT_MAX_LEN`). --max-len's is
    cut to the model's limit once it has loaded: until then args.max_len is 1 and the default is
    returned (None: --max-len was given)."""
    k = int(causal)
    if args.limit is None:
        args.limit = DEFAULT_LIMIT[k]
    if args.max_len is None:
        args.max_len = 1
        return DEFAULT_MAX_LEN[k]
    return None


def segment_limit(args) -> int | None:
    return None if args.limit == "all" else args.limit


@dataclass
class AtlasPlan:
    """What one atlas run will do, every option checked before its first stage (a mistake found after the
    streamed pass would cost its time): the model's layer kinds and windows, the streamed pass's segments
    and spec, and which probes run with their inputs."""

    causal: bool
    windows: list
    kinds: list[str]
    n_kv: int
    plan: list  # the sinks' BOS plan (`bos_plan`): the first token's id first
    stream: object  # the checked segments of the streamed pass
    report: object  # their report (`SegmentReport`)
    spec: object  # the streamed pass's StatsSpec (`stream_spec`)
    retrieval_on: bool
    importance_on: bool
    lengths: list[int]  # the retrieval's haystack lengths
    builder: object  # the retrieval's haystack builder, or None
    importance_segments: object  # the LM importance's checked segments, or None


def plan_atlas(run: ModelRun, args, needles) -> AtlasPlan:
    """The run's `AtlasPlan`: each stage's options checked, in one line each (`UserError`), before anything runs."""
    from bertscope.analyses.atlas import stats as A
    from bertscope.analyses.heads.positions.command import check_backend
    from bertscope.analyses.sinks import stats as S
    from bertscope.analyses.sinks.command import bos_plan, checked_sink_segments

    loaded = run.loaded
    config = loaded.model.config
    causal = loaded.architecture.is_causal(config)
    layouts = loaded.architecture.layouts(config)
    windows = [None if lay.window is None else lay.window[0] for lay in layouts]
    seg_args = Namespace(max_len=args.max_len, limit=segment_limit(args), seed=args.seed, initial=S.INITIAL, bos="auto",
                         bos_token=None, corpus=args.corpus, text_field=args.text_field)
    if causal:  # the window must leave keys out, or every head is "streaming-safe" with error 0
        check_streaming_window(args.streaming_sink, args.streaming_recent, args.max_len,
                               ("--streaming-sink", "--streaming-recent"))
    plan = bos_plan(loaded, seg_args, causal)
    stream, report = checked_sink_segments(loaded, seg_args, causal, plan)
    spec = A.stream_spec(windows, causal, (args.streaming_sink, args.streaming_recent), norms=args.norms)
    check_backend(args, spec)  # a Triton kernel without a statistic: refused in one line, before anything is written
    if 2 * args.induction_len + 1 > loaded.max_len:
        raise UserError(f"--induction-len {args.induction_len} makes sequences of {2 * args.induction_len + 1} "
                        f"tokens: more than the model allows ({loaded.max_len})")
    retrieval_on = causal and not args.no_retrieval and bool(needles)
    importance_on = causal and not args.no_importance
    lengths = retrieval_lengths(args, loaded) if retrieval_on else []
    n_kv = layouts[0].n_key_value_heads or loaded.n_heads
    return AtlasPlan(causal, windows, [A.layer_kind(lay) for lay in layouts], n_kv, plan, stream, report, spec,
                     retrieval_on, importance_on, lengths,
                     haystack_builder(args, loaded, needles, lengths) if retrieval_on else None,
                     checked_importance_segments(args, loaded) if importance_on else None)


def atlas_run(run: ModelRun, args, needles, restart: set[str] = frozenset()) -> int:
    """One atlas of `run`'s model: the plan checked (`plan_atlas`), then its stages, each saved as it ends and
    read back on --resume (`restart`: stages whose settings changed, run afresh): the streamed pass (sinks,
    positions, token relations, streaming error), the induction probe, the retrieval probe and the LM
    importance (decoders), then the head table and its outputs (rank 0). The exit code."""
    from bertscope.analyses.atlas import stats as A
    from bertscope.models.loading import model_name

    loaded = run.loaded
    p = plan_atlas(run, args, needles)
    run.open(args.out)
    run.announce()
    state_path = run.dir / STATE_FILE
    state = A.read_state(state_path) if args.resume else {}
    for stage in restart:  # a setting of an unfinished stage changed on --resume: its partial sums are not used
        state.pop(stage, None)
    log_plan(run, args, loaded, p.kinds, p.causal, state, p.lengths, len(needles), p.retrieval_on, p.importance_on)
    acc, scores, retrieval, importance, seconds = run_stages(run, args, needles, p, state, state_path, restart)
    if not run.is_main:
        return 0
    shape = (loaded.n_layers, loaded.n_heads)
    columns = {**A.stream_columns(acc, p.causal, p.n_kv), **A.probe_columns(shape, scores, retrieval, importance)}
    table = A.head_table(model_name(loaded.path), p.kinds, p.n_kv, columns)
    write_outputs(run, args, table, atlas_about(run, args, needles, p, acc, seconds))
    return 0


def run_stages(run: ModelRun, args, needles, p: AtlasPlan, state: dict, state_path, restart) -> tuple:
    """The stages of `p` in order, each one's state written as it ends: (the streamed pass's StreamStats, the
    induction scores, the retrieval's and the LM importance's results or None, each stage's wall seconds in
    this call, 0 when done before). Every rank runs the streamed pass, induction and retrieval; rank 0 alone
    the LM importance (the other ranks return after retrieval, with None for it)."""
    from bertscope.analyses.atlas import stats as A
    from bertscope.analyses.sinks import stats as S

    loaded = run.loaded
    seconds = {}
    t0 = time.perf_counter()
    # 1. the streamed pass
    acc = A.StreamStats(loaded.n_layers, loaded.n_heads, p.windows, p.spec, p.plan[0][0], S.n_buckets(loaded.max_len))
    if state.get("stream") and acc.load_into(run.dir, STREAM_FILES):
        run.log("the streamed pass was done before: its sums are read back")
    else:
        stream_pass(run, args, loaded, acc, p.stream, run.world, fresh="stream" in restart)
        if run.is_main:
            acc.save(run.dir, STREAM_FILES)
            state["stream"] = True
            A.write_state(state_path, state)
    seconds["stream"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()
    # 2. induction
    scores = induction_probe(run, args, loaded, p.causal, state, state_path, fresh="induction" in restart)
    seconds["induction"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()
    # 3. retrieval (decoders)
    retrieval = retrieval_probe(run, args, loaded, needles, p.lengths, p.builder) if p.retrieval_on else None
    if p.retrieval_on:
        seconds["retrieval"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()
    run.shutdown()
    if not run.is_main:
        return acc, scores, retrieval, None, seconds
    if p.retrieval_on:
        state["retrieval"] = True
        A.write_state(state_path, state)
    # 4. LM importance (decoders, rank 0)
    importance = importance_probe(run, args, loaded, p.importance_segments, fresh="importance" in restart) \
        if p.importance_on else None
    if p.importance_on:
        seconds["importance"] = round(time.perf_counter() - t0, 1)
        state["importance"] = True
        A.write_state(state_path, state)
    return acc, scores, retrieval, importance, seconds


def atlas_about(run: ModelRun, args, needles, p: AtlasPlan, acc, seconds: dict) -> dict:
    """run.json's atlas entry: the model, the corpus read, each probe's settings, the stages' wall time."""
    from bertscope.analyses.atlas import stats as A
    from bertscope.models.loading import model_name

    loaded = run.loaded
    return {"model": model_name(loaded.path), "origin": str(loaded.origin), "model_type": loaded.model_type,
            "decoder": p.causal, "layers": loaded.n_layers, "heads": loaded.n_heads, "kv_heads": p.n_kv,
            "kinds": p.kinds, "max_len": args.max_len, "segments": int(acc.positions.n_segments),
            "tokens": int(acc.positions.n_rows), "corpus": args.corpus, "corpus_rows": A.token_match_rows(acc.heads),
            "segments_report": p.report.as_dict(), "quantised": quantised(loaded),
            "induction": {"sequences": args.induction_sequences, "seq_len": args.induction_len,
                          "first": induction_first(loaded, p.causal)},
            "retrieval": ({"needles": [n.name for n in needles], "lengths": p.lengths, "depths": args.depths,
                           "answer": RETRIEVAL_ANSWER, "answered": retrieval_answered(run)}
                          if p.retrieval_on else None),
            "importance": ({"segments": args.importance_segments, "max_len": args.importance_len}
                           if p.importance_on else None),
            "streaming": [args.streaming_sink, args.streaming_recent], "norms": bool(args.norms),
            "seconds": seconds}


def quantised(loaded) -> str | None:
    """"4-bit GGUF" for the bundled decoders (their weights were stored in 4 bits), else None."""
    from bertscope.data.decoders import DECODERS

    name = Path(str(loaded.path)).name
    return "4-bit GGUF" if any(name.startswith(d) or d in str(loaded.origin) for d in DECODERS) else None


def retrieval_lengths(args, loaded) -> list[int]:
    from bertscope.analyses.heads.retrieval.command import ints

    lengths = ints(args.retrieval_lengths) or [min(RETRIEVAL_LENGTH, loaded.max_len)]
    too_long = [n for n in lengths if n > loaded.max_len]
    if too_long:
        raise UserError(f"--retrieval-lengths {too_long[0]} is longer than the model allows ({loaded.max_len})")
    return lengths


# --- the plan and its estimate -------------------------------------------------------------------


def log_plan(run, args, loaded, kinds, causal, state, lengths, n_needles, retrieval_on, importance_on):
    """What the run will do, stage by stage, and about how long: one forward pass over 128 tokens is
    timed here, and every stage's passes are scaled from it by their multiply-adds (`pass_work`)."""
    import torch

    from bertscope.analyses.heads.retrieval.command import duration, pass_work
    from bertscope.cli.args import others_running
    from bertscope.text.corpus import open_corpus, planned_segments

    n_depths = len(args.depths.split(","))
    stages = []  # (what, work in multiply-adds, factor: the statistics' cost beside the forward, or the backward's)
    corpus = open_corpus(args.corpus, args.text_field)
    limit = planned_segments(segment_limit(args), corpus)
    if segment_limit(args) is not None and segment_limit(args) > limit:
        run.log(f"--limit {args.limit}: {args.corpus} has {len(corpus)} documents, so the streamed pass reads them all")
    stages.append((f"streamed pass: {limit} segment(s) of up to {args.max_len} tokens of {args.corpus}",
                   limit * pass_work(loaded, kinds, args.max_len), STREAM_FACTOR, "stream"))
    T = args.induction_len
    stages.append((f"induction: {args.induction_sequences} sequences of {2 * T + 1} tokens",
                   args.induction_sequences * pass_work(loaded, kinds, 2 * T + 1), 1.5, "induction"))
    if retrieval_on:
        stages.append((f"retrieval: {n_needles} needle(s) x {len(lengths)} length(s) ({', '.join(map(str, lengths))})"
                       f" x {n_depths} depth(s), one pass each",
                       n_needles * n_depths * sum(pass_work(loaded, kinds, n) for n in lengths), 2.4, "retrieval"))
    if importance_on:
        stages.append((f"LM importance: {args.importance_segments} segment(s) of {args.importance_len} tokens, "
                       "forward and backward", args.importance_segments * pass_work(loaded, kinds, args.importance_len),
                       3.0, "importance"))
    base = loaded.model.base_model
    device = next(base.parameters()).device
    n = min(CALIBRATION_TOKENS, loaded.max_len)
    ids = torch.randint(0, min(100, loaded.model.config.vocab_size), (1, n), device=device)
    with torch.inference_mode():
        base(input_ids=ids)  # warm-up
        times = []
        for _ in range(CALIBRATION_PASSES):
            t0 = time.perf_counter()
            base(input_ids=ids)
            times.append(time.perf_counter() - t0)
        rate = sorted(times)[len(times) // 2] / pass_work(loaded, kinds, n)
    size = 1 if run.world is None else run.world.size
    total = 0.0
    for what, work, factor, key in stages:
        done = bool(state.get(key))
        seconds = 0.0 if done else work * factor * rate / (size if key in ("stream", "induction") else 1)
        total += seconds
        run.log(f"plan: {what}" + (" (done before)" if done else f", about {duration(seconds)}"))
    if not causal:
        run.log("plan: an encoder: no retrieval and no LM importance (decoders' probes)")
    try:
        busy = f"{others_running():.0f} other task(s) running on {os.cpu_count()} cores now"
    except (OSError, ValueError, IndexError):
        busy = "the machine's load unknown"
    run.log(f"estimate: about {duration(total)} in all, likely between {duration(total * ESTIMATE_RANGE[0])} and "
            f"{duration(total * ESTIMATE_RANGE[1])} (basis: the median of {CALIBRATION_PASSES} {n}-token forward "
            f"passes timed here just now, {busy}, scaled by multiply-adds, the streamed pass's statistics counted as "
            f"{STREAM_FACTOR:g} forward passes; it does not foresee the load changing, nor the statistics' cost "
            "growing faster than the forward's on long segments); smaller: --limit, --max-len, "
            "--induction-sequences, --depths, --no-retrieval, --no-importance")


CALIBRATION_TOKENS = 128  # the timed forward passes of the estimate (at most the model's limit)
CALIBRATION_PASSES = 3  # the estimate's rate is their median's: one pass caught by another job misleads less
# the range the estimate gives around itself: a run on a loaded 2-core machine took 3.6x the estimate of one
# timed pass (238 s for about 1 min), where the load grew after the timing; on an idle machine runs come in
# at 0.5-1.5x
ESTIMATE_RANGE = (0.5, 4.0)
STREAM_FACTOR = 2.0  # the streamed pass's statistics (distance, position, class masses) beside the forward, on a CPU


# --- the stages ------------------------------------------------------------------------------------


def stream_pass(run, args, loaded, acc, stream, world, fresh: bool = False):
    from dataclasses import replace

    from bertscope.analyses.sinks import stats as S
    from bertscope.engine.loop import EngineOptions, fold
    from bertscope.text.corpus import open_corpus, planned_segments

    stream_corpus = open_corpus(args.corpus, args.text_field)
    suffix = world.suffix() if world is not None else ""
    if args.resume and not fresh and acc.load_into(run.dir, STREAM_FILES, suffix):
        run.log(f"resuming the streamed pass after batch {acc.batches_done}")
    base = replace(loaded, model=loaded.model.base_model)  # the engine runs the base model
    every = max(1, min(20, CHECKPOINT_TOKENS // (args.batch_size * args.max_len)))
    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=run.progress,
                            checkpoint_every=every, total=planned_segments(segment_limit(args), stream_corpus))
    rank, size = (0, 1) if world is None else (world.rank, world.size)
    fold(base, stream, acc.spec, [acc], options, classes=S.SINK_CLASSES,
         checkpoint=lambda: acc.save(run.dir, STREAM_FILES, suffix), shard=(rank, size), desc="atlas: stream")
    acc.save(run.dir, STREAM_FILES, suffix)
    acc.all_reduce(world)


def induction_probe(run, args, loaded, causal, state, state_path, fresh: bool = False) -> dict:
    """The three scores of analyses/heads/induction on repeated random tokens (every model: a BOS
    before them in a decoder, [CLS] in an encoder)."""
    from dataclasses import replace

    import numpy as np
    import torch
    import torch.distributed as dist

    from bertscope.analyses.atlas.stats import write_state
    from bertscope.analyses.heads.induction.command import segments_of
    from bertscope.analyses.heads.induction.stats import (
        InductionScores,
        RepeatedSequence,
        induction_spec,
        random_sequences,
        score_offsets,
        token_pool,
    )
    from bertscope.engine.loop import EngineOptions, fold

    T = args.induction_len
    score_offsets(T)
    bos = first_token(loaded, causal)
    vocab = min(len(loaded.tokenizer), loaded.model.config.vocab_size)
    ids = random_sequences(args.induction_sequences, T, token_pool(loaded.tokenizer, vocab), bos, args.seed)
    layout = RepeatedSequence(T, bos is not None)
    world = run.world
    done = run.dir / INDUCTION_FILE.format(suffix="")
    if state.get("induction") and done.is_file():
        run.log("the induction probe was done before: its sums are read back")
        return InductionScores.load(done).scores()
    suffix = world.suffix() if world is not None else ""
    path = run.dir / INDUCTION_FILE.format(suffix=suffix)
    scores = InductionScores(loaded.n_layers, loaded.n_heads, layout)
    if args.resume and not fresh and path.is_file():
        saved = InductionScores.load(path)
        if saved.layout == layout:
            scores = saved
    base = replace(loaded, model=loaded.model.base_model)
    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=run.progress,
                            checkpoint_every=4)
    rank, size = (0, 1) if world is None else (world.rank, world.size)
    fold(base, segments_of(ids), induction_spec(T, loaded.classes.n_classes), [scores], options,
         checkpoint=lambda: scores.save(path), shard=(rank, size), desc="atlas: induction")
    scores.save(path)
    if world is not None and world.size > 1:
        t = torch.from_numpy(np.concatenate([scores.sums.ravel(), [scores.rows]]).astype(np.float64))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        scores.sums[...] = t[:-1].numpy().reshape(scores.sums.shape)
        scores.rows = int(round(float(t[-1])))
    if run.is_main:
        scores.save(done)
        state["induction"] = True
        write_state(state_path, state)
    return scores.scores()


def haystack_builder(args, loaded, needles, lengths):
    """The retrieval probe's haystacks, each needle built once at the shortest and the longest
    length: a length too short for a needle, or a corpus too short for a haystack, is one line
    before the first stage."""
    from bertscope.analyses.heads.retrieval.haystack import HaystackBuilder, corpus_texts, resolve_prompt

    builder = HaystackBuilder(loaded.tokenizer, corpus_texts(args.corpus, args.text_field),
                              resolve_prompt("auto", loaded.tokenizer))
    for needle in needles:
        for length in sorted({min(lengths), max(lengths)}):
            try:
                builder.build(needle, length, 0)
            except UserError as e:  # the builder's advice names `heads retrieval`'s options, not atlas's
                message = str(e).replace("--lengths", "--retrieval-lengths")
                if message.startswith(f"length {length}:"):
                    message = f"--retrieval-lengths {message[len('length '):]}"
                raise UserError(message) from None
    return builder


def checked_importance_segments(args, loaded):
    """The LM importance probe's segments, made before the first stage: an --importance-len longer
    than the model allows, or a corpus with no usable segment, is one line naming the option."""
    from bertscope.analyses.heads import lm_task as LMD

    if args.importance_len > loaded.max_len:
        raise UserError(f"--importance-len {args.importance_len} is longer than the model allows ({loaded.max_len})")
    segments, _ = LMD.lm_segments(loaded, args.corpus, args.importance_len, args.importance_segments, args.seed)
    return segments


def first_token(loaded, causal: bool) -> int | None:
    """The token before the induction probe's random tokens: a decoder's BOS, an encoder's [CLS]; None: none."""
    from bertscope.analyses.heads.induction.command import bos_token

    return bos_token(loaded, False) if causal else getattr(loaded.tokenizer, "cls_token_id", None)


def induction_first(loaded, causal: bool) -> str | None:
    """What the card says comes first in each induction sequence: "BOS", "[CLS]" or None."""
    return None if first_token(loaded, causal) is None else "BOS" if causal else "[CLS]"


def retrieval_probe(run, args, loaded, needles, lengths, builder):
    """analyses/heads/retrieval's grid on a few haystacks, each answered in the model's own words
    (`heads retrieval --answer greedy`): (Ly, H) retrieval scores over the answered haystacks, or None
    when fewer than head_types.MIN_ANSWERED were answered (`stats.retrieval_column`); every rank's
    cells gathered. `builder`: `haystack_builder`'s, made before the first stage."""
    from bertscope.analyses.atlas.stats import retrieval_column
    from bertscope.analyses.heads.retrieval.command import ints, run_cells
    from bertscope.analyses.heads.retrieval.stats import Cell, GridScores

    prompt = builder.prompt
    setup = {"model": loaded.record(), "prompt": prompt, "corpus": args.corpus, "text_field": args.text_field,
             "needles": {n.name: [n.needle, n.question, n.answer] for n in needles}, "answer": RETRIEVAL_ANSWER}
    cells = [Cell(n.name, length, depth) for n in needles for length in lengths for depth in ints(args.depths)]
    records = run_cells(run, Namespace(answer=RETRIEVAL_ANSWER, backend=args.backend), builder,
                        {n.name: n for n in needles}, cells, setup)
    grid = GridScores.of([records[c.key] for c in cells if c.key in records], loaded.n_layers, loaded.n_heads)
    run._atlas_retrieval = (grid.n_answered, grid.n_cells)
    return retrieval_column(grid)


def retrieval_answered(run) -> dict:
    answered, cells = getattr(run, "_atlas_retrieval", (0, 0))
    return {"answered": answered, "haystacks": cells}


def importance_probe(run, args, loaded, segments, fresh: bool = False):
    """analyses/heads/lm_task's LM importance on a few corpus segments (`checked_importance_segments`;
    saved per batch)."""
    from bertscope.analyses.heads import lm_task as LMD

    device = next(loaded.model.parameters()).device
    batches = LMD.lm_batches(segments, max(1, min(args.batch_size, 4)), LMD.pad_id(loaded.tokenizer), device)
    path = run.dir / IMPORTANCE_STATE
    sums = LMD.LMSums.load(path) if args.resume and not fresh and path.is_file() else None
    if sums is not None and sums.batches_done >= len(batches):
        run.log("the LM importance probe was done before: its sums are read back")
    res = LMD.lm_importance(loaded, batches, "michel", True, None, run.progress, sums,
                            checkpoint=lambda s: s.save(path))
    return res.importance


# --- the outputs -------------------------------------------------------------------------------------


def write_outputs(run, args, table: dict, about: dict):
    from bertscope.analyses.atlas import card
    from bertscope.analyses.atlas import stats as A

    columns = A.column_order()
    run.write_csv(HEADS_FILE, A.csv_cells(A.rows_of(table)), columns)  # full precision, as the Parquet file
    write_parquet(run, table, columns)
    layer_rows = A.layer_rows(table, about.get("corpus_rows"))
    run.write_csv(LAYERS_FILE, A.csv_cells(layer_rows), A.layer_columns())
    results = card.headline(table, about)
    for line in card.summary_lines(results):
        run.log(line)
    figures = {}
    if not args.no_figures:
        from bertscope.analyses.atlas import plots

        figures["grid"] = run.save_figure(plots.plot_grid(table, about), GRID_FIGURE)
        figures["layers"] = run.save_figure(plots.plot_layers(layer_rows, about), LAYERS_FIGURE)
    run.write_text(CARD_MD, card.markdown(table, about, results, figures={k: v.name for k, v in figures.items() if v}))
    run.write_text(CARD_HTML, card.html(table, about, results, run.dir, figures))
    run.finish(results)


def write_parquet(run, table: dict, columns: tuple[str, ...]):
    import pandas as pd

    frame = pd.DataFrame({c: table[c] for c in columns})
    path = run.dir / PARQUET_FILE
    tmp = path.with_name(path.name + ".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)
    run.outputs.append(PARQUET_FILE)


def finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the streamed pass's
    union (and with --norms, the union with the sinks' norm-based twins: off by default on the triton backend), and a
    decoder's induction and retrieval probes."""
    from bertscope.analyses.atlas import stats as A
    from bertscope.analyses.heads.induction.stats import induction_spec
    from bertscope.analyses.heads.retrieval.stats import retrieval_spec
    from bertscope.analyses.registry import command_defaults

    d = command_defaults(sys.modules[__name__])
    recent = STREAMING_RECENT if d["streaming_recent"] is None else d["streaming_recent"]  # None: set per model
    out = {"stream (union)": A.stream_spec([None], model.causal, (d["streaming_sink"], recent)),
           "stream (union) --norms": A.stream_spec([None], model.causal, (d["streaming_sink"], recent), norms=True)}
    if model.causal:  # the induction and retrieval probes are a decoder's
        out |= {"induction": induction_spec(d["induction_len"], model.classes.n_classes),
                "retrieval": retrieval_spec(model)}
    return out
