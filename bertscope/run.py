"""`bertscope run`: corpus -> segments -> engine -> accumulators -> surface analysis -> outputs.

Nothing is written before the input is known to be good (model, corpus, segments): a run
that fails on bad input leaves no run directory behind. A run then writes run.json (status
"running"), checkpoints stats.npz every few batches with the number of batches done, and
rewrites run.json as "complete" at the end. An
interrupted run continues with `bertscope run --resume DIR`: the segments are rebuilt
deterministically from the recorded settings and the finished batches are skipped.
"""
from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import transformers

import bertscope
from bertscope.accumulate import HeadStats
from bertscope.analyses import surface
from bertscope.corpus import load_corpus
from bertscope.distributed import all_reduce_stats, broadcast, init_world, shutdown
from bertscope.engine import EngineOptions, fold, plan_batches
from bertscope.errors import UserError
from bertscope.kernels import StatsSpec, describe_backend, output_path, resolve_backend
from bertscope.models import load_model, model_name
from bertscope.per_example import FILE_NAME, PerExampleWriter
from bertscope.report import REPORT_NAME, write_report
from bertscope.results import check_run_dir, new_run_dir, read_json, write_csv, write_json
from bertscope.segments import SegmentOptions, describe_lengths, make_segments


@dataclass
class RunSettings:
    """Everything that determines a run's result (recorded in run.json)."""

    corpus: str = "wiki"
    model: str | None = None  # None: the embedded all-MiniLM-L6-v2
    limit: int | None = 1000
    max_len: int = 128
    seed: int = 0
    token_types: str = "pair"
    max_offset: int = 2
    argmax: bool = False
    batch_size: int = 16
    backend: str = "auto"
    device: str = "cpu"
    packing: str = "clark"  # how Wikipedia text becomes segments (bertscope.segments)
    average: str = "tokens"  # pool all tokens, or average per segment first (HeadStats)
    per_example: bool = False  # also write examples.parquet: one row per (segment, layer, head)

    @classmethod
    def from_dict(cls, d: dict) -> "RunSettings":
        d = {"packing": "balanced", **d}  # runs recorded before --packing existed used the balanced split
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def spec(self) -> StatsSpec:
        own = StatsSpec(offsets=tuple(range(-self.max_offset, self.max_offset + 1)), n_key_classes=4,
                        argmax=self.argmax)
        return own.union(surface.NEEDS)


def run(settings: RunSettings, out: str | None = None, resume: str | None = None, figures: bool = True,
        progress: bool = True, log=print) -> Path:
    """Run the surface analysis; returns the run directory.

    Under torchrun every rank runs this same function on its share of the batches; rank 0
    creates the run directory and writes the outputs.
    """
    t0 = time.perf_counter()
    world = init_world()
    if not world.is_main:
        log, progress = (lambda *a, **k: None), False
    run_dir = None
    if resume:
        run_dir = Path(resume)
        record = read_json(run_dir / "run.json")
        settings = RunSettings.from_dict(record["settings"])
        if record.get("world_size", 1) != world.size:
            raise UserError(f"{run_dir} was started with {record.get('world_size', 1)} processes; "
                            f"resume it with the same number (now {world.size})")
        if record.get("status") == "complete":
            log(f"{run_dir} is already complete; writing its outputs again")
    elif world.is_main:
        check_run_dir(out)  # a used --out fails before any work

    loaded = load_model(settings.model, device=settings.device)
    if settings.max_len > loaded.max_len:
        raise UserError(f"--max-len {settings.max_len} is longer than the model allows ({loaded.max_len})")
    documents, corpus_report = load_corpus(settings.corpus)
    seg_options = SegmentOptions(max_len=settings.max_len, limit=settings.limit, seed=settings.seed,
                                 token_types=settings.token_types, packing=settings.packing)
    segments, seg_report = make_segments(documents, loaded.tokenizer, seg_options)
    # corpus order (the sample is drawn in shuffled order): segment i of examples.parquet is
    # the i-th sampled segment as the corpus lists them
    doc_index = {d.id: i for i, d in enumerate(documents)}
    segments.sort(key=lambda s: doc_index[s.doc_id])
    if not segments:
        raise UserError(f"no usable segments in corpus {settings.corpus!r}: {seg_report.as_dict()}")
    if run_dir is None:  # the input is good: only now is anything written
        run_dir = Path(on_main(world, lambda: str(new_run_dir(out))))
    log(f"bertscope {bertscope.__version__}: run directory {run_dir}")
    log(f"model {loaded.path} ({loaded.model_type}, {loaded.n_layers} layers x {loaded.n_heads} heads); "
        f"{len(segments)} segments from {settings.corpus}"
        + (f" ({settings.packing} packing)" if settings.corpus == "wiki" else "")
        + (f", {seg_report.truncated} truncated to {settings.max_len} tokens" if seg_report.truncated else ""))

    record = {
        "bertscope_version": bertscope.__version__,
        "command": " ".join(sys.argv),
        "status": "running",
        "settings": asdict(settings),
        "model": {"path": str(loaded.path), "type": loaded.model_type, "layers": loaded.n_layers,
                  "heads": loaded.n_heads},
        "corpus": corpus_report.as_dict(),
        "segments": seg_report.as_dict(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "analyses": [surface.NAME],
        "kernel": describe_backend(settings.backend, next(loaded.model.parameters()).device),
        # a run needs no gradient: every layer's output comes from the backend's fused pass
        "output": output_path(resolve_backend(settings.backend, next(loaded.model.parameters()).device), grad=False),
        "world_size": world.size,
    }
    # the checkpoint is one file, written atomically: stats.npz, or stats.rank<r>.npz per
    # rank under torchrun; it records how many batches its sums cover
    stats_path = run_dir / f"stats{world.suffix()}.npz"
    spec = settings.spec()
    stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes, settings.average)
    if resume and stats_path.exists():
        try:
            stats = HeadStats.load(stats_path)
        except ValueError as e:
            raise UserError(f"cannot resume: {e}") from None
        log(f"resuming after {stats.batches_done} of {len(plan_batches(segments, settings.batch_size))} batches")
    examples = None
    if settings.per_example:
        # parts first, sums last: the sums' batches_done is the checkpoint; parts beyond it go
        examples = PerExampleWriter.load(run_dir / "examples", spec, loaded.classes,
                                         [doc_index[s.doc_id] for s in segments], rank=world.rank)
        examples.rewind(stats.batches_done)

    def checkpoint():
        if examples is not None:
            examples.save()
        stats.save(stats_path)
    if world.is_main:
        write_json(run_dir / "run.json", record)

    options = EngineOptions(batch_size=settings.batch_size, backend=settings.backend, progress=progress)
    try:
        fold(loaded, segments, spec, [acc for acc in (examples, stats) if acc is not None], options,
             checkpoint=checkpoint, shard=(world.rank, world.size))
    except KeyboardInterrupt:
        raise UserError(f"interrupted; the finished batches are saved: bertscope run --resume {run_dir}") from None
    stats = all_reduce_stats(world, stats)
    shutdown(world)  # the sums are all in; only rank 0 has work left
    if not world.is_main:
        return run_dir
    if world.size > 1:
        stats.save(run_dir / "stats.npz")

    record.update(n_tokens=int(stats.n_tokens[0]), elapsed_s=round(time.perf_counter() - t0, 2))
    outputs = write_surface(stats, run_dir, loaded, record, figures, log)
    if settings.per_example:
        rows = examples.finish(run_dir / FILE_NAME)
        record["per_example"] = {"file": FILE_NAME, "rows": rows}
        outputs.append(FILE_NAME)
        log(f"wrote {rows} per-example rows (segment x layer x head) to {FILE_NAME}")
    record.update(status="complete", outputs=outputs + [REPORT_NAME])
    write_json(run_dir / "run.json", record)
    write_report(run_dir)  # last: the report reads every output, run.json included
    log(f"wrote the report {run_dir / REPORT_NAME}")
    return run_dir


def on_main(world, make):
    """`make()` on rank 0, its result (or its UserError) on every rank."""
    result = None
    if world.is_main:
        try:
            result = ("ok", make())
        except UserError as e:
            result = ("error", str(e))
    status, value = broadcast(world, result)
    if status == "error":
        raise UserError(value)
    return value


def write_surface(stats: HeadStats, run_dir: Path, loaded, record: dict, figures: bool, log) -> list[str]:
    """heads.csv, figures and the terminal summary of the surface analysis."""
    table = surface.head_table(stats)
    write_csv(run_dir / "heads.csv", surface.table_rows(table), tuple(table))
    outputs = ["heads.csv", "stats.npz"]
    figure_names = []
    if figures:
        from bertscope.analyses.surface_plots import plot_surface

        title = model_name(loaded.path)
        paths = plot_surface(table, run_dir, title=title, uniform_entropy=stats.uniform_entropy(),
                             cls_uniform_entropy=stats.uniform_entropy("cls"))
        figure_names = [p.name for p in paths]
    text = f"  {describe_lengths(record['segments'].get('lengths', {}))}\n" + surface.summary(table)
    outputs += figure_names
    log(f"surface patterns over {record['n_tokens']} tokens, means over "
        f"{record['settings'].get('average', 'tokens')} (head = layer-head, numbered from 1):")
    log(text)
    log(f"wrote {', '.join(outputs)} to {run_dir}")
    return outputs
