"""Attention by distance and by position, per head, streamed over a corpus.

Definitions (the kernels' row statistics, `bertscope.kernels.spec.ROW_STATS`; positions are those
of the segment, 0 at its first real token: the engine pads on the right, and a left-padded batch
is refused here, since it would move every key's place in its context):

    distance_mass   a row's attention mass by query-key distance |i - j| in log2 buckets 0 | 1 |
                    2-3 | 4-7 | ... | 16384-32767 | 32768+ (`distance_bucket_names`). Summed over
                    every real query row of every segment, then divided by the number of rows: a
                    head's distance profile (each row sums to 1, so the profile does too).
    mean_distance   sum_j p_ij |i - j|, the same mean over rows: how far back (an encoder: back or
                    ahead) a head reads, in tokens.
    position_mass   a row's mass on the keys j <= i in tenths of its own context, bin
                    floor(10 j / (i + 1)), then "after" (j > i, encoders only). Summed over the
                    *late* queries only, the last `late` share of each segment's real tokens
                    (at least one row per segment, ceil(late * n) rows of an n-token segment): the
                    rows that read a long context, as the question at the end of a prompt reads
                    the documents before it (Liu et al. 2023's setting). A uniform row puts
                    exactly (number of keys in the bin) / (i + 1) on each bin, 1/10 each when 10
                    divides i + 1.
    first_mass      the late rows' mass on the segment's first token (the attention sink: a BOS,
                    a decoder's first word, an encoder's [CLS]), which lies in the first tenth: the
                    first tenth without it (`position_profile(without_first=True)`) tells an
                    attention sink from a primacy bias over the first tenth of the context.

Nothing is kept per token: the accumulator holds O(layers x heads x buckets) float64 sums, whatever
the corpus and the length. Sliding-window layers (Gemma-3: 5 of 6 layers see 512 keys) are layers
like the others; their kind ("window 512") labels their rows, and a window of w keys puts nothing
at distance w or more (`beyond_window`).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from bertscope.analyses.heads.positions.outputs import LATE, NAME  # noqa: F401 (P.NAME, as the command reads it)
from bertscope.engine.batch import BatchContext
from bertscope.files import write_npz
from bertscope.kernels.spec import (
    DISTANCE_EDGES,
    N_DISTANCE_BUCKETS,
    N_POSITION_BINS,
    N_POSITION_BUCKETS,
    StatsSpec,
    distance_bucket_names,
    position_bin_names,
)
from bertscope.text.token_classes import TokenClasses

# Key classes: the segment's first token (class 0; the engine makes it a decoder's first real token,
# `first_token_class`, and each segment's `token_class` makes it an encoder's), and the rest.
FIRST_CLASSES = TokenClasses(("first", "other"), (), "positions")
FIRST = 0
MIDDLE = (3, 4, 5, 6)  # the middle tenths, 30-70% of the context: the bottom of a U


def segment_classes(n_tokens: int) -> list[int]:
    """Every token's `FIRST_CLASSES` id: the first token is "first", the others "other"."""
    return [FIRST] + [1] * (n_tokens - 1)


def spec_for() -> StatsSpec:
    """What the kernels compute: the distance and position statistics, and the mass per key class
    (for the mass on the first token)."""
    return StatsSpec(n_key_classes=FIRST_CLASSES.n_classes, distance=True, position_mass=True, class_mass=True)


def bucket_bounds() -> list[tuple[int, int | None]]:
    """(smallest, largest) distance of each bucket; None: no largest (the last, 32768+)."""
    edges = (0,) + DISTANCE_EDGES
    return [(lo, hi - 1) for lo, hi in zip(edges, edges[1:])] + [(DISTANCE_EDGES[-1], None)]


def late_rows(valid: torch.Tensor, late: float) -> torch.Tensor:
    """(B, L) bool: the late queries of each right-padded segment, its last ceil(late * n) real rows
    (at least one); `valid` (B, L) bool, True on real tokens."""
    n = valid.sum(-1, keepdim=True)  # (B, 1)
    k = torch.ceil(late * n.double() - 1e-9).long().clamp_min(1)  # (B, 1) rows from the end
    i = torch.arange(valid.shape[-1], device=valid.device)[None, :]  # (1, L)
    return valid & (i >= n - k)


def check_right_padded(valid: torch.Tensor) -> None:
    """The kernels count positions from the padded sequence's index 0: a segment's first real token
    must be there, and its real tokens contiguous, or every position statistic would be shifted."""
    n = valid.sum(-1, keepdim=True)  # (B, 1)
    i = torch.arange(valid.shape[-1], device=valid.device)[None, :]
    if not torch.equal(valid, i < n):
        raise ValueError("heads positions needs right-padded batches: positions are counted from index 0, and a "
                         "left-padded segment's keys would move in their context")


ARRAYS = {  # name -> (shape in symbols, dtype)
    "n_segments": ((), np.int64),
    "n_rows": ((), np.float64),  # every real query row
    "n_late": ((), np.float64),  # the late rows
    "distance_sum": (("Ly", "H", "DB"), np.float64),
    "mean_distance_sum": (("Ly", "H"), np.float64),
    "position_sum": (("Ly", "H", "PB"), np.float64),  # late rows only
    "first_sum": (("Ly", "H"), np.float64),  # late rows' mass on the first token
}


class PositionStats:
    """Additive sums of the distance and position statistics over a corpus: an engine `Accumulator`.

    Ly layers, H heads, DB distance buckets (17), PB position bins (11). Every array is a sum or a
    count (`ARRAYS`), so batches, resumed runs and ranks merge by addition, and no number depends on
    the batch size.
    """

    def __init__(self, n_layers: int, n_heads: int, windows: Sequence[int | None], late: float = LATE):
        if not 0 < late <= 1:
            raise ValueError(f"late must lie in (0, 1], not {late}")
        self.n_layers, self.n_heads = n_layers, n_heads
        self.windows = [None if w is None else int(w) for w in windows]  # keys a windowed row sees to its left
        if len(self.windows) != n_layers:
            raise ValueError(f"{len(self.windows)} windows for {n_layers} layers")
        self.late = float(late)
        self.spec = spec_for()
        self.batches_done = 0
        sizes = {"Ly": n_layers, "H": n_heads, "DB": N_DISTANCE_BUCKETS, "PB": N_POSITION_BUCKETS}
        for name, (shape, dtype) in ARRAYS.items():
            setattr(self, name, np.zeros(tuple(sizes[s] for s in shape), dtype=dtype))

    def meta(self) -> dict:
        return dict(n_layers=self.n_layers, n_heads=self.n_heads, windows=self.windows, late=self.late)

    # -- adding a batch

    def add(self, batch: BatchContext) -> None:
        valid = batch.key_valid  # (B, L)
        check_right_padded(valid)
        late = late_rows(valid, self.late)  # (B, L)
        vd, ld = valid.double(), late.double()
        self.n_segments += int(valid.any(-1).sum())
        self.n_rows += float(vd.sum())
        self.n_late += float(ld.sum())
        for layer, stats in enumerate(batch.layers):
            self.distance_sum[layer] += _np(torch.einsum("bhld,bl->hd", _rows(stats.distance_mass, valid), vd))
            self.mean_distance_sum[layer] += _np(torch.einsum("bhl,bl->h", _rows(stats.mean_distance, valid), vd))
            self.position_sum[layer] += _np(torch.einsum("bhlp,bl->hp", _rows(stats.position_mass, late), ld))
            first = stats.class_mass[..., FIRST]  # (B, H, L)
            self.first_sum[layer] += _np(torch.einsum("bhl,bl->h", _rows(first, late), ld))

    # -- merging, saving, loading

    def merge(self, other: PositionStats) -> PositionStats:
        if other.meta() != self.meta():
            raise ValueError("cannot merge position statistics of different models or settings")
        for name in ARRAYS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def save(self, path: Path) -> None:
        write_npz(path, meta=json.dumps(self.meta()), batches_done=self.batches_done,
                  **{name: getattr(self, name) for name in ARRAYS})

    @classmethod
    def load(cls, path: Path) -> PositionStats:
        with np.load(path) as f:
            acc = cls(**json.loads(str(f["meta"])))
            for name in ARRAYS:
                if name not in f or f[name].shape != getattr(acc, name).shape:
                    raise ValueError(f"{path} holds no {name} of the expected shape: made by another version?")
                setattr(acc, name, f[name].astype(ARRAYS[name][1]))
            acc.batches_done = int(f["batches_done"])
        return acc

    # -- reading

    def distance_profile(self) -> np.ndarray:
        """(Ly, H, DB) mean mass per distance bucket over every real query row (rows sum to 1)."""
        return _div(self.distance_sum, self.n_rows)

    def mean_distance(self) -> np.ndarray:
        """(Ly, H) mean query-key distance, tokens."""
        return _div(self.mean_distance_sum, self.n_rows)

    def position_profile(self, without_first: bool = False) -> np.ndarray:
        """(Ly, H, PB) the late queries' mean mass per tenth of their context, then "after"; with
        `without_first`, the first tenth less the mass on the first token."""
        sums = self.position_sum.copy()
        if without_first:
            sums[..., 0] -= self.first_sum
        return _div(sums, self.n_late)

    def first_mass(self) -> np.ndarray:
        """(Ly, H) the late queries' mean mass on the first token."""
        return _div(self.first_sum, self.n_late)

    def layer_kinds(self) -> list[str]:
        return ["global" if w is None else f"window {w + 1}" for w in self.windows]

    def beyond_window(self) -> np.ndarray:
        """(Ly, H) the mass in the distance buckets that lie wholly beyond each windowed layer's
        window (a row that sees w keys to its left, "window w + 1", sees distances 0 .. w); NaN for a
        global layer."""
        out = np.full((self.n_layers, self.n_heads), np.nan)
        prof = self.distance_profile()
        for layer, w in enumerate(self.windows):
            if w is not None:
                out[layer] = prof[layer][:, [lo > w for lo, _ in bucket_bounds()]].sum(-1)
        return out


def reach(profile: np.ndarray, share: float) -> int | None:
    """The largest distance of the first bucket by which `share` of a (DB,) profile is gathered:
    how far the head reads (None: the last bucket, no largest; NaN profile: None)."""
    if not np.isfinite(profile).all():
        return None
    b = int(np.searchsorted(np.cumsum(profile), share - 1e-12))
    return bucket_bounds()[min(b, N_DISTANCE_BUCKETS - 1)][1]


def beyond(profile: np.ndarray, distance: int) -> float:
    """The mass of a (..., DB) profile in the buckets whose smallest distance is at least `distance`."""
    return float(profile[..., [lo >= distance for lo, _ in bucket_bounds()]].sum())


def _rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A (B, H, L, ...) statistic in float64, 0 outside `rows` (B, L) (no NaN of a padding row survives)."""
    keep = rows[:, None, :].reshape(rows.shape[0], 1, rows.shape[1], *([1] * (t.dim() - 3)))
    return torch.where(keep, t.double(), 0.0)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _div(a: np.ndarray, b) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.asarray(b) > 0, a / np.where(np.asarray(b) > 0, b, 1), np.nan)


# --- the tables ----------------------------------------------------------------------------------


def distance_columns() -> tuple[str, ...]:
    return tuple(f"d_{name}" for name in distance_bucket_names())


def position_columns() -> tuple[str, ...]:
    return tuple(f"p_{name}" for name in position_bin_names())


DISTANCE_COLUMNS = ("layer", "head", "attention", "mean_distance", "n_queries", *distance_columns())
PROFILE_COLUMNS = ("layer", "head", "attention", "n_late_queries", "first_token", *position_columns())
LAYER_COLUMNS = ("layer", "attention", "mean_distance", "beyond_window", "reach_90", "first_token",
                 *distance_columns(), *position_columns())


def head_rows(stats: PositionStats) -> tuple[list[dict], list[dict]]:
    """The per-head distance table and the per-head position table."""
    kinds = stats.layer_kinds()
    dist, md = stats.distance_profile(), stats.mean_distance()
    pos, first = stats.position_profile(), stats.first_mass()
    distance_rows, profile_rows = [], []
    for layer in range(stats.n_layers):
        for head in range(stats.n_heads):
            key = {"layer": layer + 1, "head": head + 1, "attention": kinds[layer]}
            distance_rows.append({**key, "mean_distance": md[layer, head], "n_queries": int(stats.n_rows),
                                  **dict(zip(distance_columns(), dist[layer, head]))})
            profile_rows.append({**key, "n_late_queries": int(stats.n_late), "first_token": first[layer, head],
                                 **dict(zip(position_columns(), pos[layer, head]))})
    return distance_rows, profile_rows


def layer_rows(stats: PositionStats) -> list[dict]:
    kinds = stats.layer_kinds()
    dist, md = stats.distance_profile().mean(1), stats.mean_distance().mean(1)  # (Ly, DB), (Ly,)
    pos, first = stats.position_profile().mean(1), stats.first_mass().mean(1)
    beyond_w = stats.beyond_window().mean(1)
    return [{"layer": layer + 1, "attention": kinds[layer], "mean_distance": md[layer],
             "beyond_window": beyond_w[layer], "reach_90": reach(dist[layer], 0.9), "first_token": first[layer],
             **dict(zip(distance_columns(), dist[layer])), **dict(zip(position_columns(), pos[layer]))}
            for layer in range(stats.n_layers)]


def u_shape(profile: np.ndarray) -> dict:
    """First tenth, middle (30-70%) and last tenth of a (PB,) late-query profile, and whether it is
    U-shaped: both ends above the middle."""
    first, middle, last = float(profile[0]), float(np.mean(profile[list(MIDDLE)])), float(profile[N_POSITION_BINS - 1])
    return {"first": first, "middle": middle, "last": last, "u_shaped": bool(first > middle and last > middle)}


def headline(stats: PositionStats) -> dict:
    """run.json's results: per layer the mean distance, per layer kind the distance profile, the
    windowed layers' mass beyond their window and the global layers' reach, the late-query profile."""
    names = distance_bucket_names()
    dist, md = stats.distance_profile(), stats.mean_distance()
    pos, pos_wo = stats.position_profile(), stats.position_profile(without_first=True)
    kinds = stats.layer_kinds()
    out = {"late": stats.late, "segments": int(stats.n_segments), "queries": int(stats.n_rows),
           "late_queries": int(stats.n_late),
           "mean_distance_by_layer": [round(float(x), 2) for x in md.mean(1)],
           "kinds": {}}
    for kind in dict.fromkeys(kinds):
        layers = [i for i, k in enumerate(kinds) if k == kind]
        profile = dist[layers].mean((0, 1))  # (DB,) mean over the kind's layers and heads
        entry = {"layers": [i + 1 for i in layers], "mean_distance": float(md[layers].mean()),
                 "distance_mass": {n: round(float(x), 6) for n, x in zip(names, profile)},
                 "reach_90": reach(profile, 0.9), "reach_99": reach(profile, 0.99),
                 "mass_beyond_512": beyond(profile, 512)}
        w = stats.windows[layers[0]]
        if w is not None:
            entry["beyond_window"] = float(np.max(stats.beyond_window()[layers]))  # the largest of any head
        else:
            entry["farthest_layer"] = layers[int(np.argmax(md[layers].mean(1)))] + 1
        late = pos[layers].mean((0, 1))
        entry["late_profile"] = {n: round(float(x), 6) for n, x in zip(position_bin_names(), late)}
        entry["late_shape"] = u_shape(late)
        entry["late_shape_without_first_token"] = u_shape(pos_wo[layers].mean((0, 1)))
        out["kinds"][kind] = entry
    every = pos.mean((0, 1))
    out["late_profile"] = {n: round(float(x), 6) for n, x in zip(position_bin_names(), every)}
    out["late_shape"] = u_shape(every)
    out["late_shape_without_first_token"] = u_shape(pos_wo.mean((0, 1)))
    out["late_first_token"] = float(stats.first_mass().mean())
    return out
