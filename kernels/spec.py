"""What the attention-statistics kernels compute: one spec, several backends.

Every backend (`eager`, `chunked`, later `triton`) takes the same inputs and returns the
same `RowStats`: statistics of each attention *row* (one query token of one head), never
the L x L map itself. Reducing rows to per-head sums is the accumulators' job
(`bertscope.accumulate`), so a backend stays a pure function of (q, k, v, masks).

Shapes used throughout:
    B batch, H heads, L padded sequence length, D head dimension,
    O number of relative offsets, C number of key classes (named classes + "other").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch


class Gate(IntEnum):
    """What a head contributes to the layer output.

    KEEP    the head as trained.
    ZERO    Michel et al. (2019) head masking: the head's output is multiplied by 0.
    UNIFORM Kovaleva et al. (2019) "disabling": the head's attention is replaced by the
            uniform distribution over valid (non-padding) keys, i.e. its output is the
            mean of V.
    Statistics are always those of the head's own, un-gated attention: a gate changes
    what the head passes on to later layers, not what we report it attends to.
    """

    KEEP = 0
    ZERO = 1
    UNIFORM = 2


@dataclass(frozen=True)
class StatsSpec:
    """Which row statistics to compute.

    offsets: relative key positions j - i whose attention mass is reported (-1 is the
        previous token, 0 the token itself, +1 the next one).
    n_key_classes: C, the number of key classes; a key's class id is in [0, C). The
        mass a row puts on each class is reported (e.g. [CLS], [SEP], punctuation, other).
    entropy / argmax: whether to compute them (they are cheap but not free).
    """

    offsets: tuple[int, ...] = (-2, -1, 0, 1, 2)
    n_key_classes: int = 4
    entropy: bool = True
    argmax: bool = True

    def __post_init__(self):
        if len(set(self.offsets)) != len(self.offsets):
            raise ValueError(f"offsets must be distinct, got {self.offsets}")
        if self.n_key_classes < 1:
            raise ValueError("n_key_classes must be >= 1")

    def union(self, other: "StatsSpec") -> "StatsSpec":
        """The smallest spec that serves both: what the engine computes for several analyses."""
        if self.n_key_classes != other.n_key_classes:
            raise ValueError("analyses disagree on the number of key classes")
        return StatsSpec(
            offsets=tuple(sorted(set(self.offsets) | set(other.offsets))),
            n_key_classes=self.n_key_classes,
            entropy=self.entropy or other.entropy,
            argmax=self.argmax or other.argmax,
        )


@dataclass
class RowStats:
    """Per-row attention statistics of one layer call. Rows of padding queries hold
    unspecified (but finite) values: consumers weight rows by the query mask.

    entropy:      (B, H, L)     -sum_j p_ij ln p_ij, nats
    offset_mass:  (B, H, L, O)  p_{i, i+o} for each o in spec.offsets (0 when i+o is outside
                                the sequence or a padding key)
    class_mass:   (B, H, L, C)  sum of p_ij over keys j of each class
    argmax:       (B, H, L)     index of the most-attended key (ties: lowest index), int64
    """

    entropy: torch.Tensor | None = None
    offset_mass: torch.Tensor | None = None
    class_mass: torch.Tensor | None = None
    argmax: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)
