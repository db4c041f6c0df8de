"""Microbenchmarks of the attention-statistics kernels, and their memory traffic on paper.

    python -m pytest bench/ --benchmark-only        # the kernel benchmarks, grouped by shape
    python -m pytest bench/ -s -k working_set       # bytes per head on paper + working-set bound

The `triton` rows run only where torch sees a GPU (inputs moved to it, timed after a
synchronize); interpreter runs are not speed. `bench/bench_triton.py` has the GPU table
with triton.testing.do_bench, the AOT resources and the traffic model.

Not part of the test suite (pytest.ini: testpaths = tests; CI runs `pytest tests`).
"""
from __future__ import annotations

import functools
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bertscope.kernels.chunked import DEFAULT_CHUNK_BYTES, attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import StatsSpec

# offsets -2..2, 4 key classes, entropy, class masses and argmax (what `bertscope run --argmax` asks for)
SPEC = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4, entropy=True, class_mass=True, argmax=True)
D = 32  # MiniLM / BERT-base head size is 32 / 64
SHAPES = [(8, 12, 128), (4, 12, 512), (1, 12, 2048)]  # (B, H, L)
ROUNDS = {128: 30, 512: 15, 2048: 7}
KERNELS = {
    "eager": attention_stats_eager,
    "chunked": attention_stats_chunked,  # the compiled row pass (cpu_rows.c) when it builds
    "chunked-torch": functools.partial(attention_stats_chunked, row_pass="torch"),
    "triton": None,  # bound below, on a GPU only
}
F32 = 4


def make_inputs(B, H, L, seed=0):
    """fp32 q, k, v ~ N(0, 1) (B, H, L, D); about 1/8 of the batch's keys are padding."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    lengths = [L - (L // 8) * (b + 1) // B for b in range(B)]  # the last row loses L/8 keys
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    assert not key_valid.all()
    key_class = torch.randint(0, SPEC.n_key_classes, (B, L), generator=g)
    return q, k, v, key_valid, key_class


def shape_id(shape):
    B, H, L = shape
    return f"{B}x{H}x{L}"


@pytest.mark.parametrize("backend", list(KERNELS))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_kernel(benchmark, shape, backend):
    B, H, L = shape
    benchmark.group = f"B x H x L = {shape_id(shape)}, D={D}"
    benchmark.extra_info.update(B=B, H=H, L=L, D=D, maps_per_s_unit="B*H maps per call")
    inputs = make_inputs(B, H, L)
    fn = KERNELS[backend]
    sync = lambda: None  # noqa: E731
    if backend == "triton":
        if not torch.cuda.is_available():
            pytest.skip("the triton kernels are timed on a GPU only (interpreter runs are not speed)")
        from bertscope.kernels.triton_attention import attention_stats_triton as fn

        inputs = tuple(t.cuda() for t in inputs)
        sync = torch.cuda.synchronize

    def call():
        with torch.inference_mode():
            result = fn(*inputs, SPEC)
            sync()
            return result

    out, stats = benchmark.pedantic(call, rounds=ROUNDS[L], warmup_rounds=1, iterations=1)
    assert out.shape == (B, L, H, D) and stats.entropy.shape == (B, H, L)


# --- memory traffic and working set -----------------------------------------------------


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of tensor storages created inside the block that are alive at once.

    Every op's outputs are counted when created and uncounted when their storage is freed
    (a weakref finalizer on the storage), so views and in-place ops cost nothing and the
    inputs, created before the block, are not counted.
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._tracked = {}

    def _freed(self, key, nbytes):
        self.live -= nbytes
        self._tracked.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = id(storage)
                if key not in self._tracked:
                    n = storage.nbytes()
                    self._tracked[key] = weakref.finalize(storage, self._freed, key, n)
                    self.live += n
                    self.peak = max(self.peak, self.live)
        return out


def peak_live_bytes(fn, inputs, **kwargs) -> int:
    with torch.inference_mode():
        probe = LiveTensorBytes()
        with probe:
            result = fn(*inputs, SPEC, **kwargs)
        del result
    return probe.peak


def maps_per_chunk(L, chunk_bytes, H=12):
    """What attention_stats_chunked does: n maps of L x L fp32 per chunk, at least one, at
    most one sequence's H heads (the compiled path's chunks never straddle sequences)."""
    return max(1, min(H, chunk_bytes // (L * L * F32)))


def paper_bytes_per_head(L, n_maps_per_chunk):
    """Bytes per (batch, head) map that must cross the memory bus, on paper.

    eager (kernels/eager.py) materialises full (B, H, L, L) tensors: it writes scores, the
    masked scores, the probabilities P and xlogy(P, P) (4 maps), and reads them back 7
    times (masked_fill, softmax, P @ V, xlogy, its sum, P @ onehot, argmax). At these
    shapes B*H*L^2*4 is far beyond any cache, so all of it is DRAM traffic.
    chunked works on one chunk of n maps at a time (its compiled row pass reads each score
    row once from L2 and does the rest in L1); a chunk of chunk_bytes stays in cache, so the
    map traffic stays in cache (unless one L x L map alone
    exceeds it: then a chunk is one map and spills like eager's, but only one map's worth
    is ever live). What must cross the bus is O(L * D): q, k, v in, output (with the class
    columns), offsets and entropy out.
    """
    L2 = L * L * F32
    eager = {"map writes": 4 * L2, "map reads": 7 * L2}
    chunk = n_maps_per_chunk * L2
    linear = (3 * L * D + L * (D + SPEC.n_key_classes) + L * (len(SPEC.offsets) + 2)) * F32
    return eager, chunk, linear


def linear_bytes_bound(B, H, L):
    """Generous bound on what chunked legitimately holds besides maps: O(B*H*L*(D+C+O))."""
    C, O = SPEC.n_key_classes, len(SPEC.offsets)
    return 6 * B * H * L * (D + C + O + 2) * F32


def test_bytes_per_head_and_chunked_working_set():
    MiB = 1024 * 1024
    print(f"\nfp32, D={D}, the StatsSpec of `bertscope run --argmax`, "
          f"chunk_bytes={DEFAULT_CHUNK_BYTES / MiB:g} MiB. On paper, per "
          "(batch, head) map: bytes over the memory bus; measured: peak live tensor bytes of one call")
    print(f"{'B x H x L':>10} | {'eager/head':>10} | {'chunked/head':>12} | {'ratio':>6} | "
          f"{'eager map set':>13} | {'chunk (n maps)':>15} | {'peak: eager':>11} | {'chunked':>9}")
    for B, H, L in SHAPES:
        n = maps_per_chunk(L, DEFAULT_CHUNK_BYTES)
        eager, chunk, linear = paper_bytes_per_head(L, n)
        inputs = make_inputs(B, H, L)
        peak_eager = peak_live_bytes(attention_stats_eager, inputs)
        peak_chunked = peak_live_bytes(attention_stats_chunked, inputs)
        e = sum(eager.values())
        print(f"{shape_id((B, H, L)):>10} | {e / MiB:6.2f} MiB | {linear / 1024:8.1f} KiB | {e / linear:5.0f}x | "
              f"{B * H * L * L * F32 / MiB:9.1f} MiB | {chunk / MiB:6.2f} MiB ({n:2d}) | "
              f"{peak_eager / MiB:7.1f} MiB | {peak_chunked / MiB:5.1f} MiB"
              + ("  * one map > chunk_bytes: the chunk is 1 map, beyond L2"
                 if L * L * F32 > DEFAULT_CHUNK_BYTES else ""))

        # the bound: whatever the chunk size, chunked holds O(B*H*L*D) operands plus a few chunks
        for n_maps in (1, 4, n):
            chunk_bytes = n_maps * L * L * F32
            peak = peak_live_bytes(attention_stats_chunked, inputs, chunk_bytes=chunk_bytes)
            bound = linear_bytes_bound(B, H, L) + 3 * min(n_maps, B * H) * L * L * F32
            assert peak <= bound, (B, H, L, n_maps, peak, bound)
        # and the bound has teeth: eager's full maps break it wherever the maps dominate
        if B * H * L * L >= 4 * B * H * L * (D + 11):
            assert peak_eager > linear_bytes_bound(B, H, L) + 3 * n * L * L * F32
