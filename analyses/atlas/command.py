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
import sys
import time
from argparse import Namespace
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
from bertscope.cli.args import add_common_arguments, positive_int
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

# torch, numpy and the statistics are imported where the run uses them: building this command's
# parser imports this module, and a mistyped option is then refused at once
logger = logging.getLogger(__name__)

COMMAND = "atlas"
HELP = ("one card per model typing every head (sink, previous-token, duplicate, induction, retrieval, "
        "streaming-safe, broad, local) from one streamed pass and short probes; `atlas compare RUN...` sets "
        "several models' heads side by side")
DESCRIPTION = (
    "One streamed pass over a corpus (default: the bundled Wikipedia) with every per-head statistic (entropy, "
    "previous/self/next mass, first-token mass, the distance profile, and where this bertscope computes them the "
    "duplicate and prefix-match masses and the streaming error), then short probes: induction on repeated random "
    "tokens, and for decoders a small needle-in-a-haystack grid (retrieval heads) and LM importance. Writes "
    "atlas_heads.csv and atlas_heads.parquet (one row per head; docs/atlas.md gives every column's unit), "
    "atlas_layers.csv, a head card (atlas_card.md, atlas_card.html: the model's shape, a grid of every head "
    "coloured by type, per-layer profiles, the top heads of each type) and run.json['analyses']['atlas']. Types "
    "come from the fixed thresholds of analyses/atlas/head_types.py; a head may carry several. Resumable "
    "(--resume DIR), sharded under torchrun. `bertscope atlas compare RUN RUN ...`: the heads of several runs in "
    "one table and one figure (standardised features, PCA).")
CHECKPOINT_TOKENS = 65536  # padded tokens between two checkpoints of the streamed sums (at most 20 batches)
# the defaults that depend on the model: (encoder, decoder)
DEFAULT_LIMIT = (100, 32)
DEFAULT_MAX_LEN = (128, 1024)
DEFAULT_NEEDLES = "san-francisco"
DEFAULT_DEPTHS = "10,50,90"
MIN_INDUCTION_LEN = 3  # analyses/heads/induction's MIN_SEQ_LEN (said here without importing torch)
RETRIEVAL_LENGTH = 1024  # the haystack length (at most the model's limit)
SETTINGS_KEYS = ("model", "revision", "corpus", "text_field", "limit", "max_len", "seed", "batch_size", "backend",
                 "device", "dtype", "induction_sequences", "induction_len", "needles", "retrieval_lengths",
                 "depths", "no_retrieval", "importance_segments", "importance_len", "no_importance",
                 "streaming_sink", "streaming_recent")


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
    p.add_argument("--importance-len", type=positive_int, default=256, metavar="L",
                   help="tokens per importance segment (default: 256)")
    p.add_argument("--no-importance", action="store_true", help="skip the LM importance probe")
    p.add_argument("--streaming-sink", type=positive_int, default=4, metavar="S",
                   help="the streaming error's sink: the first S keys kept (default: 4, StreamingLLM's)")
    p.add_argument("--streaming-recent", type=positive_int, default=256, metavar="W",
                   help="the streaming error's recent window: the last W keys kept (default: 256)")
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
    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, keys=SETTINGS_KEYS, command=COMMAND)
    if args.induction_len < MIN_INDUCTION_LEN:
        raise UserError(f"--induction-len must be at least {MIN_INDUCTION_LEN} (at T = 2 the induction key is the "
                        f"previous token), not {args.induction_len}")
    causal = model_is_causal(args.model, getattr(args, "revision", None))
    from bertscope.analyses.heads.retrieval.haystack import load_needles

    needles = load_needles(args.needles) if causal and not args.no_retrieval else []  # refused before the model loads
    default_len = resolve_defaults(args, causal)
    with ModelRun(NAME, args, task="causal-lm" if causal else None, command=COMMAND, distributed=True,
                  resumable=True, open=False) as run:
        if default_len is not None:
            args.max_len = min(default_len, run.loaded.max_len)
            run.record["settings"]["max_len"] = args.max_len
        return atlas_run(run, args, needles)


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


def atlas_run(run: ModelRun, args, needles) -> int:
    from bertscope.analyses.atlas import stats as A
    from bertscope.analyses.heads.positions.command import check_backend
    from bertscope.analyses.sinks import stats as S
    from bertscope.analyses.sinks.command import bos_plan, checked_sink_segments

    loaded = run.loaded
    config = loaded.model.config
    causal = loaded.architecture.is_causal(config)
    layouts = loaded.architecture.layouts(config)
    windows = [None if lay.window is None else lay.window[0] for lay in layouts]
    kinds = ["global" if w is None else f"window {w + 1}" for w in windows]
    n_kv = layouts[0].n_key_value_heads or loaded.n_heads
    seg_args = Namespace(max_len=args.max_len, limit=segment_limit(args), seed=args.seed, initial=S.INITIAL, bos="auto",
                         bos_token=None, corpus=args.corpus, text_field=args.text_field)
    plan = bos_plan(loaded, seg_args, causal)
    stream, report = checked_sink_segments(loaded, seg_args, causal, plan)
    spec = A.stream_spec(windows, causal, (args.streaming_sink, args.streaming_recent))
    check_backend(args, spec)  # a Triton kernel without a statistic: refused in one line, before anything is written
    if 2 * args.induction_len + 1 > loaded.max_len:
        raise UserError(f"--induction-len {args.induction_len} makes sequences of {2 * args.induction_len + 1} "
                        f"tokens: more than the model allows ({loaded.max_len})")
    run.open(args.out)
    run.announce()
    world = run.world
    state_path = run.dir / STATE_FILE
    state = A.read_state(state_path) if args.resume else {}
    retrieval_on = causal and not args.no_retrieval and bool(needles)
    importance_on = causal and not args.no_importance
    lengths = retrieval_lengths(args, loaded) if retrieval_on else []
    log_plan(run, args, loaded, kinds, causal, state, lengths, len(needles), retrieval_on, importance_on)

    seconds = {}  # each stage's wall time in this call (0: done before)
    t0 = time.perf_counter()
    # 1. the streamed pass
    acc = A.StreamStats(loaded.n_layers, loaded.n_heads, windows, spec, plan[0][0], S.n_buckets(loaded.max_len))
    if state.get("stream") and acc.load_into(run.dir, STREAM_FILES):
        run.log("the streamed pass was done before: its sums are read back")
    else:
        stream_pass(run, args, loaded, acc, stream, world)
        if run.is_main:
            acc.save(run.dir, STREAM_FILES)
            state["stream"] = True
            A.write_state(state_path, state)

    seconds["stream"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()
    # 2. induction
    scores = induction_probe(run, args, loaded, causal, state, state_path)
    seconds["induction"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()

    # 3. retrieval (decoders)
    retrieval = retrieval_probe(run, args, loaded, needles, lengths) if retrieval_on else None
    if retrieval_on:
        seconds["retrieval"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()
    run.shutdown()
    if not run.is_main:
        return 0
    if retrieval_on:
        state["retrieval"] = True
        A.write_state(state_path, state)

    # 4. LM importance (decoders, rank 0)
    importance = importance_probe(run, args, loaded) if importance_on else None
    if importance_on:
        seconds["importance"] = round(time.perf_counter() - t0, 1)
        state["importance"] = True
        A.write_state(state_path, state)

    from bertscope.models.loading import model_name

    shape = (loaded.n_layers, loaded.n_heads)
    columns = {**A.stream_columns(acc, causal, n_kv),
               **A.probe_columns(shape, scores, retrieval, importance)}
    table = A.head_table(model_name(loaded.path), kinds, n_kv, columns)
    about = {"model": model_name(loaded.path), "origin": str(loaded.origin), "model_type": loaded.model_type,
             "decoder": causal, "layers": loaded.n_layers, "heads": loaded.n_heads, "kv_heads": n_kv,
             "kinds": kinds, "max_len": args.max_len, "segments": int(acc.positions.n_segments),
             "tokens": int(acc.positions.n_rows), "corpus": args.corpus,
             "segments_report": report.as_dict(), "quantised": quantised(loaded),
             "induction": {"sequences": args.induction_sequences, "seq_len": args.induction_len},
             "retrieval": ({"needles": [n.name for n in needles], "lengths": lengths, "depths": args.depths,
                            "answered": retrieval_answered(run)} if retrieval_on else None),
             "importance": ({"segments": args.importance_segments, "max_len": args.importance_len}
                            if importance_on else None),
             "streaming": [args.streaming_sink, args.streaming_recent], "seconds": seconds}
    write_outputs(run, args, table, about)
    return 0


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
    from bertscope.text.corpus import open_corpus

    n_depths = len(args.depths.split(","))
    stages = []  # (what, work in multiply-adds, factor: the statistics' cost beside the forward, or the backward's)
    limit = segment_limit(args) or len(open_corpus(args.corpus, args.text_field))
    stages.append((f"streamed pass: {limit} segment(s) of up to {args.max_len} tokens of {args.corpus}",
                   limit * pass_work(loaded, kinds, args.max_len), STREAM_FACTOR, "stream"))
    T = args.induction_len
    stages.append((f"induction: {args.induction_sequences} sequences of {2 * T + 1} tokens",
                   args.induction_sequences * pass_work(loaded, kinds, 2 * T + 1), 1.5, "induction"))
    if retrieval_on:
        stages.append((f"retrieval: {n_needles} needle(s) x {len(lengths)} length(s) ({', '.join(map(str, lengths))})"
                       f" x {n_depths} depth(s), one pass each",
                       n_needles * n_depths * sum(pass_work(loaded, kinds, n) for n in lengths), 1.2, "retrieval"))
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
        t0 = time.perf_counter()
        base(input_ids=ids)
        rate = (time.perf_counter() - t0) / pass_work(loaded, kinds, n)
    size = 1 if run.world is None else run.world.size
    total = 0.0
    for what, work, factor, key in stages:
        done = bool(state.get(key))
        seconds = 0.0 if done else work * factor * rate / (size if key in ("stream", "induction") else 1)
        total += seconds
        run.log(f"plan: {what}" + (" (done before)" if done else f", about {duration(seconds)}"))
    if not causal:
        run.log("plan: an encoder: no retrieval and no LM importance (decoders' probes)")
    run.log(f"estimate: about {duration(total)} in all (one 128-token forward pass timed here, scaled by "
            "multiply-adds; the streamed pass's statistics counted as "
            f"{STREAM_FACTOR:g} forward passes); smaller: --limit, --max-len, --induction-sequences, --depths, "
            "--no-retrieval, --no-importance")


CALIBRATION_TOKENS = 128  # the timed forward pass of the estimate (at most the model's limit)
STREAM_FACTOR = 2.0  # the streamed pass's statistics (distance, position, class masses) beside the forward, on a CPU


# --- the stages ------------------------------------------------------------------------------------


def stream_pass(run, args, loaded, acc, stream, world):
    from dataclasses import replace

    from bertscope.analyses.sinks import stats as S
    from bertscope.engine.loop import EngineOptions, fold

    suffix = world.suffix() if world is not None else ""
    if args.resume and acc.load_into(run.dir, STREAM_FILES, suffix):
        run.log(f"resuming the streamed pass after batch {acc.batches_done}")
    base = replace(loaded, model=loaded.model.base_model)  # the engine runs the base model
    every = max(1, min(20, CHECKPOINT_TOKENS // (args.batch_size * args.max_len)))
    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=run.progress,
                            checkpoint_every=every, total=segment_limit(args))
    rank, size = (0, 1) if world is None else (world.rank, world.size)
    fold(base, stream, acc.spec, [acc], options, classes=S.SINK_CLASSES,
         checkpoint=lambda: acc.save(run.dir, STREAM_FILES, suffix), shard=(rank, size), desc="atlas: stream")
    acc.save(run.dir, STREAM_FILES, suffix)
    acc.all_reduce(world)


def induction_probe(run, args, loaded, causal, state, state_path) -> dict:
    """The three scores of analyses/heads/induction on repeated random tokens (every model: a BOS
    before them in a decoder, [CLS] in an encoder)."""
    from dataclasses import replace

    import numpy as np
    import torch
    import torch.distributed as dist

    from bertscope.analyses.atlas.stats import write_state
    from bertscope.analyses.heads.induction.command import bos_token, segments_of
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
    bos = bos_token(loaded, False) if causal else getattr(loaded.tokenizer, "cls_token_id", None)
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
    if args.resume and path.is_file():
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


def retrieval_probe(run, args, loaded, needles, lengths):
    """analyses/heads/retrieval's grid on a few haystacks: (Ly, H) retrieval scores (over the answered
    haystacks; over every one when none was answered), every rank's cells gathered."""
    from bertscope.analyses.heads.retrieval.command import ints, run_cells
    from bertscope.analyses.heads.retrieval.haystack import HaystackBuilder, corpus_texts, resolve_prompt
    from bertscope.analyses.heads.retrieval.stats import Cell, GridScores

    prompt = resolve_prompt("auto", loaded.tokenizer)
    builder = HaystackBuilder(loaded.tokenizer, corpus_texts(args.corpus, args.text_field), prompt)
    for needle in needles:  # a length too short for a needle, before any pass
        builder.build(needle, min(lengths), 0)
    setup = {"model": loaded.record(), "prompt": prompt, "corpus": args.corpus, "text_field": args.text_field,
             "needles": {n.name: [n.needle, n.question, n.answer] for n in needles}}
    cells = [Cell(n.name, length, depth) for n in needles for length in lengths for depth in ints(args.depths)]
    records = run_cells(run, Namespace(answer="reference", backend=args.backend), builder,
                        {n.name: n for n in needles}, cells, setup)
    grid = GridScores.of([records[c.key] for c in cells if c.key in records], loaded.n_layers, loaded.n_heads)
    run._atlas_retrieval = (grid.n_answered, grid.n_cells)
    return grid.answered if grid.n_answered else grid.all


def retrieval_answered(run) -> dict:
    answered, cells = getattr(run, "_atlas_retrieval", (0, 0))
    return {"answered": answered, "haystacks": cells}


def importance_probe(run, args, loaded):
    """analyses/heads/lm_task's LM importance on a few corpus segments (saved per batch)."""
    from bertscope.analyses.heads import lm_task as LMD

    segments, _ = LMD.lm_segments(loaded, args.corpus, min(args.importance_len, loaded.max_len),
                                  args.importance_segments, args.seed)
    device = next(loaded.model.parameters()).device
    batches = LMD.lm_batches(segments, max(1, min(args.batch_size, 4)), LMD.pad_id(loaded.tokenizer), device)
    path = run.dir / IMPORTANCE_STATE
    sums = LMD.LMSums.load(path) if args.resume and path.is_file() else None
    if sums is not None and sums.batches_done >= len(batches):
        run.log("the LM importance probe was done before: its sums are read back")
    res = LMD.lm_importance(loaded, batches, "michel", True, None, run.progress, sums,
                            checkpoint=lambda s: s.save(path))
    return res.importance


# --- the outputs -------------------------------------------------------------------------------------


def write_outputs(run, args, table: dict, about: dict):
    from bertscope.analyses.atlas import card
    from bertscope.analyses.atlas import stats as A

    rows = [{k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in A.rows_of(table)]
    columns = A.column_order()
    run.write_csv(HEADS_FILE, rows, columns)
    write_parquet(run, table, columns)
    layer_rows = A.layer_rows(table)
    run.write_csv(LAYERS_FILE, layer_rows, A.layer_columns())
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
    union, and a decoder's induction and retrieval probes."""
    from bertscope.analyses.atlas import stats as A
    from bertscope.analyses.heads.induction.stats import induction_spec
    from bertscope.analyses.heads.retrieval.stats import retrieval_spec
    from bertscope.analyses.registry import command_defaults

    d = command_defaults(sys.modules[__name__])
    out = {"stream (union)": A.stream_spec([None], model.causal, (d["streaming_sink"], d["streaming_recent"]))}
    if model.causal:  # the induction and retrieval probes are a decoder's
        out |= {"induction": induction_spec(d["induction_len"], model.classes.n_classes),
                "retrieval": retrieval_spec(model)}
    return out
