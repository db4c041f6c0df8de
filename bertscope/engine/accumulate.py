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

Decoders (any layer whose `AttentionLayout` is not plain: causal, windowed, grouped-query) see
different numbers of keys in different rows: row i of a causal layer sees i + 1 keys, of a
windowed one at most the window. Their uniform baseline is then per row, ln n_visible(i), and
per layer (Gemma-3 alternates windowed and global layers), so the accumulator also sums, per
layer and row group, ln n_visible(i) and n_visible(i) over the rows (`visible_entropy_sum`,
`n_visible_sum`, from `kernels.visible_counts`: O(L) per segment, no map). An encoder's
accumulator never holds them: its sums, and the file it saves, are what they always were.

Where the sums live. The arrays are numpy float64 on the host, and that is what every reader
gets (`hs.entropy_sum`, `save`, `merge`, `all_reduce_stats`). `add` never copies a batch to the
host: on the CPU it adds in place into those very arrays (through `torch.from_numpy`, the same
float64 additions in the same order as numpy's `+=`, so the sums are what they always were);
on a GPU it adds into float64 sums on the device, which reach the host arrays (added to them)
only when an array is read: a checkpoint, a merge, the results. A forward pass on a GPU then
never waits for the host between batches.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from bertscope.engine.batch import BatchContext
from bertscope.files import write_npz
from bertscope.kernels.spec import (
    ROW_STATS,
    SEGMENT_SUMS,
    AttentionLayout,
    StatsSpec,
    token_relation_rows,
    visible_counts,
)
from bertscope.text.token_classes import TokenClasses

AVERAGES = ("tokens", "segments")
# the arrays every accumulator holds
COUNTS = ("n_rows", "n_tokens", "uniform_entropy_sum")
# and one array per segment sum of the kernels' table (BatchContext.segment_sums name -> HeadStats
# array): every array a HeadStats may hold; one holds those of the statistics its spec asks for
ARRAYS = (*COUNTS, *(m.array for m in SEGMENT_SUMS))
# the statistic of the table each sum array adds up (entropy_sum -> entropy, ...)
STAT_OF_ARRAY = {m.array: s for s in ROW_STATS for m in s.sums}


def _json_value(value):
    """A StatsSpec switch as JSON holds it: a tuple as a list."""
    return list(value) if isinstance(value, tuple) else value


class NotComputedError(LookupError):
    """A statistic the run's spec did not ask for: it was never computed, so it has no value
    (never a measured 0)."""
# sums a decoder's accumulator holds beside them (`HeadStats.layouts` not None), (layers, G) each
LAYOUT_ARRAYS = ("visible_entropy_sum", "n_visible_sum")
# the token relations of the table (its switch token_relations), in its order, which is the order
# `token_relation_rows` gives their rows in: each one's sum array and the rows that have a key for it,
# (layers, G), over which `HeadStats.token_relation_means` averages it (duplicate_mass -> duplicate_rows)
TOKEN_RELATIONS = {s.name: (s.sums[0].array, f"{s.name.removesuffix('_mass')}_rows")
                   for s in ROW_STATS if s.switch == "token_relations"}
TOKEN_ARRAYS = tuple(rows for _, rows in TOKEN_RELATIONS.values())
# the StatsSpec switches a HeadStats file records: those of the statistics that feed its sums (the table's
# `sums`); the ones of entries marked `meta` always (older files wrote them), the others only when on (a file
# written before they existed reads as off)
META_ALWAYS = tuple(dict.fromkeys(s.switch for s in ROW_STATS if s.meta))
META_WHEN_ON = tuple(dict.fromkeys(s.switch for s in ROW_STATS if s.sums and not s.meta and s.twin_of is None
                                   and s.switch != "offsets"))


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
    streaming_error_sq_sum (layers, H, G)    sum of ||o_i - o_L,i||^2 (spec.streaming: (sink, recent))
    output_sq_sum       (layers, H, G)       sum of ||o_i||^2; `streaming_error` reads the two
    and, once a layer's attention is not plain (a decoder: `layouts` is then one
    `AttentionLayout` per layer, else None):
    visible_entropy_sum (layers, G)          sum over rows of ln n_visible(i): each row's own
                                             uniform baseline (what uniform_entropy_sum is for
                                             an encoder, whose rows all see every token)
    n_visible_sum       (layers, G)          sum over rows of n_visible(i), the keys each row sees
    and, with spec.token_relations (beside duplicate_mass_sum and prefix_match_mass_sum, (layers, H, G)):
    duplicate_rows      (layers, G)          rows with at least one visible earlier copy of their
                                             token (`kernels.spec.token_relation_rows`: exact from the
                                             ids and each layer's layout, the same for every head)
    prefix_match_rows   (layers, G)          rows with at least one visible key right after one
    so that `token_relation_means` is each head's mean mass over the rows that could put any there
    (a row with no such key has 0 mass anyway).
    With spec.norms, the norm-based twins' sums too (docs/norms.md): offset_mass_norm_sum, class_mass_norm_sum,
    duplicate_mass_norm_sum, prefix_match_mass_norm_sum (the shapes of their bases) and weighted_norm_sum
    (layers, H, G); `norm_mean` reads them, NaN where not computed.

    Missing, never 0: the array of a statistic the spec did not ask for (entropy_sum without
    `entropy`, offset_mass_sum with no `offsets`, class_mass_sum without `class_mass`, the argmax
    counts without `argmax`) is None, fresh and after `save`/`load` alike: it is not allocated,
    not in `arrays` (so not merged, reduced or saved), and `mean` of it raises `NotComputedError`.

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
        self._host: dict[str, np.ndarray] = {}  # every array, on the host (what readers get)
        self._device: dict[str, torch.Tensor] = {}  # sums on a GPU not yet added to the host arrays
        Ly, H, G, O, C = n_layers, n_heads, len(self.group_names), len(spec.offsets), spec.n_key_classes
        self.n_rows = np.zeros((Ly, G))
        self.n_tokens = np.zeros(G)
        self.uniform_entropy_sum = np.zeros(G)
        width = {"O": O, "O+1": O + 1, "C": C}  # the table's symbolic widths
        for m in SEGMENT_SUMS:  # entropy_sum (layers, H, G), offset_mass_sum (layers, H, G, O), ...; None: not asked
            asked = STAT_OF_ARRAY[m.array].asked(spec)
            setattr(self, m.array, np.zeros((Ly, H, G, *(width[d] for d in m.width))) if asked else None)
        for name in TOKEN_ARRAYS:
            setattr(self, name, np.zeros((Ly, G)) if spec.token_relations else None)
        self.layouts: list[AttentionLayout] | None = None  # set by the first batch of a decoder
        self.n_segments = 0
        # batches of the engine's plan these sums cover: saved in the same file as the sums,
        # so a checkpoint is one atomic write and a resumed run can never count a batch twice
        self.batches_done = 0

    # -- filling

    def add(self, batch: BatchContext):
        """Fold every layer of one batch into the sums: the per-segment sums, added up, or
        (average="segments") each divided by its segment's rows of the group first. Nothing is
        copied to the host (see the module docstring)."""
        device = batch.key_valid.device
        rows = batch.group_rows  # (B, G) rows of each group in each segment
        self._sum("n_tokens", device).add_(rows.sum(0))
        if self.average == "segments":  # each segment's rows of a group weigh 1 in all
            weight = 1 / rows.clamp_min(1)  # (B, G)
            counted = (rows > 0).double().sum(0)  # (G,) segments with such rows
        else:
            weight = torch.ones_like(rows)
            counted = rows.sum(0)  # (G,) the same for every layer
        log_len = torch.log(batch.n_tokens.double().clamp_min(1))  # (B,)
        self._sum("uniform_entropy_sum", device).add_((log_len[:, None] * rows * weight).sum(0))
        self.n_segments += batch.size
        w = weight[:, None, :, None]  # (B, 1, G, 1)
        if any(not stats.layout.is_plain for stats in batch.layers):
            self._add_visible(batch, weight)
        if self.spec.token_relations:
            self._add_token_rows(batch, weight)
        self._sum("n_rows", device)[:len(batch.layers)].add_(counted)  # (layers, G): one add per layer
        computed = [m for m in SEGMENT_SUMS if self._host.get(m.array) is not None]  # the spec's (the others: None)
        sums = {m.array: self._sum(m.array, device) for m in computed}
        for layer in range(len(batch.layers)):
            for m in computed:
                s = batch.segment_sums(layer).get(m.name)  # (B, H, G, F)
                if s is not None:
                    total = sums[m.array][layer]
                    total.add_((s * w).sum(0).reshape(total.shape))

    def _add_visible(self, batch: BatchContext, weight: torch.Tensor):
        """A decoder's per-layer sums of ln n_visible(i) and n_visible(i) over each group's rows."""
        layouts = [stats.layout for stats in batch.layers]
        if self.layouts is None:
            self.init_layouts(layouts)
        elif layouts != self.layouts:
            raise ValueError("the layers' attention layouts changed between batches")
        device = batch.key_valid.device
        log_sums, n_sums = self._sum("visible_entropy_sum", device), self._sum("n_visible_sum", device)
        groups = batch.row_groups * weight[:, None, :]  # (B, L, G) rows of each group, weighted
        cache = {}
        for layer, layout in enumerate(layouts):
            if layout not in cache:  # layers of the same layout (every global one) share the counts
                n_visible = visible_counts(batch.key_valid, layout)[0].double()  # (B, L)
                cache[layout] = (torch.einsum("bl,blg->g", torch.log(n_visible.clamp_min(1)), groups),
                                 torch.einsum("bl,blg->g", n_visible, groups))
            log_sum, n_sum = cache[layout]
            log_sums[layer].add_(log_sum)
            n_sums[layer].add_(n_sum)

    def _add_token_rows(self, batch: BatchContext, weight: torch.Tensor):
        """Per layer, the rows of each group that have a key for each token relation (`TOKEN_ARRAYS`)."""
        if batch.token_ids is None:
            raise ValueError("spec.token_relations needs the batch's token ids (BatchContext.token_ids)")
        device = batch.key_valid.device
        sums = [self._sum(name, device) for name in TOKEN_ARRAYS]
        groups = batch.row_groups * weight[:, None, :]  # (B, L, G)
        cache = {}
        for layer, stats in enumerate(batch.layers):
            if stats.layout not in cache:  # layers of the same layout share the rows
                rows = token_relation_rows(batch.token_ids, batch.key_valid, stats.layout)  # (B, L) each
                cache[stats.layout] = [torch.einsum("bl,blg->g", r.double(), groups) for r in rows]
            for total, add in zip(sums, cache[stats.layout]):
                total[layer].add_(add)

    # device types whose sums `add` adds straight into the host arrays (they share the memory)
    HOST_DEVICES = ("cpu",)

    def _sum(self, name: str, device: torch.device) -> torch.Tensor:
        """The float64 tensor `add` adds `name`'s sums into on `device`: on the CPU the host array
        itself (shared memory), elsewhere a sum on the device that reaches the host when read."""
        if device.type in self.HOST_DEVICES:
            return torch.from_numpy(self._host[name])
        if name not in self._device:
            self._device[name] = torch.zeros(self._host[name].shape, dtype=torch.float64, device=device)
        return self._device[name]

    def _to_host(self):
        """Add the sums still on a device into the host arrays (the only device-to-host copies)."""
        if self._device:
            pending, self._device = self._device, {}
            for name, t in pending.items():
                self._host[name] += t.cpu().numpy()

    def init_layouts(self, layouts):
        """Make this a decoder's accumulator: one `AttentionLayout` per layer, zero visible sums."""
        if len(layouts) != self.n_layers:
            raise ValueError(f"{len(layouts)} layouts for {self.n_layers} layers")
        self.layouts = list(layouts)
        for name in LAYOUT_ARRAYS:
            setattr(self, name, np.zeros((self.n_layers, len(self.group_names))))

    @property
    def arrays(self) -> tuple[str, ...]:
        """The names of the sums this accumulator holds: the counts, the sums of the statistics its
        spec asks for (`computed`) and a decoder's visible sums."""
        return (COUNTS + self.computed + (TOKEN_ARRAYS if self.spec.token_relations else ())
                + (LAYOUT_ARRAYS if self.layouts is not None else ()))

    @property
    def computed(self) -> tuple[str, ...]:
        """The sum arrays of the statistics the spec asks for, in the table's order; the others are None."""
        return tuple(m.array for m in SEGMENT_SUMS if STAT_OF_ARRAY[m.array].asked(self.spec))

    @property
    def causal(self) -> bool:
        """Whether any layer is causal (a decoder): its rows see no key after themselves."""
        return self.layouts is not None and any(layout.causal for layout in self.layouts)

    # -- combining and storing

    def merge(self, other: HeadStats) -> HeadStats:
        """Add another accumulator's sums into this one (another batch, run or process)."""
        if self.layouts is None and other.layouts is not None:  # one that has seen no batch yet
            self.init_layouts(other.layouts)
        elif other.layouts is None and self.layouts is not None and other.batches_done == 0:
            other = HeadStats(other.n_layers, other.n_heads, other.spec, other.classes, other.average)
            other.init_layouts(self.layouts)
        if self.meta() != other.meta():
            raise ValueError("cannot merge statistics of different models or specs")
        for name in self.arrays:
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
            **{switch: getattr(self.spec, switch) for switch in META_ALWAYS},
            "average": self.average,
            # only when asked (`META_WHEN_ON`): an older meta (and file) stays what it was
            **{switch: _json_value(value) for switch in META_WHEN_ON if (value := getattr(self.spec, switch))},
            # a decoder's only: an encoder's meta (and file) stays what it was
            **({"layouts": [layout_dict(layout) for layout in self.layouts]} if self.layouts is not None else {}),
        }

    def save(self, path: Path):
        """Write all sums to an .npz atomically (a crash mid-write leaves the old file); a statistic
        the spec did not ask for has no array in it (`load` gives it None again)."""
        write_npz(path, meta=json.dumps(self.meta()), n_segments=self.n_segments, batches_done=self.batches_done,
                  **{name: getattr(self, name) for name in self.arrays})

    @classmethod
    def load(cls, path: Path) -> HeadStats:
        """The accumulator `save` wrote. A file of a version that saved every array (zeros for what
        was not asked) and did not record class_mass: class mass was asked iff its sums are not all
        0 (each row's class masses add up to 1), or no segment was seen."""
        with np.load(path) as f:
            meta = json.loads(str(f["meta"]))
            class_mass = meta["class_mass"] if "class_mass" in meta else \
                int(f["n_segments"]) == 0 or bool(np.any(f["class_mass_sum"] != 0))
            switches = {switch: meta[switch] for switch in META_ALWAYS if switch != "class_mass"}
            switches.update({switch: tuple(v) if isinstance(v, list) else v for switch in META_WHEN_ON
                             if (v := meta.get(switch)) is not None})
            spec = StatsSpec(offsets=tuple(meta["offsets"]), n_key_classes=len(meta["class_names"]),
                             class_mass=class_mass, **switches)
            names = tuple(meta["class_names"])
            classes = TokenClasses(names, tuple(meta["row_groups"]), meta["class_source"]) if "row_groups" in meta \
                else TokenClasses.of(names)
            acc = cls(meta["n_layers"], meta["n_heads"], spec, classes, meta.get("average", "tokens"))
            if "layouts" in meta:
                acc.init_layouts([layout_of(d) for d in meta["layouts"]])
            for name in acc.arrays:
                if name not in f or getattr(acc, name).shape != f[name].shape:
                    raise ValueError(f"{path} has no {name} of shape {getattr(acc, name).shape}: "
                                     "written by another bertscope version")
                getattr(acc, name)[...] = f[name]
            acc.n_segments = int(f["n_segments"])
            acc.batches_done = int(f["batches_done"])
        return acc

    # -- reading

    def uniform_entropy(self, group: str = "all") -> float:
        """Mean entropy of uniform attention over the same rows: the "no preference" line.
        For a decoder, uniform over the keys each row sees, averaged over rows and layers
        (`layer_uniform_entropy` gives it per layer)."""
        gi = self.group_names.index(group)
        if self.layouts is not None:
            n = self.n_rows[:, gi].sum()
            return float(self.visible_entropy_sum[:, gi].sum() / n) if n > 0 else 0.0
        n = self.n_rows[0, gi]
        return float(self.uniform_entropy_sum[gi] / n) if n > 0 else 0.0

    def layer_uniform_entropy(self, group: str = "all") -> np.ndarray:
        """(layers,) mean over the rows of `group` of ln n_visible(i), the entropy uniform attention
        over the keys each row sees would have: each layer's baseline (an encoder's is the same
        for every layer, ln of the segment's tokens); 0 where no rows."""
        gi = self.group_names.index(group)
        total = self.visible_entropy_sum[:, gi] if self.layouts is not None \
            else np.repeat(self.uniform_entropy_sum[gi], self.n_layers)
        n = self.n_rows[:, gi]
        return np.divide(total, n, out=np.zeros_like(total), where=n > 0)

    def layer_n_visible(self, group: str = "all") -> np.ndarray:
        """(layers,) mean number of keys a row of `group` sees (a decoder's; None for an encoder)."""
        if self.layouts is None:
            return None
        gi = self.group_names.index(group)
        total, n = self.n_visible_sum[:, gi], self.n_rows[:, gi]
        return np.divide(total, n, out=np.zeros_like(total), where=n > 0)

    def streaming_error(self, group: str = "all", kv_heads: bool = False) -> np.ndarray:
        """The relative streaming error sqrt(sum_i ||o_i - o_L,i||^2 / sum_i ||o_i||^2) over the rows of
        `group`: (layers, H) per query head, or with kv_heads (layers, H_kv) per key/value head group
        (the G query heads that share one key/value head summed together, as DuoAttention decides per
        KV head; H_kv from the layers' `AttentionLayout`, H for a model without grouped-query
        attention). 0 is a head whose output the sink + recent window gives exactly, 1 one whose
        streaming set is empty; NaN where no rows (or a removed head). `NotComputedError` unless the
        spec asked for it (`StatsSpec.streaming`, (sink, recent))."""
        if self.streaming_error_sq_sum is None:
            raise NotComputedError("the streaming error was not computed: the run's spec did not ask for it "
                                   "(StatsSpec.streaming = (sink, recent))")
        gi = self.group_names.index(group)
        err, out = self.streaming_error_sq_sum[:, :, gi], self.output_sq_sum[:, :, gi]  # (layers, H) each
        if kv_heads:
            kv = {layout.n_key_value_heads for layout in (self.layouts or [])} - {None}
            if len(kv) > 1:
                raise ValueError(f"the layers have different numbers of key/value heads: {sorted(kv)}")
            n_kv = kv.pop() if kv else self.n_heads
            err = err.reshape(self.n_layers, n_kv, -1).sum(-1)  # (layers, H_kv)
            out = out.reshape(self.n_layers, n_kv, -1).sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(np.where(out > 0, err / np.where(out > 0, out, 1), np.nan))

    def mean(self, name: str, group: str = "all") -> np.ndarray:
        """Mean per row of a sum over the rows of `group`: shape (layers, H, ...); 0 where no rows.
        A sum of a statistic the spec did not ask for raises `NotComputedError`."""
        gi = self.group_names.index(group)
        if getattr(self, name) is None:
            stat = STAT_OF_ARRAY[name]
            raise NotComputedError(f"{name} was not computed: the run's spec did not ask for {stat.name} "
                                   f"(StatsSpec.{stat.switch})")
        total = getattr(self, name)[:, :, gi]  # (layers, H, ...)
        n = self.n_rows[:, gi].reshape((-1, 1) + (1,) * (total.ndim - 2))
        return np.divide(total, n, out=np.zeros_like(total), where=n > 0)

    def norm_mean(self, name: str, group: str = "all") -> np.ndarray:
        """The norm-based twin (docs/norms.md) of the sum `name` beside `mean(name)`: "class_mass_sum" gives
        the mean per row of class_mass_norm (each class's share of sum_j p_ij n_j), "offset_mass_sum" of
        offset_mass_norm, "weighted_norm_sum" (or "weighted_norm") the mean of sum_j p_ij n_j; (layers, H, ...)
        as `mean`. Missing, never 0: NaN of that shape where the run did not compute it (spec.norms off,
        or its base statistic not asked)."""
        twin = name if name.endswith("_norm_sum") else f"{name.removesuffix('_sum')}_norm_sum"
        if twin not in STAT_OF_ARRAY:
            raise KeyError(f"{name} has no norm-based twin (the twinned sums: "
                           f"{', '.join(a for a in STAT_OF_ARRAY if a.endswith('_norm_sum'))})")
        if getattr(self, twin) is None:
            width = {"O": len(self.spec.offsets), "O+1": len(self.spec.offsets) + 1, "C": self.spec.n_key_classes}
            m = next(m for m in SEGMENT_SUMS if m.array == twin)
            return np.full((self.n_layers, self.n_heads, *(width[d] for d in m.width)), np.nan)
        return self.mean(twin, group)

    def token_relation_means(self, group: str = "all") -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{"duplicate_mass": (mean, rows), "prefix_match_mass": (mean, rows)}, each (layers, H) float64:
        each head's mean mass over the rows of `group` that have at least one visible key of the
        relation (an earlier copy of the row's token; a key right after one), and how many such rows
        there were (the same for every head of a layer; 0 rows: mean 0). A removed head's mean is NaN.
        Without spec.token_relations: `NotComputedError`."""
        if not self.spec.token_relations:
            raise NotComputedError("the token relations were not computed: the run's spec did not ask for "
                                   "duplicate_mass and prefix_match_mass (StatsSpec.token_relations)")
        gi = self.group_names.index(group)
        out = {}
        for stat, (sum_name, rows_name) in TOKEN_RELATIONS.items():
            total = getattr(self, sum_name)[:, :, gi]  # (layers, H)
            rows = np.broadcast_to(getattr(self, rows_name)[:, gi, None], total.shape).copy()  # (layers, H)
            out[stat] = (np.divide(total, rows, out=np.zeros_like(total), where=rows > 0), rows)
            twin = getattr(self, f"{stat}_norm_sum", None)
            if twin is not None:  # its norm-based twin, over the same rows (where spec.norms asked it: docs/norms.md)
                twin = twin[:, :, gi]
                out[f"{stat}_norm"] = (np.divide(twin, rows, out=np.zeros_like(twin), where=rows > 0), rows)
        return out


def _host_array(name: str) -> property:
    """`HeadStats.<name>`: the host array, with the sums still on a device added in first."""

    def get(self) -> np.ndarray:
        self._to_host()
        if name not in self._host:  # a decoder's array on an encoder's accumulator
            raise AttributeError(f"{type(self).__name__} has no {name}")
        return self._host[name]

    def set(self, value: np.ndarray):
        self._to_host()
        self._host[name] = value

    return property(get, set, doc=f"{name}: numpy float64 on the host (see `HeadStats`)")


for _name in ARRAYS + LAYOUT_ARRAYS + TOKEN_ARRAYS:
    setattr(HeadStats, _name, _host_array(_name))


def layout_dict(layout: AttentionLayout) -> dict:
    """An `AttentionLayout` as JSON: {"causal": ..., "window": [left, right] or None, "n_key_value_heads": ...}."""
    return {"causal": layout.causal, "window": None if layout.window is None else list(layout.window),
            "n_key_value_heads": layout.n_key_value_heads}


def layout_of(d: dict) -> AttentionLayout:
    """The `AttentionLayout` `layout_dict` wrote."""
    return AttentionLayout(causal=d["causal"], window=None if d["window"] is None else tuple(d["window"]),
                           n_key_value_heads=d["n_key_value_heads"])
