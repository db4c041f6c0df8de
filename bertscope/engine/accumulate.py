"""Per-head sums of row statistics: the only state an analysis run keeps.

Everything is an additive float64 sum or count indexed by (layer, head, row group, ...),
so batches, resumed runs and processes merge exactly by addition, and no result depends
on batch size or padding (padding rows are weighted 0 by the row-group masks).

Row groups say which query rows a sum runs over: "all" valid tokens, then one group per
named key class (queries that *are* [CLS], [SEP], punctuation), then "non_sep" (every row
but [SEP]'s). That gives Clark et al.'s [CLS]-row entropy, [SEP]->[SEP] and
other->[SEP] masses without special cases.

Averaging (`average`): "tokens" weighs every query row 1, so a mean pools all tokens of
the corpus. "segments" weighs each row of group g in segment s by 1 / (rows of g in s) and
counts a segment once in `n_rows[g]` when it has rows of g: a mean is then the mean over
segments of the per-segment mean, as Clark et al.'s notebook computed it. Either way the
sums stay additive, so merging and resuming work the same.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from bertscope.engine.batch import BatchContext
from bertscope.kernels import StatsSpec
from bertscope.kernels.spec import SEGMENT_SUMS
from bertscope.run.rundir import write_npz
from bertscope.text.token_classes import TokenClasses

AVERAGES = ("tokens", "segments")
# one array per segment sum of the kernels' table (BatchContext.segment_sums name -> HeadStats array)
ARRAYS = ("n_rows", "n_tokens", "uniform_entropy_sum", *(m.array for m in SEGMENT_SUMS))


class HeadStats:
    """Additive accumulator of per-head row statistics over a corpus (an `Accumulator`).

    n_rows              (layers, G)          query rows seen per group (segments with such
                                             rows, with average="segments")
    n_tokens            (G,)                 query rows seen per group, never weighted
    uniform_entropy_sum (G,)                 sum over rows of ln(valid keys): the entropy a
                                             uniform head would have (Clark's Fig. 4 baseline)
    and one array per segment sum of the kernels' table (`bertscope.kernels.spec.ROW_STATS`):
    entropy_sum         (layers, H, G)       sum of row entropies (nats)
    offset_mass_sum     (layers, H, G, O)    sum of p_{i,i+o}
    class_mass_sum      (layers, H, G, C)    sum of mass on each key class
    argmax_offset_count (layers, H, G, O+1)  rows whose argmax is at offset o; last: elsewhere
    argmax_class_count  (layers, H, G, C)    rows whose argmax key is of class c

    `classes` is a `TokenClasses` scheme, or bare class names (every class but the last
    catch-all then gets a row group, as the vocabulary scheme does).
    """

    def __init__(self, n_layers: int, n_heads: int, spec: StatsSpec, classes, average: str = "tokens"):
        classes = TokenClasses.of(classes)
        if classes.n_classes != spec.n_key_classes:
            raise ValueError("one class name per key class")
        if average not in AVERAGES:
            raise ValueError(f"average must be one of {', '.join(AVERAGES)}, not {average!r}")
        self.n_layers, self.n_heads, self.spec, self.classes, self.average = n_layers, n_heads, spec, classes, average
        self.class_names = classes.names
        self.group_names = classes.group_names
        Ly, H, G, O, C = n_layers, n_heads, len(self.group_names), len(spec.offsets), spec.n_key_classes
        self.n_rows = np.zeros((Ly, G))
        self.n_tokens = np.zeros(G)
        self.uniform_entropy_sum = np.zeros(G)
        width = {"O": O, "O+1": O + 1, "C": C}  # the table's symbolic widths
        for m in SEGMENT_SUMS:  # entropy_sum (layers, H, G), offset_mass_sum (layers, H, G, O), ...
            setattr(self, m.array, np.zeros((Ly, H, G, *(width[d] for d in m.width))))
        self.n_segments = 0
        # batches of the engine's plan these sums cover: saved in the same file as the sums,
        # so a checkpoint is one atomic write and a resumed run can never count a batch twice
        self.batches_done = 0

    # -- filling

    def add(self, batch: BatchContext):
        """Fold every layer of one batch into the sums: the per-segment sums, added up, or
        (average="segments") each divided by its segment's rows of the group first."""
        rows = batch.group_rows  # (B, G) rows of each group in each segment
        self.n_tokens += rows.sum(0).cpu().numpy()
        if self.average == "segments":  # each segment's rows of a group weigh 1 in all
            weight = 1 / rows.clamp_min(1)  # (B, G)
            counted = (rows > 0).double().sum(0).cpu().numpy()  # (G,) segments with such rows
        else:
            weight = torch.ones_like(rows)
            counted = rows.sum(0).cpu().numpy()  # (G,) the same for every layer
        log_len = torch.log(batch.n_tokens.double().clamp_min(1))  # (B,)
        self.uniform_entropy_sum += (log_len[:, None] * rows * weight).sum(0).cpu().numpy()
        self.n_segments += batch.size
        w = weight[:, None, :, None]  # (B, 1, G, 1)
        for layer in range(len(batch.layers)):
            self.n_rows[layer] += counted
            for m in SEGMENT_SUMS:
                s = batch.segment_sums(layer).get(m.name)  # (B, H, G, F)
                if s is not None:
                    total = getattr(self, m.array)[layer]
                    total += (s * w).sum(0).reshape(total.shape).cpu().numpy()

    # -- combining and storing

    def merge(self, other: HeadStats) -> HeadStats:
        """Add another accumulator's sums into this one (another batch, run or process)."""
        if self.meta() != other.meta():
            raise ValueError("cannot merge statistics of different models or specs")
        for name in ARRAYS:
            getattr(self, name).__iadd__(getattr(other, name))
        self.n_segments += other.n_segments
        return self

    def meta(self) -> dict:
        return {
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "offsets": list(self.spec.offsets),
            "class_names": list(self.class_names),
            "row_groups": list(self.classes.row_groups),
            "class_source": self.classes.source,
            "entropy": self.spec.entropy,
            "argmax": self.spec.argmax,
            "average": self.average,
        }

    def save(self, path: Path):
        """Write all sums to an .npz atomically (a crash mid-write leaves the old file)."""
        write_npz(path, meta=json.dumps(self.meta()), n_segments=self.n_segments, batches_done=self.batches_done,
                  **{name: getattr(self, name) for name in ARRAYS})

    @classmethod
    def load(cls, path: Path) -> HeadStats:
        with np.load(path) as f:
            meta = json.loads(str(f["meta"]))
            spec = StatsSpec(offsets=tuple(meta["offsets"]), n_key_classes=len(meta["class_names"]),
                             entropy=meta["entropy"], class_mass=True, argmax=meta["argmax"])
            names = tuple(meta["class_names"])
            classes = TokenClasses(names, tuple(meta["row_groups"]), meta["class_source"]) if "row_groups" in meta \
                else TokenClasses.of(names)
            acc = cls(meta["n_layers"], meta["n_heads"], spec, classes, meta.get("average", "tokens"))
            for name in ARRAYS:
                if name not in f or getattr(acc, name).shape != f[name].shape:
                    raise ValueError(f"{path} has no {name} of shape {getattr(acc, name).shape}: "
                                     "written by another bertscope version")
                getattr(acc, name)[...] = f[name]
            acc.n_segments = int(f["n_segments"])
            acc.batches_done = int(f["batches_done"])
        return acc

    # -- reading

    def uniform_entropy(self, group: str = "all") -> float:
        """Mean entropy of uniform attention over the same rows: the "no preference" line."""
        gi = self.group_names.index(group)
        n = self.n_rows[0, gi]
        return float(self.uniform_entropy_sum[gi] / n) if n > 0 else 0.0

    def mean(self, name: str, group: str = "all") -> np.ndarray:
        """Mean per row of a sum over the rows of `group`: shape (layers, H, ...); 0 where no rows."""
        gi = self.group_names.index(group)
        total = getattr(self, name)[:, :, gi]  # (layers, H, ...)
        n = self.n_rows[:, gi].reshape((-1, 1) + (1,) * (total.ndim - 2))
        return np.divide(total, n, out=np.zeros_like(total), where=n > 0)


