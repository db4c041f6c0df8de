"""What the attention-statistics kernels compute: one spec, several backends.

Every backend (`eager`, `chunked`, later `triton`) takes the same inputs and returns the
same `RowStats`: statistics of each attention *row* (one query token of one head), never
the L x L map itself. Reducing rows to per-head sums is the accumulators' job
(`bertscope.engine.accumulate`), so a backend stays a pure function of (q, k, v, masks).

Shapes used throughout:
    B batch, H heads, L padded sequence length, D head dimension,
    O number of relative offsets, C number of key classes (named classes + "other").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch


class Gate(IntEnum):
    """Shorthand for the three things a head is commonly made to contribute; each one is a
    point of the continuous representation in `LayerGates` (xi, uniform):

    KEEP    (1, False)  the head as trained.
    ZERO    (0, False)  Michel et al. (2019) head masking: the head's output times xi = 0.
    UNIFORM (1, True)   Kovaleva et al. (2019) "disabling": the head's attention is replaced
                        by the uniform distribution over valid (non-padding) keys, i.e. its
                        output is the mean of V.
    """

    KEEP = 0
    ZERO = 1
    UNIFORM = 2


@dataclass(frozen=True)
class LayerGates:
    """One layer's head gates, as every backend takes them.

    xi:      (H,) or (B, H) float, or None for all 1. Michel et al.'s mask variable: the
             head's output O_h becomes xi_h * O_h, so dL/dxi_h = sum <dL/d(xi_h O_h), O_h>
             is the first-order estimate of what masking the head costs. A (B, H) xi gates
             each sequence on its own (per-example importance).
    uniform: (H,) or (B, H) bool, or None for none: heads whose attention is replaced by the
             uniform distribution over valid keys before xi scales them (Kovaleva et al.); a
             (B, H) one chooses per sequence (several model variants in one batch).
    Statistics are always those of the head's own, un-gated attention: a gate changes what
    the head passes on to later layers, not what we report it attends to.
    """

    xi: torch.Tensor | None = None
    uniform: torch.Tensor | None = None

    @classmethod
    def from_codes(cls, codes) -> "LayerGates":
        """Gates from one `Gate` per head."""
        codes = torch.as_tensor([int(c) for c in codes])  # (H,)
        return cls(xi=(codes != Gate.ZERO).float(), uniform=codes == Gate.UNIFORM)

    @property
    def is_identity(self) -> bool:
        return self.xi is None and self.uniform is None


@dataclass(frozen=True)
class StatsSpec:
    """Which row statistics to compute.

    offsets: relative key positions j - i whose attention mass is reported (-1 is the
        previous token, 0 the token itself, +1 the next one).
    n_key_classes: C, the number of key classes; a key's class id is in [0, C). The
        mass a row puts on each class is reported (e.g. [CLS], [SEP], punctuation, other).
    entropy / argmax: whether to compute them (they are cheap but not free).
    column_mass: the attention mass each key *receives*, summed over the valid query rows
        (Kovaleva et al.'s "vertical" pattern, per-token stripe scores).
    word_maps: the word-level map of every head and its row argmax, for the probes that
        read attention between words (syntax, coreference, probing classifiers); needs a
        `WordPooling` for the batch.
    keep_qk: hand the layer's queries and keys on with the statistics (as views, no copy),
        for analyses that compare heads across layers (Jensen-Shannon clustering) by
        recomputing attention tiles instead of keeping every map.
    """

    offsets: tuple[int, ...] = (-2, -1, 0, 1, 2)
    n_key_classes: int = 4
    entropy: bool = True
    argmax: bool = True
    column_mass: bool = False
    word_maps: bool = False
    keep_qk: bool = False

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
            column_mass=self.column_mass or other.column_mass,
            word_maps=self.word_maps or other.word_maps,
            keep_qk=self.keep_qk or other.keep_qk,
        )


@dataclass
class WordPooling:
    """How tokens pool into words for one batch: the word-level map is
    `from_word @ P @ to_word` for each head's token-level map P.

    Clark et al. (2019, section 4.1): attention *to* a split word is the sum over its
    tokens (so each row still sums to 1), attention *from* it is the mean over its tokens
    (their released code took the first token instead; `from_word="first"` reproduces
    that). Units are words and special tokens alike; special tokens are their own unit and
    are never an argmax candidate, so predictions ignore [CLS] and [SEP].

    from_word: (B, W, L)  row w weights the query tokens of unit w (rows sum to 1; 0 for
                          units that do not exist in this sequence)
    to_word:   (B, L, W)  1 where token j belongs to unit u
    candidate: (B, W)     units an argmax may pick (words; not specials, not absent units)
    """

    from_word: torch.Tensor
    to_word: torch.Tensor
    candidate: torch.Tensor

    @property
    def n_units(self) -> int:
        return self.to_word.shape[-1]


@dataclass
class RowStats:
    """Per-row attention statistics of one layer call. Rows of padding queries hold
    unspecified (but finite) values: consumers weight rows by the query mask.

    entropy:      (B, H, L)     -sum_j p_ij ln p_ij, nats
    offset_mass:  (B, H, L, O)  p_{i, i+o} for each o in spec.offsets (0 when i+o is outside
                                the sequence or a padding key)
    class_mass:   (B, H, L, C)  sum of p_ij over keys j of each class
    argmax:       (B, H, L)     index of the most-attended key (ties: lowest index), int64
    column_mass:  (B, H, L)     sum over valid query rows i of p_ij: mass key j receives
    word_map:     (B, H, W, W)  word-level map (see `WordPooling`); rows of real units sum to 1
    word_argmax:  (B, H, W)     most-attended *other* candidate unit of each unit (ties:
                                lowest index), -1 when there is none; int64
    queries, keys:(B, H, L, D)  the layer's q and k (spec.keep_qk), with `scale`
    """

    entropy: torch.Tensor | None = None
    offset_mass: torch.Tensor | None = None
    class_mass: torch.Tensor | None = None
    argmax: torch.Tensor | None = None
    column_mass: torch.Tensor | None = None
    word_map: torch.Tensor | None = None
    word_argmax: torch.Tensor | None = None
    queries: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    scale: float | None = None
    extras: dict = field(default_factory=dict)

    def as_float32(self) -> "RowStats":
        """The statistics in float32, in place: a model in float16 or bfloat16 gives its kernels
        half-precision q, k, v, and its statistics are summed from float32 (then float64)."""
        for name in ("entropy", "offset_mass", "class_mass", "column_mass", "word_map"):
            t = getattr(self, name)
            if t is not None and t.is_floating_point() and t.dtype != torch.float32:
                setattr(self, name, t.float())
        return self


# --- what the attention function is handed: the shape of the attention, beside the statistics ---


@dataclass(frozen=True)
class AttentionLayout:
    """Which keys each query of a layer call may see, and how q and k heads pair up.

    causal:            query i sees keys j <= i only (a decoder's mask).
    window:            None, or (left, right): query i sees keys i - left .. i + right only
                       (a sliding window; a causal one is (w - 1, 0) for transformers'
                       `sliding_window` w).
    n_key_value_heads: None when k and v have as many heads as q; else their count, a divisor
                       of the query heads (grouped-query attention: query head h reads key head
                       h // (H / n_key_value_heads)).

    The default is an encoder's: every query sees every real (non-padding) key, one k and v
    head per query head. That is all the backends compute today; `attention_stats` refuses
    any other layout (`unsupported`) rather than describe attention the model did not do.
    """

    causal: bool = False
    window: tuple[int, int] | None = None
    n_key_value_heads: int | None = None

    def __post_init__(self):
        if self.window is not None and (len(self.window) != 2 or min(self.window) < 0):
            raise ValueError(f"window must be (left, right) with both >= 0, not {self.window}")
        if self.n_key_value_heads is not None and self.n_key_value_heads < 1:
            raise ValueError(f"n_key_value_heads must be >= 1, not {self.n_key_value_heads}")

    @property
    def is_plain(self) -> bool:
        """Bidirectional, unwindowed, one k and v head per query head: what the backends compute."""
        return not self.causal and self.window is None and self.n_key_value_heads is None

    def unsupported(self, n_heads: int | None = None) -> list[str]:
        """What of this layout the backends do not compute yet, in words (empty when plain)."""
        out = []
        if self.causal:
            out.append("causal attention")
        if self.window is not None:
            out.append(f"sliding-window attention (window {self.window[0]} left, {self.window[1]} right)")
        if self.n_key_value_heads is not None:
            of = f" for {n_heads} query heads" if n_heads is not None else ""
            out.append(f"grouped-query attention ({self.n_key_value_heads} key/value heads{of})")
        return out


PLAIN = AttentionLayout()  # an encoder's self-attention
