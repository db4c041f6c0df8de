"""The CPU fast path: attention plus row statistics, one block of scores at a time, for every
`AttentionLayout` (an encoder's is the one with no causal mask, no window and H_kv = H).

One loop serves every layout. The work is cut into blocks (`query_blocks`): for one sequence,
a few key/value heads and the G query heads that read each of them, the query rows i0 .. i1 - 1
against the keys k0 .. k1 - 1 that those rows may see (their `key_band`s). A block's scores fit
in `chunk_bytes` (cache-sized), so memory stays one block instead of O(B H L^2) and the scores
are still hot in cache while the statistics read them. What the layout changes is only where
blocks begin and end:
- plain (encoder): one block holds whole L x L maps of as many heads as fit (at L = 128, every
  head of a sequence);
- causal / windowed: a block reads the keys up to its last row, a windowed one from its first
  row's left edge on, so the blocks' scores add up to ~L^2 / 2 (causal) or ~L (w + block);
  nothing outside the band is computed, and keys outside a row's own band get probability 0;
- grouped-query: the G query heads of a key head are stacked (G * bq, D) against the band's
  keys, so each K and V tile is read once for the G heads.

Every block hands its probabilities p (n, bq, bk), with its query offset i0 and key offset k0,
to the statistics not fused into the row pass: column mass and word maps (added up over
blocks) and every table entry with a definition `from_probs(p, i0, k0, keys)` (`kernels/spec.py`),
so a statistic written there once, position-dependent or not, holds on every layout.

Each fused statistic is arranged to cost (almost) nothing beyond the attention itself. For
float32 on the CPU the compiled row pass in `cpu_rows.c` does everything between the two
matmuls in one visit per row while the row sits in L1: softmax, entropy as
H = ln z - sum_j e_j (s_j - m) / z (no log per key), offset masses, argmax, and the class
masses (from `CLASS_MATMUL_MIN` key classes on, a third matmul P @ onehot instead of C passes
over each row). `row_pass="torch"` forces the pure-torch row pass (the compiled one is used when
a C compiler is available; see `cpu_rows.py`), which reads each block six times (softmax's
three passes, two maxima, a dot product): entropy uses H = lse - sum_j p_ij s_ij with
lse = max_j s_ij - ln max_j p_ij, and the argmax is torch's (first maximum).

float16 and bfloat16 on the CPU: q, k and v are widened to float32 on entry and the
compiled row pass runs on them (the output is narrowed back). The widening reads B*H*L*D
values per tensor against the L x L maps' B*H*L*L, and it is both faster and exact on its
inputs: at B 16, H 12, L 128, D 32 on one thread, 21.6 ms against the pure-torch pass in
bfloat16's 28.1 ms, whose own rounding moves a row's entropy by up to 0.09 nats (mean
0.013). `row_pass="torch"` keeps the half-precision torch pass. On a GPU (chunked is the
fallback there when Triton is missing) half precision is widened too, for the same reason: the
torch pass in bfloat16 missed the selftest's tolerance on an H100 (entropy off by up to 0.09
nats against 0.06 allowed, causal and grouped-query shapes; bench/results_gpu.md, run 3).

Threads: an encoder's blocks (whole maps of several heads at L = 128, one head's map at L = 512)
run in order, each op parallel inside the block (torch's threads, and the row pass's OpenMP
rows), as before the layouts shared this path: on an idle machine with two threads, 4 x 12 x 512
took 19.8 ms per call in order against 28.6 ms shared out (median of 7 interleaved calls, load
1.4); on a busy one the thread default (`bertscope.cli.args`) gives one thread, and nothing is
shared out. The query blocks of a causal, windowed or grouped-query layout, when there are more
of them than threads, are shared out to one Python thread per core running single-threaded ops
on every n-th block: no OpenMP barrier per block, which stalls a whole block whenever another
process holds a core (bench/results_layouts.md). Measured on the 2-core development machine
under a load of 4, two threads, the surface suite's spec, best / median of 16-40 interleaved
calls, causal with 3 key heads, 16 x 9 x 128: in order 47 / 123 ms, shared out 32 / 55 ms (the
encoder shapes under that load: 16 x 12 x 128 in order 7.6 / 87 ms, shared out 20.5 / 43 ms;
4 x 12 x 512 in order 75 / 318 ms, shared out 42 / 55 ms; the default takes one thread there).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from . import cpu_rows
from . import spec as _spec
from .common import finish_stats, keep_qk, query_blocks, require_pooling
from .gates import apply_gates
from .pooling import word_argmax
from .spec import PLAIN, STAT, AttentionLayout, KeyBlock, RowStats, StatsSpec, WordPooling, padded_ids
from .streaming import add_streaming_stats

# the scores of one block: whole maps of a few heads (plain layout: at L = 128, a sequence's 12
# heads), or a query block against its band, large enough for a block's matmuls to stay efficient
# when its band is long (a causal row at 32k is 128 KiB; P @ V reads the band's V once per block)
DEFAULT_CHUNK_BYTES = 1 << 20
BLOCK_MIN_ROWS = 64  # query rows of a block at least (default blocks; an explicit chunk_bytes allows 1)
# from this many key classes on, the compiled path takes the class masses from one matmul
# P @ onehot after the row pass instead of C short passes over each row inside it: per chunk
# of 1 MiB of scores (one thread), the matmul costs 0.41-0.49 ms at C = 16-32 against the
# passes' 0.67-1.04 ms (L = 128), and 0.58 ms against 0.39-0.48 ms at C = 4-8, where
# torch's matmul is slow for so few columns (bench/results_triton.md, "CPU row pass")
CLASS_MATMUL_MIN = 16
HALF = (torch.float16, torch.bfloat16)  # widened to float32 on entry (module docstring)
# How each statistic is computed here is its table entry's `pass_kind` (spec.RowStat): "row", fused into
# both row passes; "norm", the norm-based twins chunked computes in its own pass (`_norm_pass`, docs/norms.md:
# one matmul of each block's P against [one-hot x n, n] gives the class twins and the weighted norm, and the
# offset twins are read off the offset masses after the loop, p_{i,i+o} n_{i+o} / sum_j p_ij n_j); "maps",
# from the whole map (`_Maps`); "blocks", every other per-row entry, from each block's probabilities by its
# `from_probs`

ROW_PASSES = ("auto", "compiled", "torch")


def attention_stats_chunked(
    q, k, v, key_valid, key_class, spec: StatsSpec, gates=None, scale=None, pooling: WordPooling | None = None,
    chunk_bytes=None, row_pass="auto", layout: AttentionLayout = PLAIN, token_ids=None, norms=None,
):
    """Same contract as `attention_stats_eager`; never holds more than one block of scores.

    chunk_bytes: the scores held at once; default `DEFAULT_CHUNK_BYTES`, with blocks of at
    least `BLOCK_MIN_ROWS` query rows (an explicit chunk_bytes allows blocks of one row).
    row_pass: "compiled" (cpu_rows.c; float32 on CPU, half precision widened to it), "torch",
    or "auto" (compiled when it applies and could be built, torch otherwise).
    """
    if row_pass not in ROW_PASSES:
        raise ValueError(f"row_pass must be one of {ROW_PASSES}, not {row_pass!r}")
    if row_pass != "torch" and q.dtype in HALF:  # widened on every device (module docstring)
        out, stats = attention_stats_chunked(q.float(), k.float(), v.float(), key_valid, key_class, spec, gates,
                                             scale, pooling, chunk_bytes, row_pass, layout=layout, token_ids=token_ids,
                                             norms=norms)
        return out.to(v.dtype), stats
    compiled_fits = q.dtype == torch.float32 and q.device.type == "cpu"
    if row_pass == "compiled" and not compiled_fits:
        raise ValueError("the compiled row pass takes float32, float16 or bfloat16 CPU tensors")
    if row_pass == "compiled" and cpu_rows.load() is None:
        raise RuntimeError(f"the compiled row pass is unavailable: {cpu_rows.unavailable_reason()}")
    compiled = row_pass != "torch" and compiled_fits and cpu_rows.load() is not None
    blocks = (DEFAULT_CHUNK_BYTES, BLOCK_MIN_ROWS) if chunk_bytes is None else (chunk_bytes, 1)
    return _chunked(q, k, v, key_valid, key_class, spec, gates, scale, pooling, *blocks, compiled, layout, token_ids,
                    norms)


def by_block(spec: StatsSpec) -> list:
    """The table's per-row statistics `spec` asks for that no row pass fuses: computed from each
    block's probabilities by their `from_probs` (read from the table at call time). An entry without one
    is left out, and `finish_stats` names it as not computed."""
    return [s for s in _spec.ROW_STATS if s.asked(spec) and s.pass_kind == "blocks" and s.from_probs is not None]


def _chunked(q, k, v, key_valid, key_class, spec: StatsSpec, gates, scale, pooling, chunk_bytes, min_rows: int,
             compiled: bool, layout: AttentionLayout, token_ids=None, norms=None):
    """The one loop (module docstring): blocks of (sequence b, key heads kh0 .. kh1 - 1 with their
    G query heads each, query rows i0 .. i1 - 1, keys k0 .. k1 - 1), each handed to `_Call.block`.

    A block's scores are one batched matmul of the heads' query rows against the block's keys,
    scaled in the matmul (alpha) and written once; the row pass turns them into probabilities in
    place, zeroing keys outside a row's band (compiled: `cpu_rows.softmax_stats_band_`, which
    visits a row's band only; torch: a (bq, bk) mask); then P @ V, and the statistics read off P.
    q, k, v are read in place through strided views (the model hands over (B, H, L, D) views of
    its (B, L, H*D) projections). Memory: one block of scores, the per-row statistics, and the
    accumulators of column mass and word maps, which each block adds its share to.
    """
    call = _Call(q, k, v, key_valid, key_class, spec, scale, pooling, compiled, layout, token_ids, norms)
    B, H, L, D = q.shape
    H_kv = k.shape[1]
    budget = max(1, chunk_bytes // q.element_size())
    blocks = query_blocks(L, call.G, layout, budget, min_rows)
    # whole maps (one block covers every row): as many key heads per block as fit
    i0, i1, k0, k1 = blocks[0]
    per = max(1, min(H_kv, budget // (call.G * (i1 - i0) * (k1 - k0)))) if len(blocks) == 1 else 1
    most = max(per * call.G * (i1 - i0) * (k1 - k0) for i0, i1, k0, k1 in blocks)  # a block's scores at most
    rows = max(i1 - i0 for i0, i1, _, _ in blocks) * per * call.G  # a block's stacked query rows at most
    items = [(b, kh0, min(H_kv, kh0 + per), block) for b in range(B) for kh0 in range(0, H_kv, per)
             for block in blocks]

    def work(items, column_mass, word_map, threads):
        """The blocks `items` [(b, kh0, kh1, block)], in order, with this worker's own buffers;
        column mass and word maps are added to the given accumulators."""
        scores = torch.empty(most, dtype=call.dtype, device=call.dev)  # one block's scores, reused
        q_rows = torch.empty(rows, D, dtype=call.dtype, device=call.dev) if call.G > 1 else None  # stacked query rows
        o_rows = torch.empty(rows, D, dtype=call.dtype, device=call.dev)  # P @ V of a block, when not written in place
        for item in items:
            call.block(item, scores, q_rows, o_rows, column_mass, word_map, threads)

    n_workers = min(len(items), torch.get_num_threads()) if call.dev.type == "cpu" else 1
    if n_workers <= 1 or layout.is_plain:  # one worker, or an encoder's blocks (module docstring, Threads)
        work(items, call.column_mass, call.word_map, None)
    else:
        _in_threads(work, items, n_workers, call.column_mass, call.word_map)
    return call.finish(gates)


class _Call:
    """One call of the chunked backend: its operands, the constants every block reads, and the outputs every
    block writes its rows of (`block`), then the statistics (`finish`)."""

    def __init__(self, q, k, v, key_valid, key_class, spec: StatsSpec, scale, pooling, compiled: bool,
                 layout: AttentionLayout, token_ids, norms):
        B, H, L, D = q.shape
        self.q, self.k, self.v, self.key_valid, self.key_class = q, k, v, key_valid, key_class
        self.spec, self.compiled, self.layout, self.pooling = spec, compiled, layout, pooling
        self.G = layout.group_size(H)
        C, O = (spec.n_key_classes if spec.class_mass else 0), len(spec.offsets)  # C = 0: no class pass
        self.C, self.O = C, O
        self.scale = D**-0.5 if scale is None else scale
        self.dev, self.dtype = dev, dtype = q.device, q.dtype
        acc_dtype = torch.float32 if dtype in HALF else dtype  # column mass and word maps add up blocks
        self.band = layout.reach  # (left, right), None for no limit

        self.onehot = torch.nn.functional.one_hot(key_class, C).to(dtype) if C else None  # (B, L, C)
        self.by_matmul = C >= CLASS_MATMUL_MIN or not compiled  # the torch row pass always takes the matmul
        # the compiled row pass's class masks: (B, C, L) 0/1 rows, or none when a matmul computes the masses
        self.class_mask = (self.onehot.transpose(1, 2).contiguous() if C and not self.by_matmul
                           else torch.empty(B, 0, L, dtype=dtype, device=dev))
        self.offsets = torch.tensor(spec.offsets, dtype=torch.long)  # (O,)
        self.key_bias = None
        if compiled and not bool(key_valid.all()):
            self.key_bias = torch.zeros(B, L, dtype=dtype, device=dev)  # (B, L): 0, or finfo.min on padding keys
            self.key_bias.masked_fill_(~key_valid, torch.finfo(dtype).min)

        self.out = torch.empty(B, H, L, D, dtype=dtype, device=dev)  # (B, H, L, D)
        self.class_mass = torch.empty(B, H, L, C, dtype=dtype, device=dev)
        self.row_classes = self.class_mass[..., :0] if self.by_matmul else self.class_mass  # the compiled pass's
        self.offset_mass = torch.empty(B, H, L, O, dtype=dtype, device=dev)
        self.entropy = torch.empty(B, H, L, dtype=dtype, device=dev) if spec.entropy else None
        self.argmax = torch.empty(B, H, L, dtype=torch.long, device=dev) if spec.argmax else None
        self.column_mass = torch.zeros(B, H, L, dtype=acc_dtype, device=dev) if spec.column_mass else None
        self.query_valid = key_valid.to(dtype)  # (B, L)
        self.word_map = None
        if spec.word_maps:
            self.pooling = require_pooling(pooling)
            W = self.pooling.n_units
            self.word_map = torch.zeros(B, H, W, W, dtype=acc_dtype, device=dev)
            # (B, W, L), (B, L, W)
            self.from_word, self.to_word = self.pooling.from_word.to(dtype), self.pooling.to_word.to(dtype)
        self.per_block = by_block(spec)
        self.ids = None if token_ids is None else padded_ids(token_ids, key_valid)  # (B, L), padding -1
        self.norm_pass = _NormPass.of(spec, norms, key_valid, key_class, dtype, compiled) if spec.norms else None
        self.norms = None if self.norm_pass is None else self.norm_pass.norms  # (B, H, L), padding keys 0
        self.lo_all, self.hi_all = layout.key_band(torch.arange(L, device=dev), L)  # (L,), (L,)
        self.per_block_out = self._block_outputs()  # name -> (B, H, L, ...)

    def _block_keys(self, b, hs, k0, k1) -> KeyBlock:
        return KeyBlock(self.key_valid[b, k0:k1], self.key_class[b, k0:k1], self.q.shape[2], self.spec,
                        None if self.ids is None else self.ids[b],
                        None if self.norms is None else self.norms[b, hs, k0:k1])

    def _block_outputs(self) -> dict:
        """The outputs of the per-block definitions (`by_block`), each as wide as its definition's output on a
        one-row block."""
        B, H, L, _ = self.q.shape
        probe = torch.full((1, 1, 1), 1.0, dtype=self.dtype, device=self.dev)
        outputs = {}
        for stat in self.per_block:
            t = stat.from_probs(probe, 0, 0, self._block_keys(0, slice(0, 1), 0, 1))  # (1, 1, ...)
            outputs[stat.name] = torch.zeros(B, H, L, *t.shape[2:], dtype=t.dtype, device=self.dev)
        return outputs

    def block(self, item, scores, q_rows, o_rows, column_mass, word_map, threads):
        """One block (b, kh0, kh1, (i0, i1, k0, k1)) in the worker's buffers: its scores, the row pass, P @ V,
        then the statistics read off its probabilities; column mass and word maps added to the given ones."""
        b, kh0, kh1, (i0, i1, k0, k1) = item
        q, k, v, G = self.q, self.k, self.v, self.G
        L = q.shape[2]
        nk, bq, bk = kh1 - kh0, i1 - i0, k1 - k0
        hs = slice(kh0 * G, kh1 * G)  # the query heads that read key heads kh0 .. kh1 - 1
        n = nk * G
        s = scores[: n * bq * bk].view(n, bq, bk)  # (n, bq, bk); also (nk, G * bq, bk)
        kt = k[b, kh0:kh1, k0:k1].transpose(-1, -2)  # (nk, D, bk)
        # -- scaled scores, then probabilities and fused statistics in place, then P @ V
        if G == 1:
            torch.baddbmm(s, q[b, hs, i0:i1], kt, beta=0, alpha=self.scale, out=s)
        else:
            qr = q_rows[: n * bq].view(nk, G, bq, -1)
            qr.copy_(q[b, hs, i0:i1].view(nk, G, bq, -1))
            torch.baddbmm(s.view(nk, G * bq, bk), qr.view(nk, G * bq, -1), kt, beta=0, alpha=self.scale,
                          out=s.view(nk, G * bq, bk))
        if self.compiled:
            cpu_rows.softmax_stats_band_(
                s, i0, k0, self.band, None if self.key_bias is None else self.key_bias[b, k0:k1],
                self.class_mask[b, :, k0:k1], self.offsets, _rows(self.entropy, b, hs), self.row_classes[b, hs],
                self.offset_mass[b, hs], _rows(self.argmax, b, hs), threads)
        else:
            _torch_rows(s, i0, k0, self.lo_all[i0:i1], self.hi_all[i0:i1], self.key_valid[b, k0:k1], self.spec,
                        None if self.entropy is None else self.entropy[b, hs, i0:i1], self.offset_mass[b, hs, i0:i1],
                        None if self.argmax is None else self.argmax[b, hs, i0:i1])
        if self.C and self.by_matmul:
            self.class_mass[b, hs, i0:i1] = torch.matmul(s, self.onehot[b, k0:k1])  # (n, bq, C)
        p_kv = s.view(nk, G * bq, bk)
        if G == 1 and bq == L:  # whole maps: straight into the output
            torch.bmm(p_kv, v[b, kh0:kh1, k0:k1], out=self.out[b, hs])
        else:
            o_r = o_rows[: n * bq].view(nk, G * bq, -1)
            torch.bmm(p_kv, v[b, kh0:kh1, k0:k1], out=o_r)
            self.out[b, hs, i0:i1] = o_r.view(n, bq, -1)
        # -- the statistics read off this block's probabilities
        if column_mass is not None:  # valid query rows @ P: (n, 1, bk)
            rows_valid = self.query_valid[b, None, i0:i1].expand(n, 1, bq)
            column_mass[b, hs, k0:k1] += torch.matmul(rows_valid, s)[:, 0].to(column_mass.dtype)
        if word_map is not None:  # from_word[:, rows] @ P @ to_word[keys]: (n, W, W)
            fw = self.from_word[b, None, :, i0:i1].expand(n, -1, bq)  # (n, W, bq)
            tw = self.to_word[b, None, k0:k1].expand(n, bk, -1)  # (n, bk, W)
            word_map[b, hs] += torch.matmul(torch.matmul(fw, s), tw).to(word_map.dtype)
        if self.norm_pass is not None:
            self.norm_pass.block(s, b, hs, i0, i1, k0, k1, threads)
        if self.per_block:
            keys = self._block_keys(b, hs, k0, k1)
            for stat in self.per_block:
                self.per_block_out[stat.name][b, hs, i0:i1] = stat.from_probs(s, i0, k0, keys)  # (n, bq, ...)

    def finish(self, gates):
        """(gated output (B, L, H, D), the statistics) once every block is in."""
        spec, O = self.spec, self.O
        o = self.out  # (B, H, L, D) un-gated, for the streaming error
        out = apply_gates(o, self.v, self.key_valid, gates, self.layout)  # (B, H, L, D)
        stats = RowStats(entropy=self.entropy, offset_mass=self.offset_mass if O else None,
                         class_mass=self.class_mass if spec.class_mass else None, argmax=self.argmax,
                         column_mass=self.column_mass, layout=self.layout)
        if spec.word_maps:
            stats.word_map = self.word_map
            stats.word_argmax = word_argmax(self.word_map, self.pooling.candidate)
        for name, t in self.per_block_out.items():
            setattr(stats, name, t)
        if self.norm_pass is not None:
            self.norm_pass.finish(stats, spec, self.offset_mass if O else None)
        add_streaming_stats(stats, spec, self.q, self.k, self.v, o, self.key_valid, self.layout, self.scale)
        keep_qk(stats, self.q, self.k, self.scale, spec)
        return out.transpose(1, 2), finish_stats(stats, spec, self.key_valid, "chunked")


def _in_threads(work, items, n: int, column_mass, word_map):
    """Run `work` on every n-th item in each of n Python threads, each with single-threaded ops
    (module docstring); column mass and word maps are summed per worker, then added up."""
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


class _NormPass:
    """The norm-based twins chunked computes itself (the table's `pass_kind` "norm"): per block, one matmul
    of P (n, bq, bk) against the keys' [one-hot class x n_j, n_j] (bk, C + 1) per head gives
    sum_j p_ij n_j [class_j = c] and the weighted norm sum_j p_ij n_j; after the loop the class twins are
    their ratio, and the offset twins p_{i,i+o} n_{i+o} / sum_j p_ij n_j are read off the offset masses (no
    pass over the maps)."""

    def __init__(self, norms, classes, weighted, key_class_cols, class_mask=None):
        self.norms, self.classes, self.weighted, self.cols = norms, classes, weighted, key_class_cols
        self.class_mask = class_mask  # (B, C, L) 0/1 rows for the compiled sums (`cpu_rows.norm_sums_`), or None

    @classmethod
    def of(cls, spec: StatsSpec, norms, key_valid, key_class, dtype, compiled: bool = False):
        if norms is None:
            raise ValueError("spec.norms needs the per-key value norms (norms=...)")
        B, L = key_valid.shape
        norms = torch.where(key_valid[:, None, :], norms.to(dtype), 0)  # (B, H, L): padding keys count 0
        H = norms.shape[1]
        C = spec.n_key_classes if STAT["class_mass_norm"].asked(spec) else 0  # norms may name the twins it asks
        # (B, L, C + 1): each key's one-hot class, then 1 (the weighted norm's column); times n_j per head later
        cols = torch.cat([torch.nn.functional.one_hot(key_class, C).to(dtype) if C else key_valid.new_zeros(B, L, 0,
                          dtype=dtype), key_valid.new_ones(B, L, 1, dtype=dtype)], dim=-1)
        classes = torch.empty(B, H, L, C, dtype=dtype, device=norms.device) if C else None
        weighted = torch.empty(B, H, L, dtype=dtype, device=norms.device)
        mask = cols[..., :C].transpose(1, 2).contiguous() if compiled else None  # (B, C, L)
        return cls(norms.contiguous(), classes, weighted, cols, mask)

    def block(self, p, b, hs, i0, i1, k0, k1, threads=None):
        """p (n, bq, bk): the block's probabilities of heads hs, rows i0..i1-1, keys k0..k1-1."""
        if self.class_mask is not None:  # one short pass per class over each row, compiled (cpu_rows.c)
            classes = self.classes[b, hs] if self.classes is not None else self.weighted[b, hs, :, None][..., :0]
            cpu_rows.norm_sums_(p, i0, self.norms[b, hs, k0:k1], self.class_mask[b, :, k0:k1], self.weighted[b, hs],
                                classes, threads)
            return
        rhs = self.cols[b, None, k0:k1] * self.norms[b, hs, k0:k1, None]  # (n, bk, C + 1)
        sums = torch.matmul(p, rhs)  # (n, bq, C + 1)
        self.weighted[b, hs, i0:i1] = sums[..., -1]
        if self.classes is not None:
            self.classes[b, hs, i0:i1] = sums[..., :-1]

    def finish(self, stats: RowStats, spec: StatsSpec, offset_mass):
        wn = self.weighted  # (B, H, L)
        inv = torch.where(wn > 0, 1 / torch.where(wn > 0, wn, 1), 0)[..., None]  # (B, H, L, 1); 0 where wn = 0
        stats.weighted_norm = wn
        if self.classes is not None:
            stats.class_mass_norm = self.classes * inv
        if offset_mass is not None and STAT["offset_mass_norm"].asked(spec):
            # p_{i,i+o} n_{i+o}: n at the offset's key (offset mass 0 outside the row)
            B, H, L = wn.shape
            j = torch.arange(L, device=wn.device)[:, None] + torch.tensor(spec.offsets, device=wn.device)  # (L, O)
            j = j.clamp(0, L - 1)
            n_at = self.norms.gather(-1, j.reshape(1, 1, -1).expand(B, H, -1)).view(B, H, L, -1)  # (B, H, L, O)
            stats.offset_mass_norm = offset_mass * n_at * inv


def _rows(t, *index):
    return None if t is None else t[index]


def _torch_rows(s, i0, k0, lo, hi, key_valid, spec, entropy, offset_mass, argmax):
    """The torch row pass of one block, in place: s (n, bq, bk) scores of queries i0.. against
    keys k0..; lo, hi (bq,) each row's band; key_valid (bk,). Keys outside a row's band or padding
    get probability 0 (a row that sees none, a padding query's, becomes uniform: finite)."""
    bq, bk = s.shape[1:]
    keys = torch.arange(k0, k0 + bk, device=s.device)  # (bk,) absolute positions
    visible = (keys >= lo[:, None]) & (keys <= hi[:, None]) & key_valid  # (bq, bk)
    s.masked_fill_(~visible, torch.finfo(s.dtype).min)
    top = s.amax(-1)  # (n, bq)
    p = torch.softmax(s, dim=-1)  # (n, bq, bk)
    if entropy is not None:  # H = lse - sum_j p_j s_j, lse = max s - ln max p
        entropy.copy_(top - torch.log(p.amax(-1)) - torch.linalg.vecdot(p, s))
    if spec.offsets:
        j = torch.arange(i0, i0 + bq, device=s.device)[:, None] + torch.tensor(spec.offsets, device=s.device)  # (bq, O)
        inside = (j >= lo[:, None]) & (j <= hi[:, None])
        picked = p.gather(-1, (j - k0).clamp(0, bk - 1).expand(s.shape[0], -1, -1))  # (n, bq, O)
        offset_mass.copy_(picked * inside)
    if argmax is not None:
        argmax.copy_(p.argmax(-1) + k0)
    s.copy_(p)
