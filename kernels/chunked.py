"""The CPU fast path: attention plus row statistics, a few heads' L x L at a time (encoders),
or query blocks against their key band (causal, sliding-window and grouped-query layouts:
`_chunked_layout`, never an L x L tensor).

The (batch, head) maps are flattened to N = B*H and processed in chunks of n maps whose
scores fit in `chunk_bytes` (cache-sized), so memory stays O(n L^2) instead of
O(B H L^2) and the maps are still hot in cache while the statistics read them.

Each statistic is arranged to cost (almost) nothing beyond the attention itself:
- class mass rides along in the P @ V matmul: V is extended with a one-hot of each key's
  class, so (P @ [V | onehot])[..., D:] is the mass on every class;
- entropy uses H = lse - sum_j p_ij s_ij with lse = max_j s_ij - ln max_j p_ij (the largest
  probability is exactly 1/sum_j exp(s_ij - max s), and it is >= 1/L, so no log of zero):
  two vectorised max reductions and one row dot product, no log over the L x L map;
- offset masses are gathered in one call from fixed positions of the flattened map;
- the argmax (only when asked for: an index-tracking reduction is several times slower
  than a max) is torch's, which returns the first maximum.

That torch row pass still reads each map six times (softmax's three passes, two maxima, a
dot product). For float32 on the CPU the compiled row pass in `cpu_rows.c` replaces it:
the matmuls stay torch's, and everything between them is done in one visit per row while
the row sits in L1 (from `CLASS_MATMUL_MIN` key classes on, the class masses are a third
matmul P @ onehot instead of C passes over each row). `row_pass="torch"` forces the
pure-torch version (the compiled one is used when a C compiler is available; see `cpu_rows.py`).

float16 and bfloat16 on the CPU: q, k and v are widened to float32 on entry and the
compiled row pass runs on them (the output is narrowed back). The widening reads B*H*L*D
values per tensor against the L x L maps' B*H*L*L, and it is both faster and exact on its
inputs: at B 16, H 12, L 128, D 32 on one thread, 21.6 ms against the pure-torch pass in
bfloat16's 28.1 ms, whose own rounding moves a row's entropy by up to 0.09 nats (mean
0.013). `row_pass="torch"` keeps the half-precision torch pass.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from . import cpu_rows
from .common import finish_stats, keep_qk, query_blocks, require_pooling
from .gates import apply_gates
from .pooling import pool_map, word_argmax
from .spec import PLAIN, STAT, AttentionLayout, RowStats, StatsSpec, WordPooling

DEFAULT_CHUNK_BYTES = 1 << 20
# the scores of one query block under a causal / windowed / grouped-query layout (`_chunked_layout`):
# larger than the plain path's chunk because a block's matmuls must stay efficient when its band
# is long (a causal row at 32k is 128 KiB; P @ V reads the band's V once per block)
DEFAULT_BAND_BYTES = 1 << 20
BAND_MIN_ROWS = 64
# from this many key classes on, the compiled path takes the class masses from one matmul
# P @ onehot after the row pass instead of C short passes over each row inside it: per chunk
# of 1 MiB of scores (one thread), the matmul costs 0.41-0.49 ms at C = 16-32 against the
# passes' 0.67-1.04 ms (L = 128), and 0.58 ms against 0.39-0.48 ms at C = 4-8, where
# torch's matmul is slow for so few columns (bench/results_triton.md, "CPU row pass")
CLASS_MATMUL_MIN = 16
HALF = (torch.float16, torch.bfloat16)  # widened to float32 on the CPU (module docstring)


ROW_PASSES = ("auto", "compiled", "torch")


def attention_stats_chunked(
    q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None, pooling: WordPooling | None = None,
    chunk_bytes=None, row_pass="auto", layout: AttentionLayout = PLAIN,
):
    """Same contract as `attention_stats_eager`; never holds more than one chunk of scores.

    chunk_bytes: the scores held at once; default `DEFAULT_CHUNK_BYTES` (whole maps of a few
    heads) for the plain layout, `DEFAULT_BAND_BYTES` (query blocks, see `_chunked_layout`)
    for any other.
    row_pass: "compiled" (cpu_rows.c; float32 on CPU, half precision widened to it), "torch",
    or "auto" (compiled when it applies and could be built, torch otherwise).
    """
    if row_pass not in ROW_PASSES:
        raise ValueError(f"row_pass must be one of {ROW_PASSES}, not {row_pass!r}")
    if row_pass != "torch" and q.device.type == "cpu" and q.dtype in HALF:
        out, stats = attention_stats_chunked(q.float(), k.float(), v.float(), key_valid, key_class, spec, gates,
                                             scale, pooling, chunk_bytes, row_pass, layout=layout)
        return out.to(v.dtype), stats
    compiled_fits = q.dtype == torch.float32 and q.device.type == "cpu"
    if row_pass == "compiled" and not compiled_fits:
        raise ValueError("the compiled row pass takes float32, float16 or bfloat16 CPU tensors")
    if row_pass == "compiled" and cpu_rows.load() is None:
        raise RuntimeError(f"the compiled row pass is unavailable: {cpu_rows.unavailable_reason()}")
    compiled = row_pass != "torch" and compiled_fits and cpu_rows.load() is not None
    if not layout.is_plain:
        blocks = (DEFAULT_BAND_BYTES, BAND_MIN_ROWS) if chunk_bytes is None else (chunk_bytes, 1)
        return _chunked_layout(q, k, v, key_valid, key_class, spec, gates, scale, pooling, *blocks, compiled, layout)
    if chunk_bytes is None:
        chunk_bytes = DEFAULT_CHUNK_BYTES
    if compiled:
        return _chunked_compiled(q, k, v, key_valid, key_class, spec, gates, scale, pooling, chunk_bytes)
    B, H, L, D = q.shape
    N, C, O = B * H, spec.n_key_classes, len(spec.offsets)
    scale = D**-0.5 if scale is None else scale
    dev = q.device

    # -- per-map operands, flattened to N = B*H maps (one contiguous copy each; the scale
    #    rides on k, so scores come out of the matmul already scaled)
    qf = q.reshape(N, L, D)  # (N, L, D)
    ks = torch.empty(B, H, L, D, dtype=k.dtype, device=dev)
    kt = torch.mul(k, scale, out=ks).view(N, L, D).transpose(1, 2)  # (N, D, L)
    rhs = torch.empty(B, H, L, D + C, dtype=v.dtype, device=dev)  # (B, H, L, D+C): [V | onehot(class)]
    rhs[..., :D] = v
    rhs[..., D:] = torch.nn.functional.one_hot(key_class, C).to(v.dtype)[:, None]  # (B, 1, L, C)
    rhs = rhs.view(N, L, D + C)
    padded = not bool(key_valid.all())
    if padded:
        bias = torch.zeros(B, L, dtype=q.dtype, device=dev)
        bias.masked_fill_(~key_valid, torch.finfo(q.dtype).min)
        bias = bias[:, None, None, :].expand(B, H, 1, L).reshape(N, 1, L)  # (N, 1, L)
    if O:
        flat_idx, inside = offset_positions(L, spec.offsets, dev)  # (L*O,), (L, O)

    out_ext = torch.empty(N, L, D + C, dtype=q.dtype, device=dev)  # (N, L, D+C)
    offset_mass = torch.empty(N, L * O, dtype=q.dtype, device=dev)  # (N, L*O)
    entropy = torch.empty(N, L, dtype=q.dtype, device=dev) if spec.entropy else None
    argmax = torch.empty(N, L, dtype=torch.long, device=dev) if spec.argmax else None
    maps = MapStats(spec, key_valid, pooling, (B, H), q.dtype)

    n = max(1, chunk_bytes // (L * L * q.element_size()))
    for n0 in range(0, N, n):
        c = slice(n0, min(N, n0 + n))
        # -- scores and probabilities of this chunk
        if padded:
            s = torch.baddbmm(bias[c], qf[c], kt[c])  # (n, L, L)
        else:
            s = torch.bmm(qf[c], kt[c])  # (n, L, L)
        p = torch.softmax(s, dim=-1)  # (n, L, L)
        # -- output and class mass in one matmul
        torch.bmm(p, rhs[c], out=out_ext[c])
        if O:
            offset_mass[c] = p.flatten(1).gather(1, flat_idx.expand(p.shape[0], -1))
        if spec.entropy:
            # -- H = lse - sum_j p_j s_j
            lse = s.amax(-1) - torch.log(p.amax(-1))  # (n, L)
            entropy[c] = lse - torch.linalg.vecdot(p, s)
        if spec.argmax:
            argmax[c] = p.argmax(-1)
        maps.add(p, c.start)

    out = apply_gates(out_ext.view(B, H, L, D + C)[..., :D], v, key_valid, gates)  # (B, H, L, D) view
    stats = RowStats(
        entropy=None if entropy is None else entropy.view(B, H, L),
        offset_mass=(offset_mass.view(N, L, O) * inside).view(B, H, L, O) if O else None,
        class_mass=out_ext[..., D:].reshape(B, H, L, C) if spec.class_mass else None,
        argmax=None if argmax is None else argmax.view(B, H, L),
    )
    maps.finish(stats)
    keep_qk(stats, q, k, scale, spec)
    return out.transpose(1, 2), finish_stats(stats, spec, key_valid, "chunked")


def offset_positions(L, offsets, device):
    """Flat indices i*L + (i+o) of p[i, i+o] in an L x L map, and whether i+o is inside it.

    Positions outside are clamped to a valid index (and later multiplied by 0), so one
    gather reads every offset of every row.
    """
    i = torch.arange(L, device=device)[:, None]  # (L, 1)
    j = i + torch.tensor(offsets, device=device)[None, :]  # (L, O)
    inside = (j >= 0) & (j < L)
    return (i * L + j.clamp(0, L - 1)).flatten(), inside


def _chunked_compiled(q, k, v, key_valid, key_class, spec: StatsSpec, gates, scale, pooling, chunk_bytes):
    """The same loop with the compiled row pass between the two matmuls.

    Chunks never straddle two sequences: each is heads h0..h1 of one batch element, so q, k
    and v are read in place through strided views (the model hands over (B, H, L, D) views
    of its (B, L, H*D) projections) and no copy of them is made. The scale rides in the
    QK^T matmul (alpha) and the padding bias is added by the row pass, so the scores are
    written once. P @ V goes to a contiguous (B, H, L, D) output: a strided (B, L, H, D)
    target makes torch's bmm twice as slow, more than the model's later copy costs.
    """
    B, H, L, D = q.shape
    C, O = (spec.n_key_classes if spec.class_mass else 0), len(spec.offsets)  # C = 0: the row pass skips them
    scale = D**-0.5 if scale is None else scale
    dev = q.device

    onehot = (torch.nn.functional.one_hot(key_class, C) if C else key_class.new_zeros(*key_class.shape, 0)
              ).to(torch.float32)  # (B, L, C)
    by_matmul = C >= CLASS_MATMUL_MIN
    # the row pass's class masks: (B, C, L) 0/1 rows, or none when a matmul computes the masses
    class_mask = onehot[:, :, :0] if by_matmul else onehot
    class_mask = class_mask.transpose(1, 2).contiguous()  # (B, C or 0, L)
    no_classes = torch.empty(0, dtype=q.dtype, device=dev)
    offsets = torch.tensor(spec.offsets, dtype=torch.long)  # (O,)
    key_bias = None
    if not bool(key_valid.all()):
        key_bias = torch.zeros(B, L, dtype=q.dtype, device=dev)  # (B, L): 0, or finfo.min on padding keys
        key_bias.masked_fill_(~key_valid, torch.finfo(q.dtype).min)

    out = torch.empty(B, H, L, D, dtype=q.dtype, device=dev)  # (B, H, L, D)
    class_mass = torch.empty(B, H, L, C, dtype=q.dtype, device=dev)
    offset_mass = torch.empty(B, H, L, O, dtype=q.dtype, device=dev)
    entropy = torch.empty(B, H, L, dtype=q.dtype, device=dev) if spec.entropy else None
    argmax = torch.empty(B, H, L, dtype=torch.long, device=dev) if spec.argmax else None
    maps = MapStats(spec, key_valid, pooling, (B, H), q.dtype)

    n = max(1, min(H, chunk_bytes // (L * L * q.element_size())))
    scores = torch.empty(n, L, L, dtype=q.dtype, device=dev)  # (n, L, L), reused by every chunk
    for b in range(B):
        for h0 in range(0, H, n):
            h = slice(h0, min(H, h0 + n))
            s = scores[: h.stop - h.start]  # (n, L, L)
            # -- scaled scores; then bias, probabilities and statistics in place; then P @ V
            torch.baddbmm(s, q[b, h], k[b, h].transpose(-1, -2), beta=0, alpha=scale, out=s)
            cpu_rows.softmax_stats_(
                s, _rows(key_bias, b), class_mask[b], offsets, _rows(entropy, b, h),
                no_classes if by_matmul else class_mass[b, h], offset_mass[b, h], _rows(argmax, b, h),
            )
            if by_matmul:
                torch.matmul(s, onehot[b], out=class_mass[b, h])  # (n, L, C)
            torch.bmm(s, v[b, h], out=out[b, h])
            maps.add(s, b * H + h.start)

    out = apply_gates(out, v, key_valid, gates)  # (B, H, L, D)
    stats = RowStats(
        entropy=entropy,
        offset_mass=offset_mass if O else None,
        class_mass=class_mass if spec.class_mass else None,
        argmax=argmax,
    )
    maps.finish(stats)
    keep_qk(stats, q, k, scale, spec)
    return out.transpose(1, 2), finish_stats(stats, spec, key_valid, "chunked")


# Row statistics of the table read off each chunk's probabilities, for a statistic not fused
# into the row passes: name -> f(p (n, L, L)) -> (n, L, ...) in p's dtype. Both row passes hand
# `MapStats` every chunk's probabilities while they are in cache, so one entry here serves both
# (one more read of the chunk; fuse it into cpu_rows.c when that shows in bench_kernels).
# Empty today: every statistic of the table is fused or is a whole-map one.
FROM_PROBS: dict[str, Callable] = {}


class MapStats:
    """The statistics read off a whole map rather than its rows (column mass, word maps),
    and those of `FROM_PROBS`, taken from each chunk's probabilities while they are in cache:
    one small matmul (or reduction) each."""

    def __init__(self, spec: StatsSpec, key_valid, pooling, heads: tuple[int, int], dtype):
        B, H = heads
        L, dev = key_valid.shape[1], key_valid.device
        self.H = H
        self.pooling = require_pooling(pooling) if spec.word_maps else None
        self.column_mass = self.word_map = None
        if spec.column_mass:
            self.query_valid = key_valid.to(dtype)[:, None, :]  # (B, 1, L)
            self.column_mass = torch.empty(B * H, 1, L, dtype=dtype, device=dev)
        if spec.word_maps:
            W = pooling.n_units
            self.word_map = torch.empty(B * H, W, W, dtype=dtype, device=dev)
        dims = {"L": L, "O": len(spec.offsets), "C": spec.n_key_classes}
        self.from_probs = {name: (fn, torch.empty(B * H, *(dims[d] for d in STAT[name].shape[2:]), dtype=dtype,
                                                  device=dev))
                           for name, fn in FROM_PROBS.items() if STAT[name].asked(spec)}  # (B*H, L, ...) each
        self.active = spec.column_mass or spec.word_maps or bool(self.from_probs)

    def add(self, p, first_map: int):
        """p (n, L, L): the probabilities of the maps first_map.. first_map+n-1 (flat b*H + h)."""
        if not self.active:
            return
        maps = slice(first_map, first_map + p.shape[0])
        batch_index = torch.arange(maps.start, maps.stop, device=p.device) // self.H  # (n,) sequence of each map
        if self.column_mass is not None:
            self.column_mass[maps] = torch.matmul(self.query_valid[batch_index], p)  # (n, 1, L)
        if self.word_map is not None:
            self.word_map[maps] = pool_map(p, self.pooling, batch_index)  # (n, W, W)
        for fn, out in self.from_probs.values():
            out[maps] = fn(p)  # (n, L, ...)

    def finish(self, stats: RowStats):
        if self.column_mass is not None:
            stats.column_mass = self.column_mass.view(-1, self.H, self.column_mass.shape[-1])  # (B, H, L)
        if self.word_map is not None:
            W = self.word_map.shape[-1]
            stats.word_map = self.word_map.view(-1, self.H, W, W)  # (B, H, W, W)
            stats.word_argmax = word_argmax(stats.word_map, self.pooling.candidate)
        for name, (_, out) in self.from_probs.items():
            setattr(stats, name, out.view(-1, self.H, *out.shape[1:]))  # (B, H, L, ...)


def _rows(t, *index):
    return None if t is None else t[index]


# --- causal, sliding-window and grouped-query layouts: query blocks over the key band -----------


def _chunked_layout(q, k, v, key_valid, key_class, spec: StatsSpec, gates, scale, pooling, chunk_bytes,
                    min_rows: int, compiled: bool, layout: AttentionLayout):
    """Causal, sliding-window and grouped-query attention: query blocks, each against its key band.

    For each sequence and key/value head, the G query heads that read it are taken together and
    the sequence is cut into query blocks (`query_blocks`): a block's scores are one matmul of
    the G heads' stacked query rows (G * bq, D) against the band's keys (D, bk), so each K and
    V tile is read once for the G heads, and nothing outside the band is computed. Within the
    block, keys outside a row's own band are masked: by the compiled banded row pass
    (`cpu_rows.softmax_stats_band_`, which only visits the row's band and zeroes the rest), or
    by a (bq, bk) mask in the torch row pass. Memory: one block of scores (`chunk_bytes`), the
    per-row statistics, and the accumulators of column mass and word maps, which each block adds
    its share to (column mass: valid query rows @ P; word maps: from_word[:, block] @ P @ to_word[band]).
    """
    B, H, L, D = q.shape
    H_kv = k.shape[1]
    G = H // H_kv
    C, O = (spec.n_key_classes if spec.class_mass else 0), len(spec.offsets)
    scale = D**-0.5 if scale is None else scale
    dev, dtype = q.device, q.dtype
    acc_dtype = torch.float32 if dtype in HALF else dtype  # column mass and word maps add up blocks
    band = layout.reach  # (left, right), None for no limit

    onehot = torch.nn.functional.one_hot(key_class, C).to(dtype) if C else None  # (B, L, C)
    # class masses ride along in P @ [V | onehot]: C more columns of a matmul instead of C passes
    # over every row (V is copied once per sequence and key head, O(L D))
    class_mask = torch.empty(B, 0, L, dtype=dtype, device=dev)  # the row pass computes no class mass
    offsets = torch.tensor(spec.offsets, dtype=torch.long)  # (O,)
    padded = not bool(key_valid.all())
    key_bias = None
    if compiled and padded:
        key_bias = torch.zeros(B, L, dtype=dtype, device=dev)  # (B, L): 0, or finfo.min on padding keys
        key_bias.masked_fill_(~key_valid, torch.finfo(dtype).min)

    out = torch.empty(B, H, L, D, dtype=dtype, device=dev)
    class_mass = torch.empty(B, H, L, C, dtype=dtype, device=dev)
    row_classes = class_mass[..., :0]
    offset_mass = torch.empty(B, H, L, O, dtype=dtype, device=dev)
    entropy = torch.empty(B, H, L, dtype=dtype, device=dev) if spec.entropy else None
    argmax = torch.empty(B, H, L, dtype=torch.long, device=dev) if spec.argmax else None
    column_mass = torch.zeros(B, H, L, dtype=acc_dtype, device=dev) if spec.column_mass else None
    query_valid = key_valid.to(dtype)  # (B, L)
    word_map = None
    if spec.word_maps:
        pooling = require_pooling(pooling)
        W = pooling.n_units
        word_map = torch.zeros(B, H, W, W, dtype=acc_dtype, device=dev)
        from_word, to_word = pooling.from_word.to(dtype), pooling.to_word.to(dtype)  # (B, W, L), (B, L, W)

    budget = max(1, chunk_bytes // q.element_size())
    blocks = query_blocks(L, G, layout, budget, min_rows)
    most = max(G * (i1 - i0) * (k1 - k0) for i0, i1, k0, k1 in blocks)
    rows = max(i1 - i0 for i0, i1, _, _ in blocks) * G
    lo_all, hi_all = layout.key_band(torch.arange(L, device=dev), L)  # (L,), (L,)

    def work(items, column_mass, word_map, threads):
        """The blocks `items` [(b, kh, block)], in order, with this worker's own buffers; column
        mass and word maps are added to the given accumulators."""
        scores = torch.empty(most, dtype=dtype, device=dev)  # one block's scores, reused
        q_rows = torch.empty(rows, D, dtype=dtype, device=dev)  # the G heads' query rows of a block, stacked
        o_rows = torch.empty(rows, D + C, dtype=dtype, device=dev)
        rhs = torch.empty(L, D + C, dtype=dtype, device=dev)  # [V | onehot] of one sequence and key head
        filled = None
        for b, kh, (i0, i1, k0, k1) in items:
            hs = slice(kh * G, (kh + 1) * G)  # the query heads that read key/value head kh
            if filled != (b, kh):
                rhs[:, :D] = v[b, kh]
                if C:
                    rhs[:, D:] = onehot[b]
                filled = (b, kh)
            bq, bk = i1 - i0, k1 - k0
            s = scores[: G * bq * bk].view(G, bq, bk)
            qr, o_r = q_rows[: G * bq].view(G, bq, D), o_rows[: G * bq]  # (G, bq, D), (G * bq, D + C)
            qr.copy_(q[b, hs, i0:i1])
            torch.addmm(s.view(G * bq, bk), qr.view(G * bq, D), k[b, kh, k0:k1].T, beta=0, alpha=scale,
                        out=s.view(G * bq, bk))
            if compiled:
                cpu_rows.softmax_stats_band_(
                    s, i0, k0, band, None if key_bias is None else key_bias[b, k0:k1],
                    class_mask[b, :, k0:k1], offsets, _rows(entropy, b, hs), row_classes[b, hs],
                    offset_mass[b, hs], _rows(argmax, b, hs), threads)
            else:
                _torch_band_rows(s, i0, k0, lo_all[i0:i1], hi_all[i0:i1], key_valid[b, k0:k1], spec,
                                 None if entropy is None else entropy[b, hs, i0:i1], offset_mass[b, hs, i0:i1],
                                 None if argmax is None else argmax[b, hs, i0:i1])
            torch.mm(s.view(G * bq, bk), rhs[k0:k1], out=o_r)  # (G * bq, D + C)
            out[b, hs, i0:i1] = o_r[:, :D].view(G, bq, D)
            if C:
                class_mass[b, hs, i0:i1] = o_r[:, D:].view(G, bq, C)
            if column_mass is not None:
                column_mass[b, hs, k0:k1] += torch.matmul(query_valid[b, i0:i1], s).to(acc_dtype)  # (G, bk)
            if word_map is not None:
                to_units = torch.matmul(s, to_word[b, k0:k1])  # (G, bq, W)
                word_map[b, hs] += torch.matmul(from_word[b, :, i0:i1], to_units).to(acc_dtype)  # (G, W, W)

    items = [(b, kh, block) for b in range(B) for kh in range(H_kv) for block in blocks]
    n = min(len(items), torch.get_num_threads()) if dev.type == "cpu" else 1
    if n <= 1:
        work(items, column_mass, word_map, None)
    else:
        # one Python thread per core, each running single-threaded ops on every n-th block: no
        # OpenMP barrier per block, which stalls a whole block whenever another process holds a
        # core (bench/results_layouts.md); column mass and word maps are summed per worker
        def partial(t):
            return None if t is None else torch.zeros_like(t)

        accumulators = [(column_mass, word_map)] + [(partial(column_mass), partial(word_map)) for _ in range(n - 1)]
        threads = torch.get_num_threads()
        modes = torch.is_inference_mode_enabled(), torch.is_grad_enabled()  # thread-local: handed on

        def worker(w):
            with torch.inference_mode(modes[0]), torch.set_grad_enabled(modes[1]):
                work(items[w::n], *accumulators[w], 1)

        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(worker, range(n)))
        finally:
            torch.set_num_threads(threads)
        for cm, wm in accumulators[1:]:
            if cm is not None:
                column_mass += cm
            if wm is not None:
                word_map += wm

    out = apply_gates(out, v, key_valid, gates, layout)  # (B, H, L, D)
    stats = RowStats(entropy=entropy, offset_mass=offset_mass if O else None,
                     class_mass=class_mass if spec.class_mass else None, argmax=argmax, column_mass=column_mass,
                     layout=layout)
    if spec.word_maps:
        stats.word_map = word_map
        stats.word_argmax = word_argmax(word_map, pooling.candidate)
    keep_qk(stats, q, k, scale, spec)
    return out.transpose(1, 2), finish_stats(stats, spec, key_valid, "chunked")


def _torch_band_rows(s, i0, k0, lo, hi, key_valid, spec, entropy, offset_mass, argmax):
    """The torch row pass of one query block, in place: s (G, bq, bk) scores of queries i0.. against
    keys k0..; lo, hi (bq,) each row's band; key_valid (bk,). Keys outside a row's band or padding
    get probability 0 (a row that sees none, a padding query's, becomes uniform: finite)."""
    bq, bk = s.shape[1:]
    keys = torch.arange(k0, k0 + bk, device=s.device)  # (bk,) absolute positions
    visible = (keys >= lo[:, None]) & (keys <= hi[:, None]) & key_valid  # (bq, bk)
    s.masked_fill_(~visible, torch.finfo(s.dtype).min)
    top = s.amax(-1)  # (G, bq)
    p = torch.softmax(s, dim=-1)  # (G, bq, bk)
    if entropy is not None:  # H = lse - sum_j p_j s_j, lse = max s - ln max p (as the plain torch pass)
        entropy.copy_(top - torch.log(p.amax(-1)) - torch.linalg.vecdot(p, s))
    if spec.offsets:
        j = torch.arange(i0, i0 + bq, device=s.device)[:, None] + torch.tensor(spec.offsets, device=s.device)  # (bq, O)
        inside = (j >= lo[:, None]) & (j <= hi[:, None])
        picked = p.gather(-1, (j - k0).clamp(0, bk - 1).expand(s.shape[0], -1, -1))  # (G, bq, O)
        offset_mass.copy_(picked * inside)
    if argmax is not None:
        argmax.copy_(p.argmax(-1) + k0)
    s.copy_(p)
