"""What the attention-statistics kernels compute: one spec, several backends.

Every backend (`eager`, `chunked`, `triton`) takes the same inputs and returns the
same `RowStats`: statistics of each attention *row* (one query token of one head), never
the L x L map itself. Each statistic is declared once, in the table `ROW_STATS` below (name,
shape, dtype, the `StatsSpec` switch that asks for it, the value of a padding row and of a
removed head, its segment sums); `StatsSpec` and `RowStats` are written out with one field per
switch and per entry (tests/kernels/test_stats_table.py checks them against the table and says
what to add), and the plumbing around the backends (float32 cast, padding, head slots, segment
sums, `HeadStats`, the selftest) is built from it; docs/contributing.md walks through adding one.
Reducing rows to per-head sums is the accumulators' job (`bertscope.engine.accumulate`), so a
backend stays a pure function of (q, k, v, masks).

Shapes used throughout:
    B batch, H heads, L padded sequence length, D head dimension,
    O number of relative offsets, C number of key classes (named classes + "other"),
    DB distance buckets (17), PB position bins (11): fixed widths, `FIXED_WIDTHS`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
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
    streaming: (H,) or (B, H) bool, or None for none: heads restricted to StreamingLLM's
             attention sink + recent window (`streaming_span`: (sink, recent)); such a head's
             output becomes xi_h * o_L,h, its attention over the first `sink` keys and the last
             `recent` ones only (`kernels.streaming`, applied after every backend). DuoAttention's
             "streaming heads"; a head both uniform and streaming is streaming.
    Statistics are always those of the head's own, un-gated attention: a gate changes what
    the head passes on to later layers, not what we report it attends to.
    """

    xi: torch.Tensor | None = None
    uniform: torch.Tensor | None = None
    streaming: torch.Tensor | None = None
    streaming_span: tuple = ()

    @classmethod
    def from_codes(cls, codes) -> LayerGates:
        """Gates from one `Gate` per head."""
        codes = torch.as_tensor([int(c) for c in codes])  # (H,)
        return cls(xi=(codes != Gate.ZERO).float(), uniform=codes == Gate.UNIFORM)

    @property
    def is_identity(self) -> bool:
        return self.xi is None and self.uniform is None and self.streaming is None


# --- the statistics: one table ------------------------------------------------------------


@dataclass(frozen=True)
class KeyBlock:
    """What a per-row statistic's definition (`RowStat.from_probs`) may read beside a block of
    probabilities: the keys k0 .. k0 + bk - 1 of one sequence.

    valid:  (bk,) bool, False for padding keys
    klass:  (bk,) int64 key classes in [0, spec.n_key_classes)
    length: L, the padded sequence length (positions i0 + r and k0 + c are indices of it)
    spec:   the `StatsSpec` of the call (offsets, number of classes, ...)
    ids:    (L,) int64 token ids of the whole sequence (queries and keys are the same tokens),
            -1 on padding positions (`padded_ids`), or None when the call has none; the whole
            row, not the block's keys, because a token relation compares a query's id (i0 + r)
            with a key's (k0 + c) or with its predecessor's (k0 + c - 1, outside the block for c = 0)
    norms:  (n, bk) the block's keys' value norms n_j = ||f_h(x_j)|| for each of the n heads of p's rows
            (`spec.norms`, Kobayashi et al. 2020; `kernels.norms`), or None when the call has none
    """

    valid: torch.Tensor
    klass: torch.Tensor
    length: int
    spec: StatsSpec
    ids: torch.Tensor | None = None
    norms: torch.Tensor | None = None


# Each per-row statistic is defined once, as a function of a block of probabilities:
#     f(p, i0, k0, keys) -> (n, bq, ...)
# p (n, bq, bk): n heads' probability rows of queries i0 .. i0 + bq - 1 against keys k0 .. k0 + bk - 1
# of one sequence; every key a row may see lies inside the block and the others have p = 0, so a
# row is complete. The eager oracle calls it on whole maps (i0 = k0 = 0, bk = L); the chunked
# backend on each query block of a causal / windowed layout, so a statistic that depends on the
# positions i and j (a distance, a band edge) is written here once and holds on every layout.


def _entropy(p, i0, k0, keys):
    return -torch.special.xlogy(p, p).sum(-1)  # (n, bq); 0 ln 0 = 0


def _offset_mass(p, i0, k0, keys):
    n, bq, bk = p.shape
    i = torch.arange(i0, i0 + bq, device=p.device)[:, None]  # (bq, 1) query positions
    j = i + torch.tensor(keys.spec.offsets, dtype=torch.long, device=p.device)[None, :]  # (bq, O) key positions
    inside = (j >= 0) & (j < keys.length) & (j >= k0) & (j < k0 + bk)  # outside the block: p = 0
    picked = p.gather(-1, (j - k0).clamp(0, max(bk - 1, 0)).expand(n, bq, -1))  # (n, bq, O): p[i, i + o]
    return torch.where(inside, picked, torch.zeros_like(picked))


def _class_mass(p, i0, k0, keys):
    one_hot = torch.nn.functional.one_hot(keys.klass, keys.spec.n_key_classes).to(p.dtype)  # (bk, C)
    return torch.matmul(p, one_hot)  # (n, bq, C)


def _argmax(p, i0, k0, keys):
    return p.argmax(-1) + k0  # (n, bq) absolute key positions, first maximum on ties


# Query-key distance |i - j| in log2 buckets: 0, 1, 2-3, 4-7, ..., 16384-32767, then 32768 and beyond.
# A bucket's index is the number of edges <= d, so bucket b >= 1 holds 2^(b-1) <= d < 2^b (exact integer
# comparisons: no log of a float in any backend).
DISTANCE_EDGES = tuple(2**e for e in range(16))  # 1, 2, 4, ..., 32768
N_DISTANCE_BUCKETS = len(DISTANCE_EDGES) + 1  # 17
# A key's place in the context its query reads, [0, i]: bin floor(N j / (i + 1)) of N equal bins (deciles);
# keys after the query (bidirectional layouts only) go to one more bin.
N_POSITION_BINS = 10
N_POSITION_BUCKETS = N_POSITION_BINS + 1  # 11: ten bins of [0, i], then "after the query"
# the table's fixed widths (the others, O and C, come from the spec)
FIXED_WIDTHS = {"DB": N_DISTANCE_BUCKETS, "PB": N_POSITION_BUCKETS}


def distance_bucket_names() -> list[str]:
    """Column names of the distance buckets: "0", "1", "2-3", ..., "16384-32767", "32768+"."""
    pairs = zip(DISTANCE_EDGES, DISTANCE_EDGES[1:])
    names = ["0"] + [str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in pairs]
    return names + [f"{DISTANCE_EDGES[-1]}+"]


def position_bin_names() -> list[str]:
    """Column names of the position bins: "0-10%", ..., "90-100%", "after" (keys after the query)."""
    step = 100 // N_POSITION_BINS
    return [f"{b * step}-{(b + 1) * step}%" for b in range(N_POSITION_BINS)] + ["after"]


def _block_positions(p, i0, k0):
    """(i (bq, 1), j (1, bk)): the query and key positions of a block."""
    _, bq, bk = p.shape
    i = torch.arange(i0, i0 + bq, device=p.device)[:, None]  # (bq, 1)
    j = torch.arange(k0, k0 + bk, device=p.device)[None, :]  # (1, bk)
    return i, j


def _token_match_mass(p, i0, k0, keys, shift: int):
    """(n, bq): each row's mass on the keys j whose token at j - shift is the query's own token, j - shift
    >= 0 (shift 0: j < i, the earlier copies of the query's token; shift 1: j <= i, the keys right after
    one). Padding ids are -1 (`padded_ids`): a padding key, or one whose predecessor is padding, never
    matches."""
    if keys.ids is None:
        raise ValueError("spec.token_relations needs the batch's token ids (token_ids=...)")
    i, j = _block_positions(p, i0, k0)
    query = keys.ids[i0:i0 + p.shape[1], None]  # (bq, 1) the rows' tokens
    src = j - shift  # (1, bk) the position whose token is compared
    key = torch.where(src >= 0, keys.ids[src.clamp_min(0)], -1)  # (1, bk)
    match = (key == query) & (query >= 0) & (j < i + shift)  # (bq, bk)
    return (p * match.to(p.dtype)).sum(-1)


def _duplicate_mass(p, i0, k0, keys):
    return _token_match_mass(p, i0, k0, keys, 0)  # (n, bq) sum over j < i, ids[j] == ids[i]


def _prefix_match_mass(p, i0, k0, keys):
    return _token_match_mass(p, i0, k0, keys, 1)  # (n, bq) sum over 1 <= j <= i, ids[j - 1] == ids[i]


def padded_ids(token_ids: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """(B, L) int64: the token ids with every padding position -1, an id no token has, so that no
    relation runs through padding (a key after a left-padding run does not match through its padding
    predecessor). Token ids are >= 0."""
    return torch.where(key_valid, token_ids.to(key_valid.device).long(), -1)


def token_relation_rows(token_ids: torch.Tensor, key_valid: torch.Tensor,
                        layout: AttentionLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(duplicate (B, L) bool, prefix (B, L) bool): the real rows that have at least one visible real
    key for `duplicate_mass` (j < i, ids[j] == ids[i]) and for `prefix_match_mass` (j <= i, j - 1 real,
    ids[j - 1] == ids[i]). Exact from the ids and the layout, no attention: O(L log L), no map.

    With m(i) the last earlier position that could serve (real, holding ids[i]; for prefix also with
    m + 1 real), a row is eligible iff m(i) exists and its key, m(i) (duplicate) or m(i) + 1 (prefix),
    is at or after lo(i), the first key the layout lets row i see: the key is <= i <= hi(i) anyway,
    and the latest candidate is the one most inside the band. Found by a sorted search of
    id * (L + 1) + position (tests/kernels/test_token_relations.py checks it against brute force)."""
    B, L = key_valid.shape
    ids = padded_ids(token_ids, key_valid)  # (B, L)
    pos = torch.arange(L, device=ids.device)
    lo = layout.key_band(pos, L)[0]  # (L,)
    after_real = torch.cat([key_valid[:, 1:], key_valid.new_zeros(B, 1)], dim=-1)  # (B, L): position m + 1 is real
    out = []
    for usable, shift in ((key_valid, 0), (key_valid & after_real, 1)):
        keyed = torch.where(usable, ids * (L + 1) + pos, -1)  # (B, L) candidates m; -1: none
        ordered, order = keyed.sort(-1)  # (B, L)
        want = ids * (L + 1) + pos  # (B, L) a query's own key: candidates of its id before it sort below
        at = torch.searchsorted(ordered, want) - 1  # (B, L) the largest candidate below it
        found = ordered.gather(-1, at.clamp_min(0))  # (B, L)
        m = order.gather(-1, at.clamp_min(0))  # (B, L) its position
        ok = (at >= 0) & (found >= 0) & (torch.div(found, L + 1, rounding_mode="floor") == ids)
        out.append(ok & key_valid & (m + shift >= lo))
    return out[0], out[1]


def _bucket_sums(p, bucket, n_buckets):
    """(n, bq, n_buckets): the mass of each row on the keys of each bucket; bucket (bq, bk) int64."""
    n, bq, bk = p.shape
    return p.new_zeros(n, bq, n_buckets).scatter_add_(-1, bucket.expand(n, bq, bk), p)


def _distance_mass(p, i0, k0, keys):
    i, j = _block_positions(p, i0, k0)
    edges = torch.tensor(DISTANCE_EDGES, device=p.device)
    return _bucket_sums(p, torch.bucketize((i - j).abs(), edges, right=True), N_DISTANCE_BUCKETS)  # (n, bq, DB)


def _mean_distance(p, i0, k0, keys):
    i, j = _block_positions(p, i0, k0)
    return (p * (i - j).abs().to(p.dtype)).sum(-1)  # (n, bq) sum_j p_ij |i - j|


def _position_mass(p, i0, k0, keys):
    i, j = _block_positions(p, i0, k0)
    bins = torch.where(j <= i, torch.div(N_POSITION_BINS * j, i + 1, rounding_mode="floor"), N_POSITION_BINS)
    return _bucket_sums(p, bins, N_POSITION_BUCKETS)  # (n, bq, PB)



# --- norm-based twins (Kobayashi, Kuribayashi, Yokoi, Inui, EMNLP 2020; docs/norms.md) -------------
# A mass statistic is linear in the row's weights p_ij. Its norm-based twin is the same statistic of
# the row's weights p_ij n_j / sum_j p_ij n_j, with n_j = ||f_h(x_j)|| the norm of key j's value
# vector after the head's slice of the output projection (`kernels.norms`): the share of the row's
# weighted vector sum_j p_ij f_h(x_j) that the keys of a class (an offset, a bucket...) contribute,
# by norm. `weighted_norm` is the row's sum_j p_ij n_j itself.


def norm_weights(p, keys):
    """(n, bq, bk): p_ij n_j / sum_j p_ij n_j over the row (0 on a row whose sum is 0: every key it
    sees has a zero value vector). Padding keys count 0 whatever their norm."""
    if keys.norms is None:
        raise ValueError("spec.norms needs the per-key value norms (norms=...)")
    n = torch.where(keys.valid, keys.norms.to(p.dtype), 0)  # (n, bk)
    w = p * n[:, None, :]  # (n, bq, bk)
    total = w.sum(-1, keepdim=True)  # (n, bq, 1)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1), 0)


def _weighted_norm(p, i0, k0, keys):
    if keys.norms is None:
        raise ValueError("spec.norms needs the per-key value norms (norms=...)")
    n = torch.where(keys.valid, keys.norms.to(p.dtype), 0)  # (n, bk)
    return torch.matmul(p, n[:, :, None])[..., 0]  # (n, bq) sum_j p_ij n_j


@dataclass(frozen=True)
class _Twin:
    """The definition of a twin: its base's definition on the norm-based weights (picklable)."""

    base: Callable

    def __call__(self, p, i0, k0, keys):
        return self.base(norm_weights(p, keys), i0, k0, keys)


@functools.cache
def offsets_on(offsets: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The offsets (O,) int64 on `device`, copied there once, not on every layer of every batch (on a
    GPU a copy from a Python list waits for the device)."""
    with torch.inference_mode(False):  # usable in and out of inference mode
        return torch.tensor(offsets, dtype=torch.long, device=device)


def _argmax_rows(am, key_class, spec):
    """Rows whose argmax key is at each offset (then "elsewhere"), and of each key class:
    0/1 per row, NaN on a removed head's rows (argmax -1)."""
    missing = (am < 0)[..., None]  # (B, H, L, 1) a removed head's rows (bertscope.models.head_removal)
    am = am.clamp_min(0)  # (B, H, L)
    rel = am - torch.arange(am.shape[-1], device=am.device)  # (B, H, L) offset of the argmax key
    at = rel[..., None] == offsets_on(tuple(spec.offsets), am.device)  # (B, H, L, O)
    at = torch.cat([at, ~at.any(-1, keepdim=True)], dim=-1).double()  # (B, H, L, O+1)
    cls = key_class[:, None, :].expand_as(am).gather(-1, am)  # (B, H, L) class of the argmax key
    one_hot = torch.nn.functional.one_hot(cls, spec.n_key_classes).double()  # (B, H, L, C)
    return {"argmax_offset": at.masked_fill(missing, float("nan")),
            "argmax_class": one_hot.masked_fill(missing, float("nan"))}


@dataclass(frozen=True)
class SegmentSum:
    """One per-segment sum a row statistic feeds (`BatchContext.segment_sums`) and the
    `HeadStats` array that adds it up over a corpus, (layers, H, G, *width)."""

    name: str  # the segment_sums key
    array: str  # the HeadStats attribute
    width: tuple[str, ...] = ()  # symbolic trailing shape: () one number per row; ("O",), ("O+1",), ("C",)


@dataclass(frozen=True)
class KernelTraits:
    """How the fused Triton kernel (`triton_kernel.attn_stats_fwd`) computes one statistic: read by the
    launch and its config (`triton_config.kernel_config`), the ahead-of-time matrix (`triton_aot`) and the
    kernel-switch bookkeeping, so that none of them lists statistics by name.

    kind:      how its sum over keys is taken in the loop, which is what it costs there:
               "by_dot"    a column of the key-feature dot P @ U on the tensor cores (no work per score);
               "per_score" a term of the online softmax's state, updated per score (the entropy's T, the argmax);
               "per_bucket" a masked row sum per bucket or bin a key block reaches (the position statistics);
               "per_relation" one compare and select per score and relation (the token relations);
               "epilogue"  from the final state after the loop (the offsets' p_{i, i+o}: no loop work)
    switch:    the kernel's constexpr that compiles it in (None: always there when asked, an epilogue loop
               over a runtime count)
    reads:     the operands beyond Q, K, V and the key mask it needs: "key_features" (U), "positions" (the
               rows' and keys' indices), "token_ids", "offsets", "value_norms" (the norm features U n:
               the key classes scaled by each key's value norm, and the norm itself, per query head)
    accumulator: its running state per stacked row, in the kernel's terms ("" for none)
    tiles:     the tile family its registers call for (`triton_config.forward_config`'s precedence): "default"
               (the widest tiles of `TILES`' "default" kind), "wide" (a 64-column dot or an index: BLOCK_N <= 64),
               "positions", "tokens", "norms" (the norm-based twins: a second (BLOCK_M, NORM_F) dot accumulator)
    second_pass: it needs a pass over the keys after the loop (none does today: the uniform gate's pass is
               the gates', not a statistic's)
    registers: fp32 values per stacked row its accumulator holds through the loop (the register weight)
    """

    kind: str
    switch: str | None
    reads: tuple[str, ...] = ()
    accumulator: str = ""
    tiles: str = "default"
    second_pass: bool = False
    registers: int = 1


# KernelTraits' values, checked by the table's tests
KERNEL_KINDS = ("by_dot", "per_score", "per_bucket", "per_relation", "epilogue")
KERNEL_READS = ("key_features", "positions", "token_ids", "offsets", "value_norms")
KERNEL_TILES = ("default", "wide", "positions", "tokens", "norms")
# where the backends compute a statistic (`RowStat.pass_kind`)
PASS_KINDS = ("row", "blocks", "norm", "maps", "streaming")


@dataclass(frozen=True)
class RowStat:
    """One statistic every backend computes when `StatsSpec` asks for it.

    name:    the `RowStats` attribute (and the name analyses read)
    shape:   symbolic shape; B batch, H heads, L positions, O offsets, C key classes, W word units
    switch:  the `StatsSpec` field that asks for it (any true value: True, a non-empty tuple)
    dtype:   "float" (the input's dtype; widened to float32 by `RowStats.as_float32` before
             any accumulator sees it) or "int64"
    removed: the value a removed head's slot holds (`head_removal.spread_heads`): NaN for a
             float, -1 for an index
    padding: the value rows of padding queries are set to (`common.zero_padding_rows`), or
             None when the statistic is not per query row (column mass is per key, word maps
             per unit: padding is already 0 / -1 there)
    from_probs: its definition, f(p, i0, k0, keys: KeyBlock) -> (n, bq, ...) per row of a block of
             probabilities (above); the eager oracle and the chunked backend compute it from this
             unless they fuse it into their row pass. None: a whole-map statistic (column mass,
             word maps), defined in `kernels.reference`.
    rows:    per-row values of its segment sums, f(t, key_class, spec) -> {name: (B, H, L, F)};
             None: the value itself, (B, H, L) -> (B, H, L, 1), (B, H, L, F) as it is
    sums:    the `SegmentSum`s it feeds (none: not summed per segment, read by its analyses)
    doc:     one line on what it is (the `RowStats` attribute's docstring says it too, with the shape)
    twin_of: for a norm-based twin (`<base>_norm`, switch `norms`), the entry it is the twin of: asked
             when `norms` and the base are, defined as the base on the norm-based weights (`norm_twin`)
    backends: the backends that compute it, None for every one; any other refuses a spec that asks for
             it in one line before it runs (`unsupported_stats`), and the generated tests skip it there
    kernel:  its traits in the fused Triton kernel (`KernelTraits`); None where the kernel does not write it
             (the whole-map statistics come from `triton_maps`' second pass, streaming from its own pass)
    pass_kind: where the backends compute it: "row" (in the row pass: both of chunked's, `cpu_rows.c` and
             torch's, and the fused Triton kernel), "blocks" (its `from_probs` on each block of probabilities
             on the CPU; in the kernel's loop, `kernel`), "norm" (chunked's norm pass: one matmul against the
             keys' norms), "maps" (from the whole map: eager's, chunked's `_Maps`, `triton_maps`' second pass),
             "streaming" (from the head's output against its streaming set, `kernels.streaming`)
    twinned: a mass statistic with a norm-based twin (`norm_twin`, docs/norms.md)
    meta:    whether `HeadStats.meta` records its switch always (files written before the switch was
             optional keep it), or only when on (False: an older file without it reads as off)
    """

    name: str
    shape: tuple[str, ...]
    switch: str
    dtype: str = "float"
    removed: float = float("nan")
    padding: float | None = 0.0
    from_probs: Callable | None = None
    rows: Callable | None = None
    sums: tuple[SegmentSum, ...] = ()
    doc: str = ""
    twin_of: RowStat | None = field(default=None, repr=False)
    backends: tuple[str, ...] | None = None
    kernel: KernelTraits | None = None
    pass_kind: str = "blocks"
    meta: bool = False
    twinned: bool = False

    def asked(self, spec: StatsSpec) -> bool:
        if self.twin_of is not None:  # a twin: its switch (norms: every twin, or its base's name), and its base
            norms = getattr(spec, self.switch)
            return (norms is True or self.twin_of.name in (norms or ())) and self.twin_of.asked(spec)
        return bool(getattr(spec, self.switch))

    def computed_by(self, backend: str) -> bool:
        """Whether `backend` ("eager", "chunked", "triton") computes it (`backends`)."""
        return self.backends is None or backend in self.backends

    def segment_rows(self, t: torch.Tensor, key_class: torch.Tensor, spec: StatsSpec) -> dict:
        """{sum name: (B, H, L, F)} per-row values of each of its segment sums."""
        if self.rows is not None:
            return self.rows(t, key_class, spec)
        return {self.sums[0].name: t[..., None] if t.dim() == 3 else t}


ROW_STATS: tuple[RowStat, ...] = (
    RowStat("entropy", ("B", "H", "L"), "entropy", from_probs=_entropy,
            sums=(SegmentSum("entropy", "entropy_sum"),), pass_kind="row", meta=True,
            kernel=KernelTraits("per_score", "ENTROPY", accumulator="T: (BLOCK_M,), or (BLOCK_M, D) as q . (P K)"),
            doc="-sum_j p_ij ln p_ij, nats"),
    RowStat("offset_mass", ("B", "H", "L", "O"), "offsets", from_probs=_offset_mass, twinned=True,
            sums=(SegmentSum("offset_mass", "offset_mass_sum", ("O",)),), pass_kind="row",
            kernel=KernelTraits("epilogue", None, reads=("offsets",), registers=0),
            doc="p_{i, i+o} for each o in spec.offsets (0 when i+o is outside the sequence or a padding key)"),
    RowStat("class_mass", ("B", "H", "L", "C"), "class_mass", from_probs=_class_mass, twinned=True,
            sums=(SegmentSum("class_mass", "class_mass_sum", ("C",)),), pass_kind="row", meta=True,
            kernel=KernelTraits("by_dot", "CLASS_MASS", reads=("key_features",), accumulator="(BLOCK_M, F_PAD)",
                                registers=16),
            doc="sum of p_ij over keys j of each class"),
    RowStat("argmax", ("B", "H", "L"), "argmax", dtype="int64", removed=-1, from_probs=_argmax,
            rows=_argmax_rows,
            sums=(SegmentSum("argmax_offset", "argmax_offset_count", ("O+1",)),
                  SegmentSum("argmax_class", "argmax_class_count", ("C",))), pass_kind="row", meta=True,
            kernel=KernelTraits("per_score", "ARGMAX", reads=("positions",), accumulator="(BLOCK_M,) int32",
                                tiles="wide"),
            doc="index of the most-attended key (ties: lowest index)"),
    RowStat("distance_mass", ("B", "H", "L", "DB"), "distance", from_probs=_distance_mass, twinned=True,
            kernel=KernelTraits("per_bucket", "DISTANCE_MASS", reads=("positions",), accumulator="(BLOCK_M, DB_PAD)",
                                tiles="positions", registers=32),
            doc="sum of p_ij over keys at distance |i - j| in each log2 bucket (DISTANCE_EDGES)"),
    RowStat("mean_distance", ("B", "H", "L"), "distance", from_probs=_mean_distance,
            kernel=KernelTraits("per_score", "MEAN_DISTANCE", reads=("positions",), accumulator="(BLOCK_M,)",
                                tiles="positions"),
            doc="sum_j p_ij |i - j|: how far back (or ahead) the row reads, in tokens"),
    RowStat("position_mass", ("B", "H", "L", "PB"), "position_mass", from_probs=_position_mass, twinned=True,
            kernel=KernelTraits("per_bucket", "POSITION_MASS", reads=("positions",), accumulator="(BLOCK_M, PB_PAD)",
                                tiles="positions", registers=16),
            doc="sum of p_ij over keys j <= i in each bin floor(10 j / (i + 1)) of the row's context, then j > i"),
    RowStat("duplicate_mass", ("B", "H", "L"), "token_relations", from_probs=_duplicate_mass, twinned=True,
            sums=(SegmentSum("duplicate_mass", "duplicate_mass_sum"),),
            kernel=KernelTraits("per_relation", "DUPLICATE_MASS", reads=("positions", "token_ids"),
                                accumulator="(BLOCK_M,)", tiles="tokens"),
            doc="sum of p_ij over earlier keys j < i holding the query's own token (ids[j] == ids[i])"),
    RowStat("prefix_match_mass", ("B", "H", "L"), "token_relations", from_probs=_prefix_match_mass, twinned=True,
            sums=(SegmentSum("prefix_match_mass", "prefix_match_mass_sum"),),
            kernel=KernelTraits("per_relation", "PREFIX_MATCH_MASS", reads=("positions", "token_ids"),
                                accumulator="(BLOCK_M,)", tiles="tokens"),
            doc="sum of p_ij over keys 1 <= j <= i whose previous token is the query's (ids[j - 1] == ids[i])"),
    RowStat("column_mass", ("B", "H", "L"), "column_mass", padding=None, pass_kind="maps",
            doc="sum over valid query rows i of p_ij: mass key j receives"),
    RowStat("word_map", ("B", "H", "W", "W"), "word_maps", padding=None, pass_kind="maps",
            doc="word-level map (see `WordPooling`); rows of real units sum to 1"),
    RowStat("word_argmax", ("B", "H", "W"), "word_maps", dtype="int64", removed=-1, padding=None, pass_kind="maps",
            doc="most-attended *other* candidate unit of each unit (ties: lowest index), -1 when there is none"),
    RowStat("streaming_error_sq", ("B", "H", "L"), "streaming", pass_kind="streaming",
            sums=(SegmentSum("streaming_error_sq", "streaming_error_sq_sum"),),
            doc="||o_i - o_L,i||^2: the head's un-gated output against its output over the streaming set "
                "(sink + recent, `kernels.streaming`); exactly 0 where every visible key is streaming"),
    RowStat("output_sq", ("B", "H", "L"), "streaming", pass_kind="streaming",
            sums=(SegmentSum("output_sq", "output_sq_sum"),),
            doc="||o_i||^2 of the head's un-gated output: the denominator of the relative streaming error"),
)
def _twin_traits(base: RowStat) -> KernelTraits:
    """The kernel traits of `base`'s norm-based twin: the base's kind, under a switch of its own
    (CLASS_MASS_NORM), reading the norm features (`triton_launch.norm_features`), whose dot `weighted_norm`'s
    switch WEIGHTED_NORM compiles in (asked with any twin: its last column is every twin's denominator). A by-dot
    base's twin is one more column of that dot, P @ (U n); an epilogue base's, its p_{i, i+o} times n_{i+o}; a
    base summed per score or bucket sums p_ij n_ij beside p_ij (one FMUL per score, the base's work again)."""
    per_score = base.kernel.kind not in ("by_dot", "epilogue")
    return KernelTraits(base.kernel.kind, f"{base.name.upper()}_NORM", reads=base.kernel.reads + ("value_norms",),
                        accumulator=base.kernel.accumulator if per_score else
                        "(BLOCK_M, NORM_F), shared by the twins" if base.kernel.kind == "by_dot" else "",
                        tiles="norms", registers=base.kernel.registers if per_score else 0)


def norm_twin(base: RowStat) -> RowStat:
    """`<base>_norm`: the norm-based twin of a mass statistic (switch `norms`, asked with its base). The twins
    of the statistics chunked's row pass fuses come from its norm pass (one matmul of P against the keys' norms:
    the class twins, and the offsets' read off the offset masses), the others from their definitions; the fused
    kernel computes every twin (`_twin_traits`)."""
    return RowStat(f"{base.name}_norm", base.shape, "norms", from_probs=_Twin(base.from_probs),
                   pass_kind="norm" if base.pass_kind == "row" else "blocks",
                   sums=tuple(SegmentSum(f"{m.name}_norm", f"{m.array.removesuffix('_sum')}_norm_sum", m.width)
                              for m in base.sums),
                   doc=f"the norm-based share of {base.name}: {base.name} of p_ij n_j / sum_j p_ij n_j",
                   twin_of=base, kernel=_twin_traits(base))


# the mass statistics that have a norm-based twin (`twinned`), in the table's order
NORM_TWINNED = tuple(s.name for s in ROW_STATS if s.twinned)
ROW_STATS += tuple(norm_twin(s) for s in ROW_STATS if s.twinned) + (
    RowStat("weighted_norm", ("B", "H", "L"), "norms", from_probs=_weighted_norm, pass_kind="norm",
            sums=(SegmentSum("weighted_norm", "weighted_norm_sum"),),
            kernel=KernelTraits("by_dot", "WEIGHTED_NORM", reads=("value_norms",), accumulator="the norm features' sum "
                                "column", tiles="norms", registers=16),
            doc="sum_j p_ij n_j: the norm of the row's weighted value vectors' contributions, ||f|| weighted"),
)
STAT = {s.name: s for s in ROW_STATS}


def kernel_stats(tiles: str | None = None) -> tuple[str, ...]:
    """The statistics the fused Triton kernel compiles in by a switch (`KernelTraits.switch`), in the
    table's order; with `tiles`, those of one tile family ("default": what `bertscope run` asks, the
    instruction budget's own tiles; "wide", "positions", "tokens")."""
    return tuple(s.name for s in ROW_STATS if s.kernel is not None and s.kernel.switch is not None
                 and (tiles is None or s.kernel.tiles == tiles))
SEGMENT_SUMS: tuple[SegmentSum, ...] = tuple(m for s in ROW_STATS for m in s.sums)


def asked_stats(spec: StatsSpec) -> tuple[RowStat, ...]:
    """The table's statistics that `spec` asks for, in table order."""
    return tuple(s for s in ROW_STATS if s.asked(spec))


def unsupported_stats(spec: StatsSpec, backend: str) -> list[str]:
    """The statistics `spec` asks for that `backend` does not compute (the table's `backends`)."""
    return [s.name for s in ROW_STATS if s.asked(spec) and not s.computed_by(backend)]


def _norms_switch(norms) -> bool | tuple[str, ...]:
    """`StatsSpec.norms` as a bool or a tuple of twinned statistics' names in the table's order (a list read
    back from JSON, a set: the same twins); an empty one is False. Any other name is a ValueError."""
    if isinstance(norms, (bool, int, type(None))):
        return bool(norms)
    if isinstance(norms, str):
        norms = (norms,)
    unknown = sorted(set(norms) - set(NORM_TWINNED))
    if unknown:
        raise ValueError(f"norms names statistics without a norm-based twin: {', '.join(unknown)} "
                         f"(those with one: {', '.join(NORM_TWINNED)})")
    return tuple(name for name in NORM_TWINNED if name in set(norms)) or False


def refuse_unsupported(spec: StatsSpec, backend: str):
    """A one-line NotImplementedError, before any work, when `spec` asks for a statistic the table
    says `backend` does not compute (`RowStat.backends`)."""
    missing = unsupported_stats(spec, backend)
    if missing:
        raise NotImplementedError(f"the {backend} backend does not compute {', '.join(missing)}; "
                                  "use the chunked or eager backend, or turn the statistic off")


def missing_stats(stats: RowStats, spec: StatsSpec) -> list[str]:
    """Statistics `spec` asks for that `stats` lacks: a backend that forgot one."""
    return [s.name for s in ROW_STATS if s.asked(spec) and getattr(stats, s.name, None) is None]


# `StatsSpec(streaming=True)`: a span for specs that turn every switch on (tests, selftests), short
# enough that the rows of a short sequence are streamed; analyses give their own (sink, recent)
STREAMING_ON = (2, 8)


# --- what to compute --------------------------------------------------------------------------


@dataclass(frozen=True)
class StatsSpec:
    """Which row statistics to compute; every field defaults to off (an analysis says what it needs,
    in its family's `stats.py`).

    One switch per distinct `switch` of `ROW_STATS` (several entries may share one: `distance` asks
    for `distance_mass` and `mean_distance`), in the table's order after `offsets` and
    `n_key_classes`, then `keep_qk`. A statistic added to the table needs its switch here, written
    out (tests/kernels/test_stats_table.py says which one when it is missing).
    """

    offsets: tuple = ()
    """Relative key positions j - i whose attention mass is reported (`offset_mass`): -1 is the
    previous token, 0 the token itself, +1 the next one; () for none. Distinct."""
    n_key_classes: int = 1
    """C, the number of key classes; a key's class id is in [0, C) (e.g. [CLS], [SEP], punctuation,
    other). The argmax's class counts and `class_mass` use them. At least 1."""
    entropy: bool = False
    """`entropy`: each row's entropy -sum_j p_ij ln p_ij."""
    class_mass: bool = False
    """`class_mass`: the mass a row puts on each key class."""
    argmax: bool = False
    """`argmax`: each row's most-attended key (cheap but not free)."""
    distance: bool = False
    """`distance_mass` and `mean_distance`: each row's mass by query-key distance |i - j| in log2
    buckets (`DISTANCE_EDGES`), and its mean distance."""
    position_mass: bool = False
    """`position_mass`: each row's mass by the key's place in the context [0, i], in tenths (the
    positional profile behind "lost in the middle"), then the keys after the query."""
    token_relations: bool = False
    """`duplicate_mass` and `prefix_match_mass`: each row's mass on earlier copies of its own token
    (duplicate-token heads) and on the keys right after one (prefix matching, Olsson et al. 2022's
    induction on any text). Needs the batch's token ids (`token_ids=` of the backends)."""
    column_mass: bool = False
    """`column_mass`: the attention mass each key *receives*, summed over the valid query rows
    (Kovaleva et al.'s "vertical" pattern)."""
    word_maps: bool = False
    """`word_map` and `word_argmax`: the word-level map of every head and its row argmax, for the
    probes that read attention between words; needs a `WordPooling` for the batch."""
    streaming: tuple = ()
    """`streaming_error_sq` and `output_sq`: (sink, recent), StreamingLLM's attention sink and recent
    window; each head's output against its output over the first `sink` and the last `recent` keys
    (`kernels.streaming`; DuoAttention's streaming / retrieval heads). () for off; True means
    `STREAMING_ON` (what a spec that turns every switch on gets: a span short enough that rows of a
    short test sequence are streamed)."""
    norms: bool | tuple[str, ...] = False
    """The norm-based twins (Kobayashi et al. 2020, docs/norms.md): True, each mass statistic asked for
    (`offset_mass`, `class_mass`, `distance_mass`, `position_mass`, `duplicate_mass`,
    `prefix_match_mass`) also as `<name>_norm`, the same statistic of p_ij n_j / sum_j p_ij n_j, and
    `weighted_norm`, sum_j p_ij n_j; a tuple of those base names, only their twins (and `weighted_norm`):
    an analysis that reads the class twins alone does not pay for the others. Needs each key's value norm
    n_j = ||f_h(x_j)|| per head (`norms=` of the backends; the engine computes it from the layer's values
    and output projection, `kernels.norms`). Every backend computes every twin."""
    keep_qk: bool = False
    """Hand the layer's queries and keys on with the statistics (`RowStats.queries`, `.keys`: views,
    no copy), for analyses that compare heads across layers (Jensen-Shannon clustering) by
    recomputing attention tiles instead of keeping every map."""

    def __post_init__(self):
        object.__setattr__(self, "norms", _norms_switch(self.norms))
        if len(set(self.offsets)) != len(self.offsets):
            raise ValueError(f"offsets must be distinct, got {self.offsets}")
        if self.n_key_classes < 1:
            raise ValueError("n_key_classes must be >= 1")
        if self.streaming is True:
            object.__setattr__(self, "streaming", STREAMING_ON)
        elif self.streaming is False or self.streaming is None:
            object.__setattr__(self, "streaming", ())
        if self.streaming != ():
            if isinstance(self.streaming, list):
                object.__setattr__(self, "streaming", tuple(self.streaming))
            if (not isinstance(self.streaming, tuple) or len(self.streaming) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in self.streaming)):
                raise ValueError(f"streaming must be () or (sink, recent), whole numbers >= 0, not {self.streaming!r}")

    def union(self, other: StatsSpec) -> StatsSpec:
        """The smallest spec that serves both: what the engine computes for several analyses."""
        if self.n_key_classes != other.n_key_classes:
            raise ValueError("analyses disagree on the number of key classes")
        values = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "n_key_classes":
                values[f.name] = a
            elif f.name == "norms":  # every twin wins over some; else the twins either asks for
                values[f.name] = True if True in (a, b) else tuple(set(a or ()) | set(b or ())) or False
            elif f.name == "streaming":
                if a and b and a != b:
                    raise ValueError(f"analyses disagree on the streaming span: {a} and {b}")
                values[f.name] = a or b
            elif isinstance(a, tuple):
                values[f.name] = tuple(sorted(set(a) | set(b)))
            else:
                values[f.name] = a or b
        return type(self)(**values)


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


# --- what the attention function is handed: the shape of the attention, beside the statistics ---


@dataclass(frozen=True)
class AttentionLayout:
    """Which keys each query of a layer call may see, and how q and k heads pair up.

    causal:            query i sees keys j <= i only (a decoder's mask).
    window:            None, or (left, right): query i sees keys i - left .. i + right only
                       (a sliding window; a causal one is (w - 1, 0) for transformers'
                       `sliding_window` w, a bidirectional one (ModernBERT's local layers)
                       (w // 2, w // 2)).
    n_key_value_heads: None when k and v have as many heads as q; else their count, a divisor
                       of the query heads (grouped-query attention: query head h reads key head
                       h // (H / n_key_value_heads)).

    Positions are indices of the padded sequence, as transformers counts them (its sliding
    window compares cache positions), so a left-padded batch sees the same keys as each of
    its sequences alone: query i sees key j iff key j is real and `key_band(i)` holds it.
    The default is an encoder's: every query sees every real key, one k and v head per query
    head.
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
        """Bidirectional, unwindowed, one k and v head per query head: an encoder's attention."""
        return not self.causal and self.window is None and self.n_key_value_heads is None

    @property
    def reach(self) -> tuple[int | None, int | None]:
        """(left, right): how far before and after itself a query sees, None for no limit.
        A causal query sees nothing after itself, whatever the window says."""
        left = None if self.window is None else self.window[0]
        right = 0 if self.causal else (None if self.window is None else self.window[1])
        if self.causal and self.window is not None:
            right = min(0, self.window[1])
        return left, right

    def key_band(self, i, length: int):
        """(lo, hi): the first and last key position query position(s) i may see (inclusive),
        before padding; i an int or an int64 tensor of positions, length L."""
        left, right = self.reach
        if isinstance(i, torch.Tensor):
            lo = (i - left).clamp_min(0) if left is not None else torch.zeros_like(i)
            hi = (i + right).clamp_max(length - 1) if right is not None else torch.full_like(i, length - 1)
            return lo, hi
        lo = max(0, i - left) if left is not None else 0
        hi = min(length - 1, i + right) if right is not None else length - 1
        return lo, hi

    def group_size(self, n_heads: int) -> int:
        """G: how many query heads share one key/value head (1 without grouped-query attention)."""
        if self.n_key_value_heads is None:
            return 1
        if n_heads % self.n_key_value_heads:
            raise ValueError(f"{n_heads} query heads cannot share {self.n_key_value_heads} key/value heads evenly")
        return n_heads // self.n_key_value_heads

    def describe(self) -> str:
        """The layout in words (run.json, messages): "bidirectional", "causal, window 512, 4 q / 1 kv heads"."""
        parts = ["causal" if self.causal else "bidirectional"]
        if self.window is not None:
            parts.append(f"window {self.window[0]} left, {self.window[1]} right")
        if self.n_key_value_heads is not None:
            parts.append(f"{self.n_key_value_heads} key/value heads")
        return ", ".join(parts)


PLAIN = AttentionLayout()  # an encoder's self-attention


def visible_mask(key_valid: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
    """(B, 1, L, L) bool: query i sees key j. An L x L tensor: for the eager oracle and tests only,
    never on a fast path (a 32k x 32k mask is 1 GiB)."""
    L = key_valid.shape[-1]
    i = torch.arange(L, device=key_valid.device)
    lo, hi = layout.key_band(i, L)  # (L,), (L,)
    band = (i[None, :] >= lo[:, None]) & (i[None, :] <= hi[:, None])  # (L, L)
    return band[None, None] & key_valid[:, None, None, :]


def visible_counts(key_valid: torch.Tensor, layout: AttentionLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """How many real keys each query sees, and how many real queries see each key: O(L), no map.

    Why: under a causal or windowed mask rows see different numbers of keys, so the entropy of
    a row is read against its own uniform baseline ln n_visible(i), and the mass a key receives
    (column mass, summed over query rows) against the number of rows that could give it any.

    key_valid: (B, L) bool (real tokens; queries and keys are the same tokens)
    Returns (n_visible (B, L), n_seeing (B, L)), int64; 0 on padding positions.
    """
    B, L = key_valid.shape
    valid = key_valid.long()
    zero = valid.new_zeros(B, 1)
    csum = torch.cat([zero, valid.cumsum(-1)], dim=-1)  # (B, L+1): csum[:, j] = real tokens before j
    pos = torch.arange(L, device=key_valid.device)
    lo, hi = layout.key_band(pos, L)  # keys query i sees: lo(i)..hi(i)
    n_visible = (csum[:, hi + 1] - csum[:, lo]) * valid  # (B, L)
    # query i sees key j iff j - right <= i <= j + left (the band read from the key's side)
    left, right = layout.reach
    q_lo = (pos - right).clamp_min(0) if right is not None else torch.zeros_like(pos)
    q_hi = (pos + left).clamp_max(L - 1) if left is not None else torch.full_like(pos, L - 1)
    n_seeing = (csum[:, q_hi + 1] - csum[:, q_lo]) * valid  # (B, L)
    return n_visible, n_seeing


@dataclass
class RowStats:
    """Per-row attention statistics of one layer call: one attribute per entry of `ROW_STATS`, in
    the table's order (None when the spec did not ask for it; shapes as the table says, B batch,
    H heads, L positions, O offsets, C key classes, DB / PB the fixed widths, W word units), then
    what the call hands on beside them. Rows of padding queries hold the table's `padding`; a
    removed head's slot its `removed`. A statistic added to the table needs its attribute here,
    written out (tests/kernels/test_stats_table.py says which one when it is missing).
    """

    entropy: torch.Tensor | None = None
    """(B, H, L): -sum_j p_ij ln p_ij, nats."""
    offset_mass: torch.Tensor | None = None
    """(B, H, L, O): p_{i, i+o} for each o in spec.offsets (0 when i+o is outside the sequence or a
    padding key)."""
    class_mass: torch.Tensor | None = None
    """(B, H, L, C): sum of p_ij over the keys j of each class."""
    argmax: torch.Tensor | None = None
    """(B, H, L) int64: index of the most-attended key (ties: lowest index)."""
    distance_mass: torch.Tensor | None = None
    """(B, H, L, DB): sum of p_ij over the keys at distance |i - j| in each log2 bucket
    (`DISTANCE_EDGES`)."""
    mean_distance: torch.Tensor | None = None
    """(B, H, L): sum_j p_ij |i - j|: how far back (or ahead) the row reads, in tokens."""
    position_mass: torch.Tensor | None = None
    """(B, H, L, PB): sum of p_ij over the keys j <= i in each bin floor(10 j / (i + 1)) of the
    row's context, then over j > i."""
    duplicate_mass: torch.Tensor | None = None
    """(B, H, L): sum of p_ij over the earlier keys j < i holding the query's own token
    (ids[j] == ids[i]); 0 on rows with none (`token_relation_rows` says which rows have one)."""
    prefix_match_mass: torch.Tensor | None = None
    """(B, H, L): sum of p_ij over the keys 1 <= j <= i whose previous token is the query's
    (ids[j - 1] == ids[i], both real); 0 on rows with none (`token_relation_rows`)."""
    column_mass: torch.Tensor | None = None
    """(B, H, L): sum over the valid query rows i of p_ij: the mass key j receives."""
    word_map: torch.Tensor | None = None
    """(B, H, W, W): the word-level map (see `WordPooling`); rows of real units sum to 1."""
    word_argmax: torch.Tensor | None = None
    """(B, H, W) int64: most-attended *other* candidate unit of each unit (ties: lowest index), -1
    when there is none."""
    streaming_error_sq: torch.Tensor | None = None
    """(B, H, L): ||o_i - o_L,i||^2, the head's un-gated output o against o_L, its output over the
    streaming set of `spec.streaming` (sink + recent); exactly 0 on rows whose every visible key is
    streaming, ||o_i||^2 on rows with no streaming key (o_L = 0)."""
    output_sq: torch.Tensor | None = None
    """(B, H, L): ||o_i||^2 of the head's un-gated output (the relative error's denominator)."""
    offset_mass_norm: torch.Tensor | None = None
    """(B, H, L, O): `offset_mass` of the norm-based weights p_ij n_j / sum_j p_ij n_j (spec.norms)."""
    class_mass_norm: torch.Tensor | None = None
    """(B, H, L, C): `class_mass` of the norm-based weights (spec.norms)."""
    distance_mass_norm: torch.Tensor | None = None
    """(B, H, L, DB): `distance_mass` of the norm-based weights (spec.norms)."""
    position_mass_norm: torch.Tensor | None = None
    """(B, H, L, PB): `position_mass` of the norm-based weights (spec.norms)."""
    duplicate_mass_norm: torch.Tensor | None = None
    """(B, H, L): `duplicate_mass` of the norm-based weights (spec.norms)."""
    prefix_match_mass_norm: torch.Tensor | None = None
    """(B, H, L): `prefix_match_mass` of the norm-based weights (spec.norms)."""
    weighted_norm: torch.Tensor | None = None
    """(B, H, L): sum_j p_ij n_j, n_j = ||f_h(x_j)|| the value norm of key j in head h (spec.norms)."""
    queries: torch.Tensor | None = None
    """(B, H, L, D): the layer's queries (spec.keep_qk), with `scale`."""
    keys: torch.Tensor | None = None
    """(B, H_kv, L, D): the layer's keys (spec.keep_qk)."""
    scale: float | None = None
    """The softmax scale of `queries` . `keys` (spec.keep_qk)."""
    layout: AttentionLayout = field(default_factory=lambda: PLAIN)
    """The call's `AttentionLayout` (which keys each row saw: `visible_counts`)."""
    extras: dict = field(default_factory=dict)
    """Anything else a backend hands on, by name (free-form; nothing in the table's plumbing reads it)."""

    def as_float32(self) -> RowStats:
        """The statistics in float32, in place: a model in float16 or bfloat16 gives its kernels
        half-precision q, k, v, and its statistics are summed from float32 (then float64)."""
        for s in ROW_STATS:
            t = getattr(self, s.name)
            if s.dtype == "float" and t is not None and t.is_floating_point() and t.dtype != torch.float32:
                setattr(self, s.name, t.float())
        return self


