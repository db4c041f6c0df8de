"""The atlas's numbers: one streamed pass serving three existing accumulators, and the per-head
table built from them and from the probes, every number computed by the analysis that owns it.

The streamed pass. One engine pass (`engine.fold`) over the corpus feeds, by the union of their
`StatsSpec`s, the accumulators of three analyses, unchanged:
    `HeadStats` (bertscope.engine.accumulate; `bertscope run`'s): entropy and its per-layer uniform
        baseline, the mass at offsets -1, 0, +1;
    `SinkStats` (analyses/sinks): alpha_1, the first-token, initial and [SEP] masses;
    `PositionStats` (analyses/heads/positions): the distance profile and the mean distance.
They share one key-class scheme, the sinks' (`SINK_CLASSES`: class 0 is the segment's first token,
which is what `PositionStats` reads as its own class 0), and each segment carries its classes
(`sinks.stats.segment_classes`). The sinks' accumulator indexes the offsets of the spec it is
handed, so it is given the union spec (`StreamStats`).

The probes' numbers come from their own analyses too: `InductionScores` (analyses/heads/induction),
`GridScores` (analyses/heads/retrieval), `lm_importance` (analyses/heads/lm_task). This module only
puts them side by side (`head_table`).

The token relations (duplicate and prefix-match mass) and the streaming error are row statistics of
the kernels' table, asked for in the same pass (`token_match_spec`, `streaming_spec`) and read from
`HeadStats`'s own accessors (`token_match_columns`, `streaming_columns`).

The norm-based twins of the sink masses (Kobayashi et al. 2020, docs/norms.md) come the way `bertscope
sinks` gets them: the union spec asks for `norms`, and `SinkStats` made with norms reads them
(`alpha_norm`, `class_norm`; `sink_norm_columns`). Without norms they are NaN, never 0.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bertscope.analyses.heads.positions import stats as P
from bertscope.analyses.sinks import stats as S
from bertscope.engine.accumulate import HeadStats, NotComputedError
from bertscope.files import write_text
from bertscope.kernels.spec import ROW_STATS, StatsSpec

OFFSETS = (-1, 0, 1)  # previous token, the token itself, the next token
STREAMING_SINK = 4  # S: StreamingLLM's initial tokens kept (Xiao et al. 2023)
STREAMING_RECENT = 256  # W: recent keys kept; DuoAttention's streaming heads keep a few hundred


# the token relations of kernels/spec.py's table (its switch token_relations)
TOKEN_MATCH = tuple(s.name for s in ROW_STATS if s.switch == "token_relations")


def token_match_spec() -> dict:
    """The `StatsSpec` fields that ask for duplicate_mass and prefix_match_mass."""
    return {"token_relations": True}


def token_match_columns(heads: HeadStats) -> dict[str, np.ndarray]:
    """Per head (Ly, H): duplicate_mass and prefix_match_mass, each the mean over the rows that have such
    a key (NaN where none has), from `HeadStats.token_relation_means`; NaN where the run did not compute
    them. How many rows each mean is over is the same for every head of a layer: `token_match_rows`."""
    shape = (heads.n_layers, heads.n_heads)
    out = {name: np.full(shape, np.nan) for name in TOKEN_MATCH}
    try:
        means = heads.token_relation_means()
    except NotComputedError:
        return out
    for name in TOKEN_MATCH:  # not their norm-based twins, which `token_relation_means` adds with norms
        mean, rows = means[name]
        out[name] = np.where(rows > 0, mean, np.nan)
    return out


def token_match_rows(heads: HeadStats) -> dict[str, list[int]] | None:
    """Per layer, the corpus's rows that duplicate_mass and prefix_match_mass average over:
    {"duplicate_rows": [Ly ints], "prefix_match_rows": [...]}: the rows with an earlier copy of their
    token (and with a key right after one) among the keys they see, so one count per layer (a sliding
    window sees fewer copies than a global layer), not per head; None where not computed."""
    try:
        means = heads.token_relation_means()
    except NotComputedError:
        return None
    return {f"{name.removesuffix('_mass')}_rows": [int(round(float(x))) for x in means[name][1][:, 0]]
            for name in TOKEN_MATCH}


def streaming_spec(causal: bool, sink: int = STREAMING_SINK, recent: int = STREAMING_RECENT) -> dict:
    """{"streaming": (S, W)} for a decoder (StreamingLLM's sink and recent window are a causal cache's),
    {} for an encoder."""
    return {"streaming": (int(sink), int(recent))} if causal else {}


def streaming_columns(heads: HeadStats, n_kv_heads: int) -> dict[str, np.ndarray]:
    """Per head (Ly, H): `streaming_error`, sqrt(sum ||o - o_L||^2 / sum ||o||^2) over the corpus's rows
    (the pooled relative error, `HeadStats.streaming_error`), and `streaming_error_kv`, the same pooled
    over the query heads of the head's KV group, repeated over them; NaN where not computed."""
    shape = (heads.n_layers, heads.n_heads)
    try:
        per, kv = heads.streaming_error(), heads.streaming_error(kv_heads=True)  # (Ly, H), (Ly, KV)
    except NotComputedError:
        return {"streaming_error": np.full(shape, np.nan), "streaming_error_kv": np.full(shape, np.nan)}
    return {"streaming_error": per, "streaming_error_kv": np.repeat(kv, heads.n_heads // kv.shape[1], axis=1)}


def stream_spec(windows, causal: bool, streaming: tuple[int, int] = (STREAMING_SINK, STREAMING_RECENT),
                norms: bool = False) -> StatsSpec:
    """The union of what the three accumulators need (and the adapters' statistics, where they exist); with
    `norms` the norm-based twins too (the sinks' `alpha_1_norm`, `first_mass_norm`, ...: docs/norms.md)."""
    sinks, positions = S.spec_for(windows, norms=norms), P.spec_for()
    values = {"offsets": tuple(sorted(set(sinks.offsets) | set(OFFSETS))), "n_key_classes": S.SINK_CLASSES.n_classes,
              "entropy": True, "class_mass": True, "distance": positions.distance,
              "position_mass": positions.position_mass, "norms": sinks.norms}
    values.update(token_match_spec())
    values.update(streaming_spec(causal, *streaming))
    return StatsSpec(**values)


class StreamStats:
    """The streamed pass's three accumulators as one engine `Accumulator`: every batch goes to each,
    they are saved together and resume together."""

    PARTS = ("heads", "sinks", "positions")

    def __init__(self, n_layers: int, n_heads: int, windows, spec: StatsSpec, variant: str, buckets: int):
        self.spec = spec
        self.heads = HeadStats(n_layers, n_heads, spec, S.SINK_CLASSES)
        self.sinks = S.SinkStats(n_layers, n_heads, windows, [variant], buckets, hidden_size=1, norms=spec.norms)
        self.sinks.spec = spec  # it reads offset_mass by the spec's offsets: the union's, not its own
        self.positions = P.PositionStats(n_layers, n_heads, windows)

    @property
    def batches_done(self) -> int:
        return self.heads.batches_done

    @batches_done.setter
    def batches_done(self, n: int):
        for part in self.PARTS:
            getattr(self, part).batches_done = n

    def add(self, batch) -> None:
        for part in self.PARTS:
            getattr(self, part).add(batch)

    def save(self, folder: Path, files: dict[str, str], suffix: str = "") -> None:
        for part in self.PARTS:
            getattr(self, part).save(Path(folder) / files[part].format(suffix=suffix))

    def load_into(self, folder: Path, files: dict[str, str], suffix: str = "") -> bool:
        """Take the saved sums when all three are there, of these settings and the same batches;
        False (nothing taken) otherwise: the pass then starts over."""
        paths = {part: Path(folder) / files[part].format(suffix=suffix) for part in self.PARTS}
        if not all(p.is_file() for p in paths.values()):
            return False
        try:
            heads = HeadStats.load(paths["heads"])
            sinks = S.SinkStats.load(paths["sinks"])
            positions = P.PositionStats.load(paths["positions"])
        except (ValueError, KeyError, OSError):
            return False
        fresh = HeadStats(self.heads.n_layers, self.heads.n_heads, self.spec, S.SINK_CLASSES)
        if heads.layouts is not None:
            fresh.init_layouts(heads.layouts)
        if (heads.meta() != fresh.meta() or sinks.meta() != self.sinks.meta()
                or positions.meta() != self.positions.meta()
                or not heads.batches_done == sinks.batches_done == positions.batches_done):
            return False
        heads.spec, sinks.spec = self.spec, self.spec
        self.heads, self.sinks, self.positions = heads, sinks, positions
        return True

    def all_reduce(self, world) -> None:
        """Every rank's sums added into each rank's copy (torchrun: each rank folded its shard)."""
        if world is None or world.size == 1:
            return
        import torch
        import torch.distributed as dist

        from bertscope.analyses.heads.positions.command import all_reduce as positions_all_reduce
        from bertscope.engine.distributed import all_reduce_stats

        self.heads = all_reduce_stats(world, self.heads)
        self.positions = positions_all_reduce(world, self.positions)
        dtypes = {name: dtype for name, (_, dtype) in {**S.ARRAYS, **S.NORM_ARRAYS}.items()}
        for name in self.sinks.arrays:  # the norm-based twins' sums too, where the pass has them
            a, dtype = getattr(self.sinks, name), dtypes[name]
            t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            a[...] = t.numpy().astype(dtype)


# --- the per-head table ------------------------------------------------------------------------------


def layer_kind(layout) -> str:
    """A layer's attention in words (the `attention` column): "global"; "window N" for a causal
    sliding window of N keys, the query and the N - 1 before it (Gemma-3's "window 512"); "window ±N
    (2N + 1 keys)" for a bidirectional window of N keys on each side of the query (ModernBERT's local
    layers); "window -L/+R (L + R + 1 keys)" for any other band."""
    if layout.window is None:
        return "global"
    left, right = (int(x) for x in layout.window)
    if right == 0:
        return f"window {left + 1}"
    if left == right:
        return f"window ±{left} ({2 * left + 1} keys)"
    return f"window -{left}/+{right} ({left + right + 1} keys)"


def stream_columns(stream: StreamStats, causal: bool, n_kv_heads: int) -> dict[str, np.ndarray]:
    """The streamed pass's columns, each (Ly, H): read off the three accumulators' own readers."""
    hs = stream.heads
    Ly, H = hs.n_layers, hs.n_heads
    entropy = hs.mean("entropy_sum")  # (Ly, H)
    baseline = hs.layer_uniform_entropy()  # (Ly,) ln of the keys a row sees
    om = hs.mean("offset_mass_sum")  # (Ly, H, O)
    at = {o: om[..., list(hs.spec.offsets).index(o)] for o in OFFSETS}
    sink_rows = S.head_rows(stream.sinks)  # one variant: Ly x H rows, layer-major
    grid = lambda key: np.array([r[key] for r in sink_rows], dtype=float).reshape(Ly, H)  # noqa: E731
    alpha, first, initial, sep = grid("alpha_1"), grid("first_mass"), grid("initial_mass"), grid("sep_mass")
    profile = stream.positions.distance_profile()  # (Ly, H, DB)
    reached = reached_buckets(stream)  # (Ly, DB): the buckets the segments and the layer's window can reach
    cols = {
        "entropy": entropy,
        "entropy_ratio": _div(entropy, np.broadcast_to(baseline[:, None], (Ly, H))),
        "prev_mass": at[-1], "self_mass": at[0], "next_mass": at[1],
        "first_mass": first, "alpha_1": alpha, "initial_mass": initial,
        "sep_mass": np.full((Ly, H), np.nan) if causal else sep,
        "sink_mass": alpha if causal else alpha + sep,
        **sink_norm_columns(stream.sinks, causal),
        "mean_distance": stream.positions.mean_distance(),
        "local_mass": profile[..., :LOCAL_BUCKETS].sum(-1),
        "reach_90": np.array([[_reach(profile[i, h]) for h in range(H)] for i in range(Ly)], dtype=float),
    }
    for b, name in enumerate(P.distance_columns()):  # a bucket no row could reach: NaN ("not reached"), not 0
        cols[name] = np.where(reached[:, None, b], profile[..., b], np.nan)
    cols.update(token_match_columns(hs))
    cols.update(streaming_columns(hs, n_kv_heads))
    return cols


def sink_norm_columns(sinks: S.SinkStats, causal: bool) -> dict[str, np.ndarray]:
    """Per head (Ly, H), the norm-based twins of the sink masses (docs/norms.md), read off `SinkStats` as
    sinks.csv reads them: `alpha_1_norm`, `first_mass_norm`, `sep_mass_norm` (NaN for a decoder) and
    `sink_mass_norm`, what the no-op-sink type reads (the twin of `sink_mass`: alpha_1_norm for a decoder,
    alpha_1_norm + sep_mass_norm for an encoder). NaN where the pass computed no norms."""
    alpha = sinks.alpha_norm(0)  # (Ly, H)
    classes = sinks.class_norm(0)  # (Ly, H, C)
    first, sep = classes[..., S.FIRST], classes[..., S.SEP]
    return {"alpha_1_norm": alpha, "first_mass_norm": first,
            "sep_mass_norm": np.full(alpha.shape, np.nan) if causal else sep,
            "sink_mass_norm": alpha if causal else alpha + sep}


LOCAL_BUCKETS = 4  # the distance buckets 0, 1, 2-3, 4-7: distance below 8


def reached_buckets(stream: StreamStats) -> np.ndarray:
    """(Ly, DB) bool: whether any row of the pass could put mass in each log2 distance bucket of each
    layer. A row at position p (from the segment's first token) sees distances 0 .. p, a layer whose
    window reaches w keys to a side at most w, so a bucket is reached when its smallest distance is at
    most min(the last position of any segment, the window). The last position is read off the
    sinks' rows per log2 position bucket, whose edges are the distance buckets' (0, 1, 2-3, 4-7, ...):
    bucket b is reached when some row lies in position bucket b or beyond. A pass of 1,024-token
    segments reaches 512-1023 and no bucket after it: those read NaN, not a measured 0."""
    from bertscope.kernels.spec import N_DISTANCE_BUCKETS

    rows = np.asarray(stream.sinks.rows_bucket[0], dtype=float)  # (NB,) rows per position bucket
    seen = np.flatnonzero(rows > 0)
    last_bucket = int(seen[-1]) if seen.size else -1
    lows = np.array([lo for lo, _ in P.bucket_bounds()])  # (DB,) each distance bucket's smallest distance
    out = np.zeros((stream.positions.n_layers, N_DISTANCE_BUCKETS), bool)
    for layer, w in enumerate(stream.positions.windows):
        out[layer] = np.arange(N_DISTANCE_BUCKETS) <= last_bucket
        if w is not None:
            out[layer] &= lows <= w
    return out


def _reach(profile: np.ndarray) -> float:
    r = P.reach(profile, 0.9)
    return math.nan if r is None else float(r)


def probe_columns(shape, induction: dict | None = None, retrieval: np.ndarray | None = None,
                  importance=None) -> dict[str, np.ndarray]:
    """The probes' columns, each (Ly, H), NaN for a probe not run (an encoder's retrieval and importance)."""
    nan = np.full(shape, np.nan)
    induction = induction or {}
    return {"induction_score": induction.get("induction", nan), "duplicate_score": induction.get("duplicate", nan),
            "previous_score": induction.get("previous", nan),
            "retrieval_score": nan if retrieval is None else retrieval,
            "importance": nan if importance is None else importance.scores,
            "importance_raw": nan if importance is None else importance.raw}


def retrieval_column(grid) -> np.ndarray | None:
    """The retrieval_score column from the probe's `GridScores`: Wu et al.'s score, a mean over the
    answered haystacks only, when at least `head_types.MIN_ANSWERED` were answered; else None (the
    column is NaN, "not measured": a score over haystacks the model did not answer is not theirs)."""
    from bertscope.analyses.atlas.head_types import MIN_ANSWERED

    return np.asarray(grid.answered, dtype=float) if grid.n_answered >= MIN_ANSWERED else None


def head_table(model: str, kinds: list[str], n_kv_heads: int, columns: dict[str, np.ndarray]) -> dict[str, list]:
    """The per-head table, one entry per column of `outputs.COLUMNS` (and the distance profile), each a
    list in layer-major order, with the types (`head_types.assign`) appended."""
    from bertscope.analyses.atlas import head_types as T

    Ly, H = next(iter(columns.values())).shape
    g = H // max(1, n_kv_heads)
    table: dict[str, list] = {
        "model": [model] * (Ly * H),
        "layer": [i + 1 for i in range(Ly) for _ in range(H)],
        "head": [h + 1 for _ in range(Ly) for h in range(H)],
        "kv_head": [h // g + 1 for _ in range(Ly) for h in range(H)],
        "attention": [kinds[i] for i in range(Ly) for _ in range(H)],
    }
    for name, grid in columns.items():
        table[name] = [float(x) for x in np.asarray(grid, dtype=float).reshape(-1)]
    flat = {k: np.asarray(v, dtype=float) for k, v in table.items() if k not in ("model", "attention")}
    types = T.assign(flat)
    table["types"] = T.type_strings(types)
    for name in T.TYPES:
        table[f"type_{name}"] = [int(x) for x in types[name]]
    return table


def type_columns() -> tuple[str, ...]:
    from bertscope.analyses.atlas import head_types as T

    return tuple(f"type_{name}" for name in T.TYPES)


def column_order() -> tuple[str, ...]:
    """Every column of atlas_heads.csv in order: `outputs.COLUMNS`, the distance profile, the type flags."""
    from bertscope.analyses.atlas.outputs import COLUMNS

    names = list(COLUMNS)
    at = names.index("reach_90") + 1
    return tuple(names[:at] + list(P.distance_columns()) + names[at:]) + type_columns()


def rows_of(table: dict[str, list]) -> list[dict]:
    n = len(table["layer"])
    return [{k: v[i] for k, v in table.items()} for i in range(n)]


def csv_cells(rows: list[dict]) -> list[dict]:
    """Rows as the CSV files write them: every float at full precision (Python's repr, the shortest text
    that reads back as the same float64, so the CSV and the Parquet file hold the same values), a NaN
    as an empty cell; text and integers as they are."""
    def cell(v):
        if isinstance(v, float):  # numpy's float64 too
            return "" if math.isnan(v) else repr(float(v))
        return v
    return [{k: cell(v) for k, v in r.items()} for r in rows]


def layer_rows(table: dict[str, list], corpus_rows: dict[str, list[int]] | None = None) -> list[dict]:
    """One row per layer: the mean over its heads of the profile columns, its heads of each type, and
    (`corpus_rows`, from `token_match_rows`) the rows of the corpus that its duplicate and prefix-match
    masses average over, one count per layer (empty where not computed)."""
    from bertscope.analyses.atlas import head_types as T

    rows = []
    layers = np.asarray(table["layer"])
    for k, layer in enumerate(sorted(set(table["layer"]))):
        sel = layers == layer
        row = {"layer": int(layer), "attention": table["attention"][int(np.argmax(sel))]}
        for name in LAYER_MEANS:
            x = np.asarray(table[name], dtype=float)[sel]
            row[name] = float(np.nanmean(x)) if np.isfinite(x).any() else math.nan
        for name in T.TYPES:
            row[f"n_{name}"] = int(np.asarray(table[f"type_{name}"])[sel].sum())
        for name in LAYER_ROWS:
            row[name] = corpus_rows[name][k] if corpus_rows else math.nan
        rows.append(row)
    return rows


LAYER_MEANS = ("entropy_ratio", "prev_mass", "first_mass", "sink_mass", "sink_mass_norm", "mean_distance",
               "local_mass", "induction_score", "retrieval_score", "streaming_error", "importance")
LAYER_ROWS = ("duplicate_rows", "prefix_match_rows")  # per layer, not per head: see `token_match_rows`


def layer_columns() -> tuple[str, ...]:
    from bertscope.analyses.atlas import head_types as T

    return ("layer", "attention", *LAYER_MEANS, *(f"n_{name}" for name in T.TYPES), *LAYER_ROWS)


def write_state(path: Path, state: dict) -> None:
    write_text(path, json.dumps(state, indent=1))


def read_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), np.nan)
