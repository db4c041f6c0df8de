"""Per-example statistics: one row per (segment, layer, head), streamed to Parquet.

Kovaleva et al. classify the attention map of every (example, head) into a pattern type,
and compare heads before and after fine-tuning example by example: corpus means are not
enough. `PerExampleWriter` is an `Accumulator` that turns each batch's per-segment sums
(`BatchContext.segment_sums`, the same sums `HeadStats` adds up) into per-segment means and
writes them as Parquet parts while the corpus streams by: memory holds at most one
checkpoint's worth of rows, whatever the corpus size.

Columns (every mass a mean over the segment's valid query rows, like heads.csv):
    segment, document, doc_id   the segment's index in the run's stream (the order segments
                                are drawn in), its document's index in the corpus (a text
                                file: the n-th non-blank line), its id
    layer, head                 from 1
    n_tokens                    valid tokens of the segment (the rows averaged)
    prev, self, next, offset_k  mass at relative offsets
    <class>                     mass on each key class (cls, sep, punct, other by default)
    entropy                     row entropy, nats
    n_<g>, <g>_<class>, <g>_entropy
                                the same over the rows of each row group g only (e.g.
                                sep_sep, cls_entropy); NaN when the segment has no such row
    argmax_*                    share of rows whose argmax is at an offset / of a class
                                (spec.argmax)
    prev_norm, <class>_norm, weighted_norm
                                the norm-based twins (spec.norms, Kobayashi et al. 2020,
                                docs/norms.md), as in heads.csv: each offset's and each class's
                                share of the row's sum_j p_ij ||f(x_j)||, and that sum itself
    column_max, column_argmax   the largest attention mass a key receives, as a share of
                                all rows' mass, and that key's position (spec.column_mass):
                                Kovaleva et al.'s "vertical" stripes
Averaged over segments with weights n_tokens (n_<g> for group columns), the rows give back
heads.csv exactly (`bertscope.engine.head_table`). `bertscope run --per-example` writes them, and so does
the notebook API's `Scope.per_example`.

A model whose attention is not plain (a decoder; any layer's `RowStats.layout`) adds
    uniform_entropy             mean over the segment's rows of ln n_visible(i), the entropy of
                                uniform attention over the keys each row sees (that layer's)
    kl_uniform                  uniform_entropy - entropy (with spec.entropy), as in heads.csv
and its column_max is the largest *mean* attention a key receives from the rows that see it
(column mass / n_seeing, `kernels.visible_counts`): under a causal mask the first token is
seen by every row and the last by one, so a share of all rows' mass would favour early keys
by construction. Under a causal mask, as in heads.csv (`head_table.layout_table`), the columns
that are 0 by construction are left out: next and positive offsets, the first token's row
group (it sees one key: n_cls 1, entropy 0, all its mass on itself), and, when `finish` finds
no token of the corpus in a class (a decoder tokenizer's [SEP]), that class's columns and
its row groups; cls is renamed first (the first real token, BOS where the tokenizer adds one).

Parts are named by rank and the batches they cover, so a resumed run drops the parts
beyond its checkpoint, torchrun ranks write side by side, and `finish` streams every part
into one `examples.parquet` (rows in batch order; sort by `segment` when needed), named in
`bertscope.analyses.surface.outputs`.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq
import torch

from bertscope.engine.batch import BatchContext
from bertscope.files import atomic_write
from bertscope.kernels.spec import STAT, StatsSpec, visible_counts
from bertscope.text.token_classes import TokenClasses

PART = re.compile(r"part-r(\d+)-b(\d+)-(\d+)\.parquet$")


# the segment sums of examples.parquet's columns, in the file's order (`column_names`): a file format, which
# is why it is written out and not in the table's order (tests/kernels/test_stats_table.py names it so)
EXAMPLE_SUMS = ("offset_mass", "class_mass", "entropy", "argmax_offset", "argmax_class", "offset_mass_norm",
                "class_mass_norm", "weighted_norm")


def offset_name(o: int) -> str:
    return {-1: "prev", 0: "self", 1: "next"}.get(o, f"offset_{o:+d}")


def stat_columns(spec: StatsSpec, classes: TokenClasses) -> list[str]:
    """The statistic columns, in the order `example_rows` fills them."""
    return column_names(spec, classes)


def column_names(spec: StatsSpec, classes: TokenClasses, causal: bool = False) -> list[str | None]:
    """`stat_columns`, or for a causal model the same list with None for each column left out (the
    first token's row group, positive offsets) and cls named first; one entry per column of
    `example_rows`, which a decoder's rows follow with uniform_entropy."""
    def cls_name(c):
        return "first" if causal and c == "cls" else c

    cols = []
    for g in classes.group_names:
        pre = "" if g == "all" else f"{g}_"
        drop = causal and g == "cls"  # the first token's rows: one visible key, nothing to read
        group = []
        if g != "all":
            group.append(f"n_{g}")
        group += [pre + offset_name(o) if not (causal and o > 0) else None for o in spec.offsets]
        if spec.class_mass:
            group += [pre + cls_name(c) for c in classes.names]
        if spec.entropy:
            group.append(pre + "entropy")
        if spec.argmax:
            group += [pre + "argmax_" + offset_name(o) if not (causal and o > 0) else None for o in spec.offsets]
            group += [pre + "argmax_elsewhere"] + [pre + "argmax_" + cls_name(c) for c in classes.names]
        if STAT["offset_mass_norm"].asked(spec):  # the norm-based twins (spec.norms), as heads.csv names them
            group += [pre + offset_name(o) + "_norm" if not (causal and o > 0) else None for o in spec.offsets]
        if STAT["class_mass_norm"].asked(spec):
            group += [pre + cls_name(c) + "_norm" for c in classes.names]
        if STAT["weighted_norm"].asked(spec):
            group.append(pre + "weighted_norm")
        cols += [None] * len(group) if drop else group
    if spec.column_mass:
        cols += ["column_max", "column_argmax"]
    return cols


def example_rows(batch: BatchContext) -> np.ndarray:
    """(B, layers, H, K) float64 statistic columns of every segment, layer and head."""
    rows = batch.group_rows  # (B, G)
    out = []
    for layer, stats in enumerate(batch.layers):
        sums = batch.segment_sums(layer)  # name -> (B, H, G, F)
        B, H = batch.size, next(iter(sums.values())).shape[1]
        n = rows[:, None, :, None].expand(B, H, -1, 1)  # (B, H, G, 1)
        parts = [sums[name] for name in EXAMPLE_SUMS if name in sums]
        means = torch.cat(parts, dim=-1) / n  # (B, H, G, F); NaN for a group without rows
        per_group = [torch.cat([n[:, :, g], means[:, :, g]], -1) if g else means[:, :, g]
                     for g in range(rows.shape[1])]  # group 0 ("all") has no row-count column
        cols = torch.cat(per_group, dim=-1)  # (B, H, K')
        if stats.column_mass is not None:
            if stats.layout.is_plain:  # a share of all rows' mass
                share = stats.column_mass.double() / batch.n_tokens[:, None, None].clamp_min(1)  # (B, H, L)
            else:  # the mean over the rows that see each key
                n_seeing = visible_counts(batch.key_valid, stats.layout)[1]  # (B, L)
                share = stats.column_mass.double() / n_seeing[:, None, :].clamp_min(1)  # (B, H, L)
            share = share.masked_fill(~batch.key_valid[:, None, :], -1.0)
            best, where = share.max(-1)  # (B, H)
            cols = torch.cat([cols, best[..., None], where[..., None].double()], dim=-1)
        if not all(other.layout.is_plain for other in batch.layers):  # a decoder's: its rows' uniform baseline
            n_visible = visible_counts(batch.key_valid, stats.layout)[0].double()  # (B, L)
            baseline = torch.log(n_visible.clamp_min(1)).sum(-1) / batch.n_tokens.clamp_min(1)  # (B,)
            cols = torch.cat([cols, baseline[:, None, None].expand(B, H, 1).to(cols.dtype)], dim=-1)
        out.append(cols)
    return torch.stack(out, dim=1).cpu().numpy()  # (B, layers, H, K)


class PerExampleWriter:
    """Accumulator writing per-example rows as Parquet parts under `directory`. A row's
    `document` is its segment's `Segment.document` (the segment index where that is unset)."""

    def __init__(self, directory: Path, spec: StatsSpec, classes: TokenClasses, rank: int = 0):
        self.directory, self.spec, self.classes, self.rank = Path(directory), spec, classes, rank
        self.columns = stat_columns(spec, classes)
        self.keep = None  # a decoder's: the indices of example_rows' columns it writes (see `_layout_columns`)
        self.batches_done = 0
        self._flushed = 0  # batches already in part files
        self._pending: list[pa.RecordBatch] = []

    # -- filling

    def _layout_columns(self, batch: BatchContext):
        """A decoder's columns, from its first batch: those of `column_names`, then uniform_entropy."""
        causal = any(layer.layout.causal for layer in batch.layers)
        names = column_names(self.spec, self.classes, causal) + ["uniform_entropy"]
        self.keep = [k for k, name in enumerate(names) if name is not None]
        self.columns = [names[k] for k in self.keep] + (["kl_uniform"] if self.spec.entropy else [])

    def add(self, batch: BatchContext):
        values = example_rows(batch)  # (B, layers, H, K)
        if self.keep is None and not all(layer.layout.is_plain for layer in batch.layers):
            self._layout_columns(batch)
        if self.keep is not None:
            values = values[..., self.keep]
            if self.spec.entropy:  # kl_uniform = uniform_entropy - entropy, as in heads.csv
                at = self.columns.index
                values = np.concatenate([values, values[..., at("uniform_entropy"), None]
                                         - values[..., at("entropy"), None]], axis=-1)
        B, Ly, H, K = values.shape
        index = np.asarray(batch.indices)
        docs = np.asarray([i if s.document is None else s.document for i, s in zip(batch.indices, batch.segments)])
        rep = Ly * H
        arrays = {
            "segment": pa.array(np.repeat(index, rep).astype(np.int64)),
            "document": pa.array(np.repeat(docs, rep).astype(np.int64)),
            "doc_id": pa.array(np.repeat(np.array([s.doc_id for s in batch.segments], dtype=object), rep)),
            "layer": pa.array(np.tile(np.repeat(np.arange(1, Ly + 1, dtype=np.int16), H), B)),
            "head": pa.array(np.tile(np.arange(1, H + 1, dtype=np.int16), B * Ly)),
            "n_tokens": pa.array(np.repeat(batch.n_tokens.cpu().numpy(), rep).astype(np.int32)),
        }
        flat = values.reshape(B * rep, K)
        for k, name in enumerate(self.columns):
            col = flat[:, k]
            if name.startswith("n_") or name == "column_argmax":
                arrays[name] = pa.array(col.astype(np.int32))
            else:
                arrays[name] = pa.array(col)
        self._pending.append(pa.RecordBatch.from_pydict(arrays))

    # -- storing

    def save(self, directory: Path | None = None):
        """Write the rows since the last save as one part, atomically (tmp name, then rename)."""
        if not self._pending:
            return
        directory = Path(directory or self.directory)
        directory.mkdir(parents=True, exist_ok=True)
        name = f"part-r{self.rank:03d}-b{self._flushed + 1:06d}-{self.batches_done:06d}.parquet"
        atomic_write(directory / name, lambda tmp: pq.write_table(pa.Table.from_batches(self._pending), tmp))
        self._pending, self._flushed = [], self.batches_done

    @classmethod
    def load(cls, directory: Path, spec: StatsSpec, classes: TokenClasses, rank: int = 0):
        """A writer that continues after the parts this rank already wrote."""
        acc = cls(directory, spec, classes, rank)
        ends = [last for r, _, last in _parts(acc.directory) if r == rank]
        acc.batches_done = acc._flushed = max(ends, default=0)
        return acc

    def rewind(self, batches_done: int):
        """Drop this rank's parts beyond `batches_done` (a crash fell between two saves)."""
        for path in sorted(self.directory.glob("part-*.parquet")):
            r, first, last = _parse(path)
            if r != self.rank or last <= batches_done:
                continue
            if first <= batches_done:
                raise ValueError(f"{path.name} straddles the checkpoint after batch {batches_done}")
            path.unlink()
        self.batches_done = self._flushed = min(self.batches_done, batches_done)

    def merge(self, other: PerExampleWriter) -> PerExampleWriter:
        """Parts of several ranks live in one directory: merging is `finish` reading them all."""
        if other.columns != self.columns:
            raise ValueError("cannot merge per-example rows of different specs")
        return self

    def finish(self, path: Path) -> int:
        """Stream every part of every rank into one Parquet file, then remove the parts;
        returns the number of rows."""
        parts = sorted(self.directory.glob("part-*.parquet"), key=lambda p: (_parse(p)[1], _parse(p)[0]))
        if not parts:
            return 0
        n = 0
        absent = absent_class_columns(parts, self.classes)

        def write(tmp: Path):
            nonlocal n
            writer = None
            try:
                for part in parts:
                    table = pq.read_table(part)
                    if absent:
                        table = table.drop_columns(absent)
                    writer = writer or pq.ParquetWriter(tmp, table.schema)
                    writer.write_table(table)
                    n += table.num_rows
            finally:
                if writer is not None:
                    writer.close()
        atomic_write(path, write)
        for part in parts:
            part.unlink()
        if not any(self.directory.iterdir()):
            self.directory.rmdir()
        return n


def absent_class_columns(parts: list[Path], classes: TokenClasses) -> list[str]:
    """A decoder's columns (its parts have uniform_entropy) of the row-group classes no segment has a
    token of (a tokenizer without [SEP]): the class's mass (0 everywhere) and its norm-based twin, its row
    group's columns (NaN everywhere), and its complement group's, which is then every row again. [] for an
    encoder."""
    if not parts or "uniform_entropy" not in pq.read_schema(parts[0]).names:
        return []
    names = pq.read_schema(parts[0]).names
    counts = [f"n_{c}" for c in classes.row_groups if f"n_{c}" in names and not c.startswith("non_")]
    seen = {c: False for c in counts}
    for part in parts:
        table = pq.read_table(part, columns=counts)
        for c in counts:
            seen[c] = seen[c] or bool(pa.compute.max(table[c]).as_py() or 0)
    out = []
    for count, was in seen.items():
        c = count[2:]
        if was:
            continue
        groups = (c, f"non_{c}")
        out += [n for n in names if n in (f"n_{c}", f"n_non_{c}") or n.startswith(tuple(g + "_" for g in groups))
                or n in (c, f"{c}_norm") or n.endswith(("_" + c, "argmax_" + c, f"_{c}_norm"))]
    return list(dict.fromkeys(out))


def _parse(path: Path) -> tuple[int, int, int]:
    m = PART.search(path.name)
    return int(m[1]), int(m[2]), int(m[3])


def _parts(directory: Path):
    return [_parse(p) for p in directory.glob("part-*.parquet")] if directory.is_dir() else []
