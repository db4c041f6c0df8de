"""The chunked CPU backend (both row passes) and the differentiable output under causal,
sliding-window and grouped-query layouts, against the eager oracle; and the proof that the
chunked path never builds an L x L tensor."""
from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_layout import padded
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bertscope.kernels import gates as gates_module
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.chunked import CLASS_MATMUL_MIN, attention_stats_chunked
from bertscope.kernels.common import query_blocks
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.gates import gated_sdpa, uniform_output
from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import ROW_STATS, AttentionLayout, LayerGates, StatsSpec, visible_mask

ROW_PASSES = ["compiled", "torch"]
# every statistic of the kernels' table, switched on, but the norm-based twins, which need per-key norms
# (chunked against eager on every layout: tests/kernels/test_stats_table.py and test_norms.py)
FULL = dict(offsets=(-3, -1, 0, 1, 2), **{s.switch: True for s in ROW_STATS if s.switch not in ("offsets", "norms")})


@st.composite
def layouts(draw, plain=False):
    """Causal or not, a window or not (a causal one is (left, 0), a bidirectional one any (left, right)),
    grouped-query or not; never the plain layout (unless plain)."""
    causal = draw(st.booleans())
    window = draw(st.none() | st.tuples(st.integers(0, 9), st.integers(0, 9)))
    n_kv = draw(st.sampled_from([None, 1, 2]))
    if not plain and not causal and window is None and n_kv is None:
        causal = True
    if causal and window is not None:
        window = (window[0], 0)
    return AttentionLayout(causal=causal, window=window, n_key_value_heads=n_kv)


def make(layout, B, G, L, D, lengths, left, seed, C, dtype=torch.float32, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    H_kv = layout.n_key_value_heads or 2
    H = H_kv * (G if layout.n_key_value_heads else 1)
    q = torch.randn(B, H, L, D, generator=g) * scale
    k, v = (torch.randn(B, H_kv, L, D, generator=g) * scale for _ in range(2))
    valid = padded(B, L, [L - n for n in lengths], left)
    key_class = torch.randint(0, C, (B, L), generator=g)
    words = torch.cumsum(torch.rand(B, L, generator=g) < 0.6, dim=1) - 1  # (B, L): 1-3 tokens per unit
    unit = torch.where(valid, words - words.masked_fill(~valid, 10**6).amin(1, keepdim=True), -1)
    # the per-batch keyword arguments: word pooling, and token ids from 3 tokens (the token relations)
    pool = dict(pooling=word_pooling(unit, torch.rand(B, L, generator=g) < 0.8),
                token_ids=torch.randint(0, 3, (B, L), generator=g))
    return (q.to(dtype), k.to(dtype), v.to(dtype), valid, key_class), pool


def assert_matches(ref, got, valid, spec, atol=2e-5, rtol=1e-5, argmax=True):
    (out_r, sr), (out_g, sg) = ref, got
    assert bool(torch.isfinite(out_g).all()), "a padding row went NaN"
    rows = valid[:, :, None, None]  # (B, L, 1, 1) in the output's layout
    torch.testing.assert_close(out_g * rows, out_r * rows, atol=atol, rtol=rtol)
    for stat in ROW_STATS:  # every entry of the table that the spec asks for
        if not stat.asked(spec):
            assert getattr(sg, stat.name) is None, stat.name
        elif stat.dtype == "float":
            torch.testing.assert_close(getattr(sg, stat.name), getattr(sr, stat.name), atol=atol * 4, rtol=rtol,
                                       msg=stat.name)
        elif argmax:  # an index: equal (callers whose inputs may tie pass argmax=False)
            assert torch.equal(getattr(sg, stat.name), getattr(sr, stat.name)), stat.name
    assert sg.layout == sr.layout


@settings(max_examples=40, deadline=None)
@given(layout=layouts(), B=st.integers(1, 3), G=st.integers(1, 3), L=st.integers(1, 40), D=st.sampled_from([1, 4, 9]),
       left=st.booleans(), C=st.sampled_from([1, 3, CLASS_MATMUL_MIN + 1]), data=st.data())
@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_chunked_matches_eager_under_every_layout(row_pass, layout, B, G, L, D, left, C, data):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    inputs, pool = make(layout, B, G, L, D, lengths, left, data.draw(st.integers(0, 10**6)), C)
    spec = StatsSpec(n_key_classes=C, **FULL)
    # tiny blocks: many query blocks, band edges inside blocks, often one row per block
    G_all = inputs[0].shape[1] // inputs[1].shape[1]
    chunk_bytes = 4 * G_all * data.draw(st.integers(1, 3 * L))
    ref = attention_stats_eager(*inputs, spec, **pool, layout=layout)
    got = attention_stats_chunked(*inputs, spec, **pool, layout=layout, chunk_bytes=chunk_bytes,
                                  row_pass=row_pass)
    assert_matches(ref, got, inputs[3], spec)


@pytest.mark.parametrize("row_pass", ROW_PASSES)
@pytest.mark.parametrize("layout", [AttentionLayout(causal=True, n_key_value_heads=3),
                                    AttentionLayout(causal=True, window=(7, 0), n_key_value_heads=1),
                                    AttentionLayout(window=(5, 5)),
                                    AttentionLayout(causal=True)])
@pytest.mark.parametrize("left", [True, False])
def test_chunked_at_odd_lengths_with_default_blocks(layout, left, row_pass):
    """The default block sizes (what `attention_stats` runs), several blocks at L = 301."""
    spec = StatsSpec(n_key_classes=4, **FULL)
    inputs, pool = make(layout, 2, 3, 301, 16, [301, 118], left, seed=3, C=4)
    ref = attention_stats_eager(*inputs, spec, **pool, layout=layout)
    got = attention_stats_chunked(*inputs, spec, **pool, layout=layout, row_pass=row_pass)
    assert_matches(ref, got, inputs[3], spec)
    out, stats = attention_stats(*inputs, spec, **pool, backend="chunked", layout=layout)
    valid = inputs[3]
    torch.testing.assert_close(out[valid], got[0][valid])  # padding rows: any finite value


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_worker_threads_agree_with_one(row_pass):
    """The blocks shared out to 2 worker threads (column mass and word maps summed per worker)
    give what one thread gives."""
    layout = AttentionLayout(causal=True, n_key_value_heads=1)
    spec = StatsSpec(n_key_classes=3, **FULL)
    inputs, pool = make(layout, 2, 3, 57, 8, [57, 30], True, seed=7, C=3)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.inference_mode():
                results.append(attention_stats_chunked(*inputs, spec, **pool, layout=layout, chunk_bytes=4000,
                                                       row_pass=row_pass))
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    assert_matches(results[0], results[1], inputs[3], spec, atol=1e-6)


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_single_key_rows(row_pass):
    """Window (0, 0): every row sees itself only: entropy 0, all mass on offset 0, argmax itself."""
    layout = AttentionLayout(window=(0, 0), n_key_value_heads=1)
    spec = StatsSpec(n_key_classes=2, **FULL)
    inputs, pool = make(layout, 2, 2, 9, 4, [9, 4], False, seed=1, C=2)
    out, stats = attention_stats_chunked(*inputs, spec, **pool, layout=layout, chunk_bytes=24,
                                         row_pass=row_pass)
    valid = inputs[3]
    rows = valid[:, None, :].expand_as(stats.entropy)
    assert float(stats.entropy.abs().max()) < 1e-6
    assert torch.equal(stats.offset_mass[..., 2][rows], torch.ones(int(rows.sum())))
    assert torch.equal(stats.argmax[rows], torch.arange(9).expand_as(rows)[rows])
    torch.testing.assert_close(out[valid], inputs[2].transpose(1, 2).expand(-1, -1, 2, -1)[valid])


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_causal_left_padding_rows_stay_finite(row_pass):
    """Padding queries under causal left padding see no key: finite before zeroing, zero after."""
    layout = AttentionLayout(causal=True, window=(3, 0), n_key_value_heads=1)
    spec = StatsSpec(n_key_classes=3, **FULL)
    inputs, pool = make(layout, 2, 4, 12, 8, [12, 5], True, seed=2, C=3)
    out, stats = attention_stats_chunked(*inputs, spec, **pool, layout=layout, chunk_bytes=64,
                                         row_pass=row_pass)
    assert bool(torch.isfinite(out).all())
    for name in ("entropy", "offset_mass", "class_mass", "column_mass", "word_map"):
        t = getattr(stats, name)
        assert bool(torch.isfinite(t).all()), name
    assert float(stats.entropy[1, :, :7].abs().max()) == 0.0
    assert float(stats.column_mass[1, :, :7].abs().max()) == 0.0  # padding keys receive nothing
    # column mass adds up to the number of real query rows, whatever the blocks
    torch.testing.assert_close(stats.column_mass.sum(-1), inputs[3].sum(-1, keepdim=True).float().expand(2, 4))


@settings(max_examples=15, deadline=None)
@given(layout=layouts(), L=st.integers(2, 30), left=st.booleans(), seed=st.integers(0, 99))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_widened(dtype, layout, L, left, seed):
    """The compiled pass widens half-precision q, k, v: the statistics of the rounded inputs, in float32."""
    spec = StatsSpec(n_key_classes=3, **FULL)
    inputs, pool = make(layout, 2, 2, L, 8, [L, max(1, L // 2)], left, seed, C=3, dtype=dtype)
    got = attention_stats_chunked(*inputs, spec, **pool, layout=layout, chunk_bytes=200, row_pass="compiled")
    assert got[0].dtype == dtype and got[1].entropy.dtype == torch.float32
    wide = tuple(t.float() for t in inputs[:3]) + inputs[3:]
    ref = attention_stats_eager(*wide, spec, **pool, layout=layout)
    assert_matches(ref, (got[0].float(), got[1]), inputs[3], spec, atol=1e-2, rtol=1e-2, argmax=False)
    torch.testing.assert_close(got[1].entropy, ref[1].entropy, atol=1e-4, rtol=1e-4)


# --- the block logic: never an L x L tensor ----------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(layout=layouts(plain=True), L=st.integers(1, 300), G=st.integers(1, 4), budget=st.integers(1, 5000),
       min_rows=st.integers(1, 100))
def test_query_blocks_cover_every_band_within_the_budget(layout, L, G, budget, min_rows):
    blocks = query_blocks(L, G, layout, budget, min_rows)
    assert blocks[0][0] == 0 and blocks[-1][1] == L
    floor_rows = -(-min_rows // G)
    for (i0, i1, k0, k1), nxt in zip(blocks, blocks[1:] + [None]):
        assert nxt is None or nxt[0] == i1
        lo, hi = layout.key_band(torch.arange(i0, i1), L)
        assert k0 == int(lo.min()) and k1 == int(hi.max()) + 1  # exactly the rows' bands
        if i1 - i0 > floor_rows:  # beyond the minimum rows, the budget holds
            assert G * (i1 - i0) * (k1 - k0) <= budget
        assert i1 - i0 >= min(floor_rows, L - i0)
        if layout.window is not None:
            assert i1 - i0 <= max(floor_rows, sum(layout.window) + 1)


def test_causal_blocks_cost_half_the_map_and_windows_a_band():
    L = 4096
    causal = query_blocks(L, 3, AttentionLayout(causal=True), 1 << 18, 64)
    cost = sum((i1 - i0) * (k1 - k0) for i0, i1, k0, k1 in causal)
    assert L * L / 2 < cost < 0.56 * L * L
    window = query_blocks(L, 4, AttentionLayout(causal=True, window=(511, 0)), 1 << 18, 64)
    cost = sum((i1 - i0) * (k1 - k0) for i0, i1, k0, k1 in window)
    assert cost < L * (512 + 64) * 1.1


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op creates inside the block."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes() // max(1, t.element_size()))
        return out


@pytest.mark.parametrize("layout", [AttentionLayout(causal=True, n_key_value_heads=3),
                                    AttentionLayout(causal=True, window=(63, 0), n_key_value_heads=1)])
@pytest.mark.parametrize("backend", ["chunked", "chunked-torch", "eager"])
def test_no_l_by_l_tensor(backend, layout):
    """The chunked backend at L = 2048 with default blocks: its largest tensor is a block of scores
    (1 MiB), never a map (4 Mi elements per head). The same probe sees eager's maps, so it can fail."""
    L = 2048
    spec = StatsSpec(n_key_classes=4, offsets=(-1, 0, 1), entropy=True, class_mass=True, argmax=True,
                     column_mass=True)
    inputs, _ = make(layout, 1, 3, L, 8, [L - 5], True, seed=0, C=4)
    fn = {"chunked": attention_stats_chunked, "eager": attention_stats_eager,
          "chunked-torch": functools.partial(attention_stats_chunked, row_pass="torch")}[backend]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one worker: a dispatch mode sees the ops of its own thread only
    try:
        with torch.inference_mode(), LargestTensor() as probe:
            fn(*inputs, spec, layout=layout)
    finally:
        torch.set_num_threads(threads)
    if backend == "eager":
        assert probe.largest >= L * L
    else:
        assert probe.largest <= max(1 << 18, 64 * L)  # one block of scores (1 MiB, or the 64 rows' minimum)


def test_no_l_by_l_tensor_in_gated_sdpa(monkeypatch):
    L = 1024
    layout = AttentionLayout(causal=True, window=(31, 0), n_key_value_heads=1)
    inputs, _ = make(layout, 1, 2, L, 8, [L - 3], True, seed=0, C=1)
    with torch.inference_mode(), LargestTensor() as probe:
        gated_sdpa(*inputs[:4], None, layout=layout)
    assert probe.largest < L * L // 4


# --- the differentiable output and the uniform gate ------------------------------------------


def sdpa_reference(q, k, v, valid, layout, scale=None):
    """SDPA with the L x L visibility mask (the lead's definition); rows that see nothing attend to all."""
    mask = visible_mask(valid, layout)
    mask = mask | ~mask.any(-1, keepdim=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                           enable_gqa=k.shape[1] != q.shape[1])
    return out.transpose(1, 2)


@settings(max_examples=30, deadline=None)
@given(layout=layouts(plain=True), L=st.integers(1, 40), left=st.booleans(), pad=st.integers(0, 5),
       block=st.integers(1, 400), seed=st.integers(0, 99))
def test_gated_sdpa_by_blocks_matches_the_masked_sdpa_with_gradients(layout, L, left, pad, block, seed):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gates_module, "SDPA_BLOCK_ELEMENTS", block)  # many query blocks
        inputs, _ = make(layout, 2, 2, L, 4, [L, max(1, L - pad)], left, seed, C=1, dtype=torch.float64)
        q, k, v, valid, _ = inputs
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = gated_sdpa(*leaves, valid, None, layout=layout)
        ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = sdpa_reference(*ref_leaves, valid, layout)
        rows = valid[:, :, None, None]
        torch.testing.assert_close(out * rows, ref * rows)
        w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(seed)) * rows
        (out * w).sum().backward()
        (ref * w).sum().backward()
        for a, b in zip(leaves, ref_leaves):
            torch.testing.assert_close(a.grad, b.grad)


def test_gated_sdpa_plain_path_is_transformers_sdpa():
    inputs, _ = make(AttentionLayout(), 2, 1, 13, 8, [13, 6], False, seed=0, C=1)
    q, k, v, valid, _ = inputs
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
    assert torch.equal(gated_sdpa(q, k, v, valid, None), ref.transpose(1, 2).contiguous())


@settings(max_examples=40, deadline=None)
@given(layout=layouts(plain=True), L=st.integers(1, 30), left=st.booleans(), pad=st.integers(0, 5),
       seed=st.integers(0, 99))
def test_uniform_output_is_the_mean_over_visible_keys(layout, L, left, pad, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(2, 2, L, 3, generator=g, dtype=torch.float64) + 5
    valid = padded(2, L, [0, min(pad, L - 1)], left)
    mask = visible_mask(valid, layout).double()  # (B, 1, L, L)
    mean = mask @ v / mask.sum(-1, keepdim=True).clamp_min(1)  # (B, H, L, D) by the definition
    got = uniform_output(v, valid, layout).expand_as(mean)
    rows = valid[:, None, :, None]
    torch.testing.assert_close(got * rows, mean * rows)
    assert bool(torch.isfinite(got).all())  # padding rows (which may see no key): finite


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_uniform_gate_under_gqa_window_in_chunked(row_pass):
    layout = AttentionLayout(causal=True, window=(2, 0), n_key_value_heads=1)
    spec = StatsSpec(n_key_classes=1, entropy=True)
    inputs, _ = make(layout, 2, 3, 10, 4, [10, 6], True, seed=4, C=1)
    gates = LayerGates(xi=torch.tensor([1.0, 0.5, 2.0]), uniform=torch.tensor([[True, False, False],
                                                                               [False, True, True]]))
    ref = attention_stats_eager(*inputs, spec, gates=gates, layout=layout)
    got = attention_stats_chunked(*inputs, spec, gates=gates, layout=layout, chunk_bytes=40, row_pass=row_pass)
    rows = inputs[3][:, :, None, None]
    torch.testing.assert_close(got[0] * rows, ref[0] * rows)
