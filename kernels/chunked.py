"""The CPU fast path: attention plus row statistics, a few heads' L x L at a time.

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

import torch

from . import cpu_rows
from .common import finish_stats, keep_qk, require_pooling
from .gates import apply_gates
from .pooling import pool_map, word_argmax
from .spec import PLAIN, STAT, AttentionLayout, RowStats, StatsSpec, WordPooling

DEFAULT_CHUNK_BYTES = 1 << 20
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
    chunk_bytes=DEFAULT_CHUNK_BYTES, row_pass="auto", layout: AttentionLayout = PLAIN,
):
    """Same contract as `attention_stats_eager`; never holds more than one chunk of maps.
    Only the plain layout so far: any other is a NotImplementedError (`attention_stats` says so first).

    row_pass: "compiled" (cpu_rows.c; float32 on CPU, half precision widened to it), "torch",
    or "auto" (compiled when it applies and could be built, torch otherwise).
    """
    if row_pass not in ROW_PASSES:
        raise ValueError(f"row_pass must be one of {ROW_PASSES}, not {row_pass!r}")
    if not layout.is_plain:
        raise NotImplementedError(f"the chunked backend does not compute {layout.describe()} attention yet")
    if row_pass != "torch" and q.device.type == "cpu" and q.dtype in HALF:
        out, stats = attention_stats_chunked(q.float(), k.float(), v.float(), key_valid, key_class, spec, gates,
                                             scale, pooling, chunk_bytes, row_pass)
        return out.to(v.dtype), stats
    compiled_fits = q.dtype == torch.float32 and q.device.type == "cpu"
    if row_pass == "compiled" and not compiled_fits:
        raise ValueError("the compiled row pass takes float32, float16 or bfloat16 CPU tensors")
    if row_pass == "compiled" and cpu_rows.load() is None:
        raise RuntimeError(f"the compiled row pass is unavailable: {cpu_rows.unavailable_reason()}")
    if row_pass != "torch" and compiled_fits and cpu_rows.load() is not None:
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
