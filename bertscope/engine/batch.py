"""One batch as every consumer sees it, and the protocol consumers implement.

The engine collates a batch once, runs the model once, and hands the same `BatchContext` to
every accumulator: segment indices, masks, per-position classes, row groups, word pooling,
each layer's `RowStats` and the model's own outputs. No consumer pads or re-collates.

Per-segment sums of the row statistics (`segment_sums`) are computed at most once per layer
and shared: the corpus accumulator adds them over the batch, the per-example writer divides
them by each segment's row counts. That is what makes per-example statistics cheap and
makes them average back to the corpus table exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from bertscope.kernels.spec import ROW_STATS, RowStats, StatsSpec, WordPooling
from bertscope.text.token_classes import TokenClasses


@dataclass
class BatchContext:
    """A padded batch of segments and what one forward pass made of it.

    indices:   segment indices (positions in the corpus's segment list), in batch order
    segments:  the `Segment`s themselves
    inputs:    model inputs on the model's device (input_ids, attention_mask, ...)  (B, L)
    key_valid: (B, L) bool, False for padding
    key_class: (B, L) int64 class of every position under `classes`
    classes:   the class scheme (names, row groups)
    spec:      the statistics computed for every layer
    pooling:   word pooling of the batch (spec.word_maps), else None
    layers:    one `RowStats` per layer, filled by the forward pass
    outputs:   the model's output object (hidden states, logits, ...)
    number:    1-based position of the batch in the engine's plan (checkpoints count these)
    padded:    whether any segment is shorter than the batch (key_valid holds False), as the host
               knew it when it collated the batch (no read of the device); None: not known
    token_ids: (B, L) int64 token ids (the model's input_ids), handed to the kernels as `key_class`
               is (spec.token_relations compares them); None when the batch has none
    """

    indices: list[int]
    segments: list
    inputs: dict[str, torch.Tensor]
    key_valid: torch.Tensor
    key_class: torch.Tensor
    classes: TokenClasses
    spec: StatsSpec
    pooling: WordPooling | None = None
    layers: list[RowStats] = field(default_factory=list)
    outputs: Any = None
    number: int = 0
    padded: bool | None = None
    token_ids: torch.Tensor | None = None
    _sums: dict = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return len(self.indices)

    @cached_property
    def row_groups(self) -> torch.Tensor:
        """(B, L, G) float64: 1 where row l of segment b is in group g (group 0: every valid
        row; then the rows of each of `classes.row_groups`, "non_<class>" its complement);
        0 on padding."""
        valid = self.key_valid.double()  # (B, L)
        cols = [valid]
        for g in self.classes.row_groups:
            name, complement = self.classes.group_class(g)
            of_class = self.key_class == self.classes.names.index(name)  # (B, L)
            cols.append((~of_class if complement else of_class).double() * valid)
        return torch.stack(cols, dim=-1)  # (B, L, G)

    @cached_property
    def group_rows(self) -> torch.Tensor:
        """(B, G) float64: rows of each group in each segment."""
        return self.row_groups.sum(1)

    @cached_property
    def n_tokens(self) -> torch.Tensor:
        """(B,) int64 valid tokens per segment."""
        return self.key_valid.sum(1)

    def segment_sums(self, layer: int) -> dict[str, torch.Tensor]:
        """Sums over each segment's rows of every row statistic of `layer`, per group:
        name -> (B, H, G, F) float64, F the statistic's width. Computed once per layer.

        One entry per `SegmentSum` of the kernels' table (`bertscope.kernels.spec.ROW_STATS`)
        whose statistic the spec asked for: entropy (F=1), offset_mass (O), class_mass (C); with
        spec.argmax, argmax_offset (O+1: one column per offset, then "elsewhere") and
        argmax_class (C) count rows. A pruned head's (argmax -1, every other statistic NaN:
        `bertscope.models.head_removal.spread_heads`) sums are NaN.
        """
        if layer not in self._sums:
            self._sums[layer] = _segment_sums(self.layers[layer], self.row_groups, self.key_class, self.spec)
        return self._sums[layer]


def _segment_sums(stats: RowStats, groups: torch.Tensor, key_class: torch.Tensor, spec: StatsSpec):
    parts = []  # (name, (B, H, L, F)) in one tensor, so one reduction serves all
    for stat in ROW_STATS:  # every statistic of the table with segment sums, in the table's order
        t = getattr(stats, stat.name)
        if stat.sums and t is not None:
            parts += stat.segment_rows(t, key_class, spec).items()
    if not parts:
        return {}
    x = torch.cat([t.double() for _, t in parts], dim=-1)  # (B, H, L, F)
    sums = torch.einsum("bhlf,blg->bhgf", x, groups)  # (B, H, G, F)
    out, f0 = {}, 0
    for name, t in parts:
        out[name] = sums[..., f0:f0 + t.shape[-1]]
        f0 += t.shape[-1]
    return out


@runtime_checkable
class Accumulator(Protocol):
    """What the engine folds batches into: anything an analysis keeps across a corpus.

    add(batch)      fold one `BatchContext` in
    merge(other)    add another accumulator of the same kind (other batches, another rank)
    save(path)      write state atomically: a crash mid-write leaves the previous state
    load(path)      classmethod: the state `save` wrote
    batches_done    how many batches of the engine's plan the state covers, saved with it,
                    so a resumed run never counts a batch twice
    """

    batches_done: int

    def add(self, batch: BatchContext) -> None: ...

    def merge(self, other): ...

    def save(self, path: Path) -> None: ...

    @classmethod
    def load(cls, path: Path): ...
