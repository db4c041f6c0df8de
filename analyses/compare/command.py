"""`bertscope compare RUN_A RUN_B`: what changed, head by head, between two runs.

Two run directories of the same model shape (pre-trained vs fine-tuned, two corpora, two
checkpoints) are compared on every per-head statistic both hold: heads.csv's columns and
the per-head tables probes add (`PROBE_TABLES`). Where both runs have examples.parquet,
each heads.csv statistic of each head is also tested on its per-segment values
(`bertscope.analyses.compare.stats`): paired when the runs hold the same segments, unpaired
otherwise, with Benjamini-Hochberg across the heads of a statistic.

examples.parquet is read in streaming batches with column projection: memory holds the
(segments, layers, heads) arrays of a few statistics at a time, never the whole file.

`compare_runs` returns a `Comparison` (tables as arrays, CSV rows, summary) for other
code such as the report; `write_comparison` writes it into a directory.
"""
from __future__ import annotations

import csv
import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bertscope.analyses.compare.outputs import CSV_NAME, FIGURE
from bertscope.analyses.probes.classifier import outputs as classifier_outputs
from bertscope.analyses.probes.coref import outputs as coref_outputs
from bertscope.analyses.probes.syntax import outputs as syntax_outputs
from bertscope.analyses.surface.outputs import EXAMPLES_FILE, HEADS_FILE
from bertscope.cli.args import add_quiet_argument, fraction
from bertscope.errors import UserError
from bertscope.files import read_run, write_csv
from bertscope.run.rundir import check_run_dir, new_run_dir, update_json

if TYPE_CHECKING:
    import numpy as np

# numpy and what imports numpy or torch (the statistics, the model names, the report) are imported inside the
# functions that run the analysis: the command line imports this module to build the command's parser, so a
# mistyped option is refused at once, not after the seconds those imports take (tests/cli/test_new_user.py)

logger = logging.getLogger(__name__)

# heads.csv columns that are no statistic: the head's coordinates and the token count
NOT_COMPARED = ("layer", "head", "n_tokens")
# per-head tables of probes: file -> (columns that name the statistic, value columns).
# cluster_mds.csv is left out: MDS coordinates have an arbitrary rotation per run, and its
# other columns repeat heads.csv.
PROBE_TABLES = {
    syntax_outputs.HEADS_FILE: (("treebank", "relation", "direction"), ("accuracy",)),
    coref_outputs.HEADS_FILE: (("dataset", "mention_type"), ("accuracy",)),
    classifier_outputs.WEIGHTS_FILE: ((), ("w", "u")),
}
# heads.csv name -> examples.parquet name, where they differ (bertscope.analyses.surface.per_example)
EXAMPLE_NAME = {"rest_sep": "non_sep_sep"}
COLUMNS = ("source", "statistic", "layer", "head", "a", "b", "diff", "test", "n_a", "n_b", "p", "q", "significant")
BATCH_ROWS = 1 << 16  # parquet rows per streamed batch


# ----------------------------------------------------------------------------- one run

@dataclass
class RunDir:
    """What `compare` reads of one run directory."""

    path: Path
    record: dict
    layers: int
    heads: int
    tables: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)  # (source, statistic) -> (layers, H)
    examples: Path | None = None

    def describe(self) -> str:
        from bertscope.models.loading import model_name

        model = (self.record.get("model") or {}).get("path", "?")
        corpus = (self.record.get("settings") or {}).get("corpus")
        return f"{self.path} ({model_name(model)}" + (f", corpus {corpus})" if corpus else ")")


def load_run(path: str | Path) -> RunDir:
    """A run directory's shape and per-head tables; a `UserError` for anything unusable."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory: give two bertscope run directories")
    record = read_run(path / "run.json")
    if record.get("status", "complete") != "complete":
        raise UserError(f"{path} is not complete (status {record['status']!r}): finish it with "
                        f"bertscope run --resume {path}")
    layers, heads = _shape(record, path)
    run = RunDir(path, record, layers, heads)
    if (path / HEADS_FILE).is_file():
        run.tables.update(_read_table(path / HEADS_FILE, (), None, layers, heads))
    for name, (keys, values) in PROBE_TABLES.items():
        if (path / name).is_file():
            run.tables.update(_read_table(path / name, keys, values, layers, heads))
    if not run.tables:
        raise UserError(f"{path} has no per-head table ({HEADS_FILE} or a probe's): nothing to compare")
    if (path / EXAMPLES_FILE).is_file():
        run.examples = path / EXAMPLES_FILE
    return run


def _shape(record: dict, path: Path) -> tuple[int, int]:
    """layers x heads from run.json: the run's model, else a probe's."""
    models = [record.get("model")] + [p.get("model") for p in record["analyses"].values()]
    for m in models:
        if isinstance(m, dict) and isinstance(m.get("layers"), int) and isinstance(m.get("heads"), int):
            return m["layers"], m["heads"]
    raise UserError(f"{path / 'run.json'} does not say the model's layers and heads: is this a bertscope run?")


def _read_table(path: Path, keys: tuple[str, ...], values: tuple[str, ...] | None, layers: int, heads: int):
    """(source, statistic) -> (layers, H) array of one per-head CSV. Without `values`, every
    column but NOT_COMPARED is a statistic (heads.csv); with `keys`, the statistic's name
    carries the key values, e.g. accuracy[ewt/nsubj/dep->head]."""
    import numpy as np

    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        values = values or tuple(c for c in columns if c not in NOT_COMPARED)
        missing = [c for c in ("layer", "head", *keys, *values) if c not in columns]
        if missing:
            raise UserError(f"{path} lacks the column(s) {', '.join(missing)}")
        out: dict[tuple[str, str], np.ndarray] = {}
        try:
            for row in reader:
                l, h = int(row["layer"]) - 1, int(row["head"]) - 1
                if not (0 <= l < layers and 0 <= h < heads):
                    raise UserError(f"{path} has head {l + 1}-{h + 1}, outside the run's {layers} x {heads} heads")
                tag = "[" + "/".join(row[k] for k in keys) + "]" if keys else ""
                for c in values:
                    grid = out.setdefault((path.name, c + tag), np.full((layers, heads), np.nan))
                    grid[l, h] = float(row[c]) if row[c] not in ("", None) else np.nan
        except (ValueError, TypeError) as e:
            raise UserError(f"{path} is not a valid per-head table: {e}") from None
    return out


# ----------------------------------------------------------------------------- examples.parquet

@dataclass
class Segments:
    """The segments of one examples.parquet, sorted by segment index."""

    index: np.ndarray  # (N,) int64, sorted
    doc_id: np.ndarray  # (N,) object
    n_tokens: np.ndarray  # (N,) int64

    def same(self, other: Segments) -> bool:
        import numpy as np

        return (len(self.index) == len(other.index) and np.array_equal(self.index, other.index)
                and np.array_equal(self.doc_id, other.doc_id) and np.array_equal(self.n_tokens, other.n_tokens))


def _parquet(path: Path):
    # pyarrow here: it takes a second to import, and `bertscope --help` imports this module
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path} is not a readable Parquet file: {e}") from None


def read_segments(path: Path, layers: int, heads: int) -> Segments:
    """One streamed pass over the key columns, keeping the rows of head 1-1 only."""
    import numpy as np

    f = _parquet(path)
    need = ["segment", "doc_id", "n_tokens", "layer", "head"]
    missing = [c for c in need if c not in f.schema_arrow.names]
    if missing:
        raise UserError(f"{path} lacks the column(s) {', '.join(missing)}: not a bertscope examples.parquet")
    index, docs, ntok = [], [], []
    for batch in f.iter_batches(columns=need, batch_size=BATCH_ROWS):
        layer, head = batch.column("layer").to_numpy(), batch.column("head").to_numpy()
        if len(layer) and not (1 <= layer.min() and layer.max() <= layers and 1 <= head.min() and head.max() <= heads):
            raise UserError(f"{path} has heads outside the run's {layers} layers x {heads} heads")
        keep = (layer == 1) & (head == 1)
        index.append(batch.column("segment").to_numpy()[keep])
        docs.append(np.asarray(batch.column("doc_id").to_pylist(), dtype=object)[keep])
        ntok.append(batch.column("n_tokens").to_numpy()[keep])
    index = np.concatenate(index).astype(np.int64) if index else np.zeros(0, np.int64)
    order = np.argsort(index, kind="stable")
    seg = Segments(index[order], np.concatenate(docs)[order] if docs else np.zeros(0, object),
                   np.concatenate(ntok).astype(np.int64)[order] if ntok else np.zeros(0, np.int64))
    if len(seg.index) == 0 or np.any(np.diff(seg.index) == 0) or f.metadata.num_rows != len(seg.index) * layers * heads:
        raise UserError(f"{path} has {f.metadata.num_rows} rows for {len(seg.index)} segments, not one per "
                        f"segment x {layers} layers x {heads} heads")
    return seg


def read_examples(path: Path, columns: list[str], segments: Segments, layers: int, heads: int) -> dict[str, np.ndarray]:
    """column -> (N, layers, H) per-segment values, in `segments` order, streamed in batches."""
    import numpy as np

    f = _parquet(path)
    out = {c: np.full((len(segments.index), layers, heads), np.nan) for c in columns}
    for batch in f.iter_batches(columns=["segment", "layer", "head", *columns], batch_size=BATCH_ROWS):
        pos = np.searchsorted(segments.index, batch.column("segment").to_numpy())  # (rows,)
        l = batch.column("layer").to_numpy().astype(np.int64) - 1
        h = batch.column("head").to_numpy().astype(np.int64) - 1
        for c in columns:
            out[c][pos, l, h] = batch.column(c).to_numpy(zero_copy_only=False)
    return out


# ----------------------------------------------------------------------------- comparison

@dataclass
class Comparison:
    """Two runs' per-head tables side by side, with the test results where there are any.

    a, b, diff: (source, statistic) -> (layers, H); tests: (source, statistic) -> dict of
    (layers, H) arrays p, q, n_a, n_b (only statistics tested); test: the test's name
    (`stats_compare.PAIRED`/`UNPAIRED`) or None without per-example statistics in both.
    """

    run_a: RunDir
    run_b: RunDir
    a: dict
    b: dict
    diff: dict
    tests: dict
    test: str | None
    alpha: float
    only_a: list
    only_b: list
    segments: dict

    def rows(self) -> list[dict]:
        """The tidy table: one row per (source, statistic, layer, head)."""
        rows = []
        for key, d in self.diff.items():
            t = self.tests.get(key)
            for l in range(d.shape[0]):
                for h in range(d.shape[1]):
                    row = {"source": key[0], "statistic": key[1], "layer": l + 1, "head": h + 1,
                           "a": float(self.a[key][l, h]), "b": float(self.b[key][l, h]), "diff": float(d[l, h]),
                           "test": "", "n_a": "", "n_b": "", "p": "", "q": "", "significant": ""}
                    if t is not None:
                        row.update(test=self.test, n_a=int(t["n_a"][l, h]), n_b=int(t["n_b"][l, h]),
                                   p=float(t["p"][l, h]), q=float(t["q"][l, h]),
                                   significant=bool(t["q"][l, h] < self.alpha))
                    rows.append(row)
        return rows

    def significant(self) -> dict[str, int]:
        import numpy as np

        return {k[1]: int(np.sum(np.nan_to_num(t["q"], nan=1.0) < self.alpha)) for k, t in self.tests.items()}

    def summary(self, k: int = 3) -> str:
        """Terminal lines: the test used, then per statistic the k heads that changed most."""
        import numpy as np

        from bertscope.analyses.compare import stats as stats_compare

        Ly, H = self.run_a.layers, self.run_a.heads
        lines = [f"a = {self.run_a.describe()}", f"b = {self.run_b.describe()}",
                 f"{Ly} layers x {H} heads; diff = b - a; head = layer-head, from 1"]
        if self.test:
            lines.append(f"per-segment test: {stats_compare.TEST_NAMES[self.test]}, {self.segments['a']} vs "
                         f"{self.segments['b']} segments; Benjamini-Hochberg across the {Ly * H} heads of each "
                         f"statistic, significant: q < {self.alpha}")
        else:
            lines.append("no significance test: examples.parquet is missing from "
                         + ("both runs" if not (self.run_a.examples or self.run_b.examples) else "one run")
                         + " (bertscope run --per-example)")
        by_source: dict[str, list] = {}
        for key in self.diff:
            by_source.setdefault(key[0], []).append(key)
        for source, keys in by_source.items():
            lines.append(f"largest changes in {source}:")
            if source != HEADS_FILE:  # probe tables have many statistics: the k largest over all of them
                flat = [(abs(self.diff[key][l, h]), key, l, h) for key in keys
                        for l in range(Ly) for h in range(H) if np.nan_to_num(self.diff[key][l, h]) != 0]
                flat.sort(key=lambda x: -x[0])
                lines += [f"  {key[1]:<34} {l + 1}-{h + 1} ({self.diff[key][l, h]:+.3f})" for _, key, l, h in flat[:k]]
                continue
            for key in keys:
                t = self.tests.get(key)
                cells = []
                for l, h in stats_compare.top_changes(self.diff[key], k):
                    q = f", q={t['q'][l - 1, h - 1]:.2g}" if t is not None else ""
                    cells.append(f"{l}-{h} ({self.diff[key][l - 1, h - 1]:+.3f}{q})")
                sig = f"  [{self.significant()[key[1]]}/{Ly * H} significant]" if t is not None else ""
                lines.append(f"  {key[1]:<12} " + (", ".join(cells) or "no head changed") + sig)
        for which, names in (("a", self.only_a), ("b", self.only_b)):
            if names:
                lines.append(f"only in {which} (not compared): " + ", ".join(f"{s}:{n}" for s, n in names))
        return "\n".join(lines)


def compare_runs(a: str | Path | RunDir, b: str | Path | RunDir, test: str = "auto", alpha: float = 0.05,
                 memory_mb: int = 64) -> Comparison:
    """Compare two run directories. test: 'auto' (paired when both runs hold the same
    segments, else unpaired), 'paired' (refused when they do not) or 'unpaired'.
    memory_mb bounds the per-segment arrays of both runs held at once: as many statistics
    per pass over the files as fit (at least one)."""
    run_a = a if isinstance(a, RunDir) else load_run(a)
    run_b = b if isinstance(b, RunDir) else load_run(b)
    if (run_a.layers, run_a.heads) != (run_b.layers, run_b.heads):
        raise UserError(f"cannot compare {run_a.path} ({run_a.layers} layers x {run_a.heads} heads) with "
                        f"{run_b.path} ({run_b.layers} layers x {run_b.heads} heads): layer x head shapes differ")
    keys = [k for k in run_a.tables if k in run_b.tables]
    if not keys:
        raise UserError(f"{run_a.path} and {run_b.path} have no per-head statistic in common")
    va = {k: run_a.tables[k] for k in keys}
    vb = {k: run_b.tables[k] for k in keys}
    diff = {k: vb[k] - va[k] for k in keys}
    tests, name, segments = {}, None, {}
    if run_a.examples and run_b.examples:
        tests, name, segments = _test_heads(run_a, run_b, keys, test, memory_mb)
    elif test == "paired":
        raise UserError("--test paired needs examples.parquet in both runs (bertscope run --per-example)")
    return Comparison(run_a, run_b, va, vb, diff, tests, name, alpha,
                      [k for k in run_a.tables if k not in run_b.tables],
                      [k for k in run_b.tables if k not in run_a.tables], segments)


def _test_heads(run_a: RunDir, run_b: RunDir, keys: list, test: str, memory_mb: int):
    from bertscope.analyses.compare import stats as stats_compare

    Ly, H = run_a.layers, run_a.heads
    seg_a = read_segments(run_a.examples, Ly, H)
    seg_b = read_segments(run_b.examples, Ly, H)
    same = seg_a.same(seg_b)
    if test == "paired" and not same:
        raise UserError("--test paired needs the same segments in both runs (segment, doc_id and n_tokens); "
                        "these differ: use --test unpaired")
    paired = same and test != "unpaired"
    names_a = set(_parquet(run_a.examples).schema_arrow.names)
    names_b = set(_parquet(run_b.examples).schema_arrow.names)
    testable = [k for k in keys if k[0] == HEADS_FILE
                and EXAMPLE_NAME.get(k[1], k[1]) in names_a & names_b]
    per_pass = max(1, memory_mb * 2 ** 20 // (8 * (len(seg_a.index) + len(seg_b.index)) * Ly * H))
    tests = {}
    for i in range(0, len(testable), per_pass):
        chunk = testable[i:i + per_pass]
        cols = [EXAMPLE_NAME.get(k[1], k[1]) for k in chunk]
        xa = read_examples(run_a.examples, cols, seg_a, Ly, H)
        xb = read_examples(run_b.examples, cols, seg_b, Ly, H)
        for k, c in zip(chunk, cols):
            tests[k] = stats_compare.head_test(xa[c], xb[c], paired)
        del xa, xb
    name = stats_compare.PAIRED if paired else stats_compare.UNPAIRED
    return tests, name, {"a": len(seg_a.index), "b": len(seg_b.index), "paired": paired, "same_segments": same}


# ----------------------------------------------------------------------------- outputs

def figure_name(statistic: str) -> str:
    return FIGURE.format(statistic=statistic)


def write_comparison(comp: Comparison, out: str | Path | None = None, figures: bool = True,
                     k: int = 3) -> Path:
    """Write compare_heads.csv, one difference heatmap per heads.csv statistic and the
    `compare` entry of run.json into `out`: an existing run directory (one with run.json)
    gains them, any other path becomes a new directory (default runs/compare-<timestamp>)."""
    from bertscope.analyses.compare import stats as stats_compare
    from bertscope.report.writer import refresh_report

    t0 = time.perf_counter()
    out = Path(out) if out else Path("runs") / f"compare-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    existing = (out / "run.json").is_file()
    if not existing:
        out = new_run_dir(str(out))
        update_json(out / "run.json", lambda run: run.setdefault("compare", {}))
    write_csv(out / CSV_NAME, comp.rows(), COLUMNS)
    outputs = [CSV_NAME]
    if figures:
        # here: compare's plots import matplotlib at their top, and `bertscope --help` imports this module
        from bertscope.analyses.compare.plots import plot_diff

        for key, d in comp.diff.items():
            if key[0] != HEADS_FILE:
                continue
            t = comp.tests.get(key)
            caption = (f"Per-head change of {key[1]} (heads.csv), b - a, with a = {comp.run_a.path.name} and "
                       f"b = {comp.run_b.path.name}. Purple: higher in b, orange: lower, white: unchanged "
                       "(colour scale symmetric around 0). ")
            caption += (f"Framed: significant, q < {comp.alpha} ({stats_compare.TEST_NAMES[comp.test]} on per-segment "
                        "values, Benjamini-Hochberg across heads)." if t is not None else
                        "No test: per-example statistics are not in both runs.")
            plot_diff(d, out / figure_name(key[1]), f"{key[1]}: b - a", caption,
                      None if t is None else t["q"], comp.alpha)
            outputs.append(figure_name(key[1]))
    compare = {
        "command": " ".join(sys.argv),
        "status": "complete",
        "a": str(comp.run_a.path), "b": str(comp.run_b.path),
        "model_a": (comp.run_a.record.get("model") or {}).get("path"),
        "model_b": (comp.run_b.record.get("model") or {}).get("path"),
        "layers": comp.run_a.layers, "heads": comp.run_a.heads,
        "statistics": [f"{s}:{n}" for s, n in comp.diff],
        "test": comp.test, "test_description": stats_compare.TEST_NAMES.get(comp.test),
        "correction": "benjamini-hochberg across heads, per statistic" if comp.test else None,
        "alpha": comp.alpha, "segments": comp.segments, "significant": comp.significant(),
        "only_a": [f"{s}:{n}" for s, n in comp.only_a], "only_b": [f"{s}:{n}" for s, n in comp.only_b],
        "outputs": outputs, "elapsed_s": round(time.perf_counter() - t0, 2),
    }
    update_json(out / "run.json", lambda run: run.update(compare=compare))
    logger.info(comp.summary(k))
    logger.info(f"wrote {', '.join(outputs)} to {out}")

    refresh_report(out)
    return out


# ----------------------------------------------------------------------------- command line

HELP = "per-head differences between two runs of the same model shape, with significance tests"
DESCRIPTION = (
    "Compare two run directories head by head (pre-trained vs fine-tuned, two corpora, two checkpoints) on every "
    "per-head statistic both hold: heads.csv and the probes' per-head tables. Writes compare_heads.csv (source, "
    "statistic, layer, head, a, b, diff = b - a, and test, n_a, n_b, p, q, significant), one difference heatmap "
    "per heads.csv statistic, and a 'compare' entry in run.json; prints the heads that changed most. When both "
    "runs have examples.parquet (bertscope run --per-example), every head of every heads.csv statistic is tested "
    "on its per-segment values: Wilcoxon signed-rank when both runs hold the same segments (same segment, doc_id "
    "and n_tokens), Mann-Whitney U otherwise, with Benjamini-Hochberg across the heads of each statistic. "
    "Runs whose layer x head shapes differ are refused.")


def add_arguments(c):
    c.add_argument("run_a", metavar="RUN_A", help="first run directory (a)")
    c.add_argument("run_b", metavar="RUN_B", help="second run directory (b); differences are b - a")
    c.add_argument("--out", metavar="DIR", default=None,
                   help="output directory; an existing run directory gains the outputs "
                   "(default: runs/compare-<timestamp>)")
    c.add_argument("--test", choices=("auto", "paired", "unpaired"), default="auto",
                   help="auto: paired (Wilcoxon) when both runs hold the same segments, else unpaired "
                   "(Mann-Whitney U) (default: auto)")
    c.add_argument("--alpha", type=fraction, default=0.05,
                   help="false discovery rate: heads with BH-adjusted q below it are significant (default: 0.05)")
    c.add_argument("--top", type=int, default=3, metavar="K", help="heads listed per statistic (default: 3)")
    c.add_argument("--no-figures", action="store_true", help="skip the PNG heatmaps")
    add_quiet_argument(c)




def main(args) -> int:
    if args.out and not (Path(args.out) / "run.json").is_file():
        check_run_dir(args.out)  # a used directory that is not a run is refused before any work
    comp = compare_runs(args.run_a, args.run_b, test=args.test, alpha=args.alpha)
    write_comparison(comp, args.out, figures=not args.no_figures, k=args.top)
    return 0


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, it compares the outputs of
    earlier runs."""
    return {}
