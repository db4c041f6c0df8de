"""The Triton kernels under every `AttentionLayout` (causal, windowed, grouped-query) against
the eager oracle, run by Triton's interpreter on the CPU: the fused forward's layout path
(`fused_attention_layout`; test_triton_table.py checks every statistic of the table), column
mass and word maps (`triton_maps`), and Jensen-Shannon
between heads (`triton_js`), with left and right padding, odd lengths, single-key rows and
several key blocks (small blocks forced where the shipped ones would cover the whole row).

TRITON_INTERPRET=1 must be set before triton is imported (see test_triton_attention.py).
"""
import dataclasses
import math
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernel_maps import random_units
from test_layout import layouts, padded
from test_triton_attention import fp32
from triton_interpreter import emulate_bf16_dots, spy_launches

import bertscope.kernels.triton_attention as ta
from bertscope.kernels import triton_maps
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import PLAIN, AttentionLayout, LayerGates, StatsSpec, asked_stats, visible_mask
from bertscope.kernels.triton_js import pairwise_js_triton

if not ta.INTERPRETED:
    pytest.fail("bertscope.kernels.triton_attention was imported before TRITON_INTERPRET=1 was set", pytrace=False)
emulate_bf16_dots()

SPEC = StatsSpec(offsets=(-2, -1, 0, 1, 3), n_key_classes=4, class_mass=True, entropy=True, argmax=True,
                 column_mass=True)
# the float row statistics of the table SPEC asks for (the argmax is compared exactly, column mass per key)
ROW_FIELDS = tuple(s.name for s in asked_stats(SPEC) if s.dtype == "float" and s.padding is not None)
SMALL = dict(BLOCK_M=16, BLOCK_N=16)  # tl.dot's smallest tiles: several blocks at short L


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def make_inputs(B, H, L, D, layout, pads, left, seed=0, dtype=torch.float32, C=4):
    g = torch.Generator().manual_seed(seed)
    H_kv = layout.n_key_value_heads or H
    q, k, v = (torch.randn(B, h, L, D, generator=g) * 2 for h in (H, H_kv, H_kv))
    key_valid = padded(B, L, [min(p, L - 1) for p in pads], left)
    key_class = torch.randint(0, C, (B, L), generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype), key_valid, key_class


def triton(inputs, layout, spec=SPEC, blocks=None, gates=None, pooling=None):
    """attention_stats_triton with the fused kernel's blocks overridden (for several blocks at small L)."""
    if blocks is None:
        return ta.attention_stats_triton(*inputs, spec, layout=layout, gates=gates, pooling=pooling)
    real = ta.fused_attention_layout

    def forced(*a, **kw):
        return real(*a, **{**kw, "blocks": blocks})

    ta.fused_attention_layout = forced
    try:
        return ta.attention_stats_triton(*inputs, spec, layout=layout, gates=gates, pooling=pooling)
    finally:
        ta.fused_attention_layout = real


def assert_same(ref, got, key_valid, atol=1e-5, rtol=1e-5):
    (out_r, sr), (out_g, sg) = ref, got
    rows = key_valid[:, :, None, None]  # (B, L, 1, 1): padding rows' outputs are not compared
    torch.testing.assert_close(out_g * rows, out_r * rows, atol=atol, rtol=rtol)
    for name in (*ROW_FIELDS, "column_mass"):
        torch.testing.assert_close(getattr(sg, name), getattr(sr, name), atol=atol, rtol=rtol, msg=name)
    assert torch.equal(sg.argmax, sr.argmax)
    assert sg.layout == sr.layout


CASES = [  # (layout, H, left padding)
    (AttentionLayout(causal=True), 2, True),
    (AttentionLayout(causal=True, n_key_value_heads=2), 4, False),
    (AttentionLayout(causal=True, window=(5, 0), n_key_value_heads=1), 3, True),
    (AttentionLayout(window=(4, 6)), 2, False),
    (AttentionLayout(window=(7, 2), n_key_value_heads=1), 4, True),
    (AttentionLayout(n_key_value_heads=1), 3, True),
]


@pytest.mark.parametrize("layout,H,left", CASES, ids=lambda x: x.describe() if isinstance(x, AttentionLayout) else x)
def test_matches_eager_across_several_blocks(layout, H, left):
    """L = 45 in 16-key blocks (three blocks, odd length), pads 0 / 6 / 44 (a one-token sequence)."""
    inputs = make_inputs(3, H, 45, 8, layout, [0, 6, 44], left, seed=H)
    assert_same(attention_stats_eager(*inputs, SPEC, layout=layout), triton(inputs, layout, blocks=SMALL), inputs[3])


def test_matches_eager_with_the_shipped_blocks():
    """fp32's shipped blocks (16 stacked rows x 16 keys) at L = 70: a tile of 2 heads spans 8 positions."""
    layout = AttentionLayout(causal=True, window=(20, 0), n_key_value_heads=1)
    inputs = make_inputs(2, 2, 70, 16, layout, [0, 11], True, seed=3)
    assert_same(attention_stats_eager(*inputs, SPEC, layout=layout), triton(inputs, layout), inputs[3])


@settings(max_examples=8, deadline=None)
@given(layout=layouts(), L=st.integers(1, 40), pads=st.lists(st.integers(0, 5), min_size=1, max_size=2),
       left=st.booleans(), small=st.booleans(), seed=st.integers(0, 10**6))
def test_matches_eager_on_random_layouts(layout, L, pads, left, small, seed):
    H = 2 * (layout.n_key_value_heads or 1)
    inputs = make_inputs(len(pads), H, L, 4, layout, pads, left, seed=seed)
    got = triton(inputs, layout, blocks=SMALL if small else None)
    assert_same(attention_stats_eager(*inputs, SPEC, layout=layout), got, inputs[3])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype):
    """fp16 / bf16 against eager in fp32 on the same rounded values, at test_triton_attention's
    tolerances (one ulp of the storage dtype); the argmax where the top two visible scores
    are not within fp32 rounding of a tie."""
    layout = AttentionLayout(causal=True, window=(9, 0), n_key_value_heads=2)
    inputs = make_inputs(2, 4, 40, 16, layout, [0, 7], True, seed=8, dtype=dtype)
    spec = dataclasses.replace(SPEC, column_mass=False)
    ref = attention_stats_eager(*map(fp32, inputs), spec, layout=layout)
    got = triton(inputs, layout, spec=spec, blocks=SMALL)
    q, k, v, key_valid, _ = inputs
    rows = key_valid[:, :, None, None]
    out_tol = (dict(atol=5e-3, rtol=5e-3) if dtype == torch.float16
               else dict(atol=2**-6 * float(v.abs().max()), rtol=0))
    stat_tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float16 else dict(atol=1e-3, rtol=1.6e-2)
    assert got[0].dtype == dtype
    torch.testing.assert_close(got[0].float() * rows, ref[0] * rows, **out_tol)
    for name in ROW_FIELDS:
        torch.testing.assert_close(getattr(got[1], name).float(), getattr(ref[1], name), **stat_tol, msg=name)
    s = torch.matmul(q.float(), k.float().repeat_interleave(2, dim=1).transpose(-1, -2))  # (B, H, L, L)
    top2 = s.masked_fill(~visible_mask(key_valid, layout), -1e30).topk(2, -1).values
    clear = (top2[..., 0] - top2[..., 1] > 1e-4 * top2[..., 0].abs().clamp(min=1)) & key_valid[:, None, :]
    assert int(clear.sum()) > 100
    assert torch.equal(got[1].argmax[clear], ref[1].argmax[clear])


def test_gates_are_uniform_over_the_visible_keys():
    """KEEP, ZERO, UNIFORM and a float gate on the 4 query heads of one key/value head, causal
    window over left padding: a uniform head's row is the mean of V over the keys it sees."""
    layout = AttentionLayout(causal=True, window=(3, 0), n_key_value_heads=1)
    inputs = make_inputs(2, 4, 37, 8, layout, [0, 5], True, seed=5)
    gates = LayerGates(xi=torch.tensor([1.0, 0.0, 1.0, 0.5]), uniform=torch.tensor([False, False, True, True]))
    ref = attention_stats_eager(*inputs, SPEC, gates=gates, layout=layout)
    got = triton(inputs, layout, gates=gates, blocks=SMALL)
    assert_same(ref, got, inputs[3])
    v = inputs[2]
    torch.testing.assert_close(got[0][1, 10, 2], v[1, 0, 7:11].mean(0))  # position 10 sees 7..10 (window 3)
    torch.testing.assert_close(got[0][1, 5, 3], 0.5 * v[1, 0, 5])  # the first real row sees itself only
    assert got[0][:, :, 1].abs().sum() == 0
    plain = triton(inputs, layout, blocks=SMALL)[1]
    for name in (*ROW_FIELDS, "argmax"):  # statistics ignore the gates
        assert torch.equal(getattr(got[1], name), getattr(plain, name)), name


def test_single_key_rows_under_left_padding():
    """The first real token of a causal left-padded sequence sees itself only."""
    layout = AttentionLayout(causal=True, n_key_value_heads=1)
    q, k, v, key_valid, key_class = make_inputs(2, 2, 20, 8, layout, [0, 13], True, seed=1)
    out, s = triton((q, k, v, key_valid, key_class), layout, blocks=SMALL)
    assert torch.all(s.entropy[:, :, 0].abs() < 1e-6) and torch.all(s.entropy[1, :, 13].abs() < 1e-6)
    torch.testing.assert_close(s.offset_mass[1, :, 13, SPEC.offsets.index(0)], torch.ones(2))
    assert torch.all(s.argmax[1, :, 13] == 13)
    torch.testing.assert_close(out[1, 13], v[1, 0, 13].expand(2, -1))
    assert s.offset_mass[..., SPEC.offsets.index(1)].abs().max() == 0  # the next token is never seen
    for t in (s.entropy, s.offset_mass, s.class_mass, s.argmax):  # padding queries (they see no key) are zero
        assert t[1, :, :13].abs().sum() == 0


@pytest.mark.parametrize("layout,H,poison,check", [
    (AttentionLayout(causal=True), 1, slice(48, None), slice(0, 48)),  # above the diagonal
    (AttentionLayout(causal=True, n_key_value_heads=1), 2, slice(48, None), slice(0, 48)),  # stacked rows
    (AttentionLayout(causal=True, window=(8, 0)), 1, slice(0, 16), slice(32, None)),  # behind the window
    (AttentionLayout(window=(4, 4)), 1, slice(0, 8), slice(32, None)),  # both sides
])
def test_blocks_outside_the_band_are_never_read(layout, H, poison, check):
    """K and V are NaN at keys no tile of the checked rows may visit: those rows stay exact."""
    inputs = make_inputs(1, H, 64, 8, layout, [0], True, seed=2)
    ref = attention_stats_eager(*inputs, SPEC, layout=layout)
    q, k, v, key_valid, key_class = inputs
    k, v = k.clone(), v.clone()
    k[:, :, poison] = float("nan")
    v[:, :, poison] = float("nan")
    spec = dataclasses.replace(SPEC, column_mass=False)
    out, s = triton((q, k, v, key_valid, key_class), layout, spec=spec, blocks=SMALL)
    torch.testing.assert_close(out[:, check], ref[0][:, check], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.entropy[..., check], ref[1].entropy[..., check], atol=1e-5, rtol=1e-5)


def test_argmax_ties_go_to_the_lowest_index_whatever_the_block_order():
    """Window (20, 20) in 16-key blocks: the tile of rows 16..31 visits its unmasked middle
    (keys 16..31) first, then the edges (0..15, 32..63). Identical dominant keys in the left
    edge and the middle, and in the middle and the right edge: the lower index wins."""
    layout = AttentionLayout(window=(20, 20))
    q, k, v, key_valid, key_class = make_inputs(1, 2, 64, 4, layout, [0], False, seed=4)
    q = q.round()
    q[0, :, 16:32] = 1.0
    k[0, 0, 10] = k[0, 0, 25] = 50.0  # head 0: rows 16..30 see 10 and 25 -> 10
    k[0, 1, 25] = k[0, 1, 40] = 50.0  # head 1: rows 20..31 see 25 and 40 -> 25
    _, s = triton((q, k, v, key_valid, key_class), layout, blocks=SMALL)
    ref = attention_stats_eager(q, k, v, key_valid, key_class, SPEC, layout=layout)[1].argmax
    assert torch.equal(s.argmax, ref)
    assert s.argmax[0, 0, 16:31].tolist() == [10] * 15 and s.argmax[0, 1, 20:32].tolist() == [25] * 12


@pytest.mark.parametrize("layout,left", [(AttentionLayout(causal=True, window=(6, 0), n_key_value_heads=1), True),
                                         (AttentionLayout(window=(3, 5), n_key_value_heads=2), False)])
def test_word_maps_and_column_mass_under_the_layout(layout, left):
    """Word maps, their argmax and column mass from the fused kernel's lse, through attention_stats."""
    B, H, L = 2, 2, 37
    inputs = make_inputs(B, H, L, 8, layout, [0, 9], left, seed=6, C=2)
    g = torch.Generator().manual_seed(6)
    lengths = inputs[3].sum(-1).tolist()
    unit, candidate = random_units(B, L, lengths, g)
    if left:  # units follow the real tokens, which start after the padding
        for b, n in enumerate(lengths):
            unit[b] = torch.cat([unit[b, n:], unit[b, :n]]) if n < L else unit[b]
    pooling = word_pooling(unit, candidate, "mean")
    spec = StatsSpec(offsets=(0,), n_key_classes=2, column_mass=True, word_maps=True, class_mass=True)
    _, ref = attention_stats(*inputs, spec, backend="eager", pooling=pooling, layout=layout)
    _, got = attention_stats(*inputs, spec, backend="triton", pooling=pooling, layout=layout)
    torch.testing.assert_close(got.column_mass, ref.column_mass, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.word_map, ref.word_map, atol=1e-5, rtol=1e-5)
    top = ref.word_map.sort(-1, descending=True).values
    clear = top[..., 0] - top[..., 1] > 1e-5
    assert torch.equal(got.word_argmax[clear], ref.word_argmax[clear])
    # every real query row gives away 1
    torch.testing.assert_close(got.column_mass.sum(-1), inputs[3].sum(-1, keepdim=True).float().expand(B, H))


@pytest.mark.parametrize("layout,D,forced", [
    (AttentionLayout(causal=True, window=(7, 0), n_key_value_heads=1), 256, None),
    (PLAIN, 256, None),
    (AttentionLayout(causal=True, n_key_value_heads=1), 64, 16),
], ids=["sliding-gqa-256", "plain-256", "causal-gqa-64-in-16"])
def test_word_maps_in_d_slices_match_eager(layout, D, forced, monkeypatch):
    """fp32 word maps above D = 128 sum the scores over 64-wide slices of D (word_map_config's
    BLOCK_DK; at Gemma-3's D = 256 one 256-deep FMA dot spills): the shipped configuration at
    D = 256, and 16-wide slices forced at D = 64, against eager, with left padding."""
    cfg = triton_maps.word_map_config(32, 256, 8, fp32=True)
    assert (cfg["BLOCK_D"], cfg["BLOCK_DK"]) == (256, 64)
    assert triton_maps.word_map_config(32, 256, 8, fp32=False)["BLOCK_DK"] == 256  # half precision: one dot
    if forced:
        real = triton_maps.word_map_config
        monkeypatch.setattr(triton_maps, "word_map_config", lambda *a, **kw: {**real(*a, **kw), "BLOCK_DK": forced})
    B, H, L = 2, 2, 19
    inputs = make_inputs(B, H, L, D, layout, [0, 5], True, seed=D)
    lengths = inputs[3].sum(-1).tolist()
    unit, candidate = random_units(B, L, lengths, torch.Generator().manual_seed(D))
    for b, n in enumerate(lengths):  # left padding: the units follow the real tokens
        unit[b] = torch.cat([unit[b, n:], unit[b, :n]]) if n < L else unit[b]
    pooling = word_pooling(unit, candidate, "mean")
    spec = StatsSpec(offsets=(0,), n_key_classes=4, word_maps=True)
    _, ref = attention_stats(*inputs, spec, backend="eager", pooling=pooling, layout=layout)
    _, got = attention_stats(*inputs, spec, backend="triton", pooling=pooling, layout=layout)
    torch.testing.assert_close(got.word_map, ref.word_map, atol=1e-5, rtol=1e-5)
    assert ref.word_map.sum() > 1  # real maps, not all zero
    top = ref.word_map.sort(-1, descending=True).values
    clear = top[..., 0] - top[..., 1] > 1e-5
    assert clear.any() and torch.equal(got.word_argmax[clear], ref.word_argmax[clear])


def js_reference(q, k, key_valid, scale, layouts_, kv_head):
    """JS by its definition from eager's maps, each head over the keys its rows see (float64)."""
    N = q.shape[1]
    p = []
    for h in range(N):
        s = torch.matmul(q[:, h].double(), k[:, kv_head[h]].double().transpose(-1, -2)) * scale  # (B, L, L)
        s = s.masked_fill(~visible_mask(key_valid, layouts_[h])[:, 0], torch.finfo(torch.float64).min)
        p.append(torch.softmax(s, -1))
    out = torch.zeros(N, N, dtype=torch.float64)
    for a in range(N):
        for c in range(a + 1, N):
            m = (p[a] + p[c]) / 2
            js = (torch.special.xlogy(p[a], p[a] / m.clamp_min(1e-300)) + torch.special.xlogy(p[c], p[c] / m.clamp_min(
                1e-300))).sum(-1) / 2
            out[a, c] = out[c, a] = (js * key_valid).sum()
    return out


def test_js_under_layouts_and_shared_key_heads():
    """Four query heads of two stacked 'layers' over 2 key heads (GQA), a sliding-window layer
    and a global causal one (Gemma-3's mix), left padding; then one layout for all heads."""
    B, L, D = 2, 41, 8
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(B, 4, L, D, generator=g), torch.randn(B, 2, L, D, generator=g)
    key_valid = padded(B, L, [0, 6], True)
    sliding, full = AttentionLayout(causal=True, window=(4, 0)), AttentionLayout(causal=True)
    layouts_, kv_head = [sliding, sliding, full, full], [0, 0, 1, 1]
    got = pairwise_js_triton(q, k, key_valid, 0.5, layouts_, kv_head)
    torch.testing.assert_close(got, js_reference(q, k, key_valid, 0.5, layouts_, kv_head), atol=1e-4, rtol=1e-5)
    gqa = AttentionLayout(causal=True, n_key_value_heads=2)
    got = pairwise_js_triton(q, k, key_valid, 0.5, gqa)
    torch.testing.assert_close(got, js_reference(q, k, key_valid, 0.5, [gqa] * 4, [0, 0, 1, 1]), atol=1e-4,
                               rtol=1e-5)
    assert got[0, 1] > 0 and math.isfinite(float(got.sum()))
    with pytest.raises(ValueError, match="key head"):
        pairwise_js_triton(q, k, key_valid, 0.5, full, kv_head=[0, 1, 2, 0])


def test_triton_computes_every_layout():
    layout = AttentionLayout(causal=True, n_key_value_heads=1)
    inputs = make_inputs(1, 2, 9, 4, layout, [2], True)
    out, stats = attention_stats(*inputs, SPEC, backend="triton", layout=layout)
    assert out.shape == (1, 9, 2, 4) and stats.layout == layout and stats.entropy.dtype == torch.float32


@pytest.mark.parametrize("layout,banded", [(PLAIN, False), (AttentionLayout(n_key_value_heads=1), True),
                                           (AttentionLayout(causal=True), True)], ids=["plain", "gqa", "causal"])
def test_one_kernel_for_every_layout(layout, banded, monkeypatch):
    """Every layout launches the one kernel, `attn_stats_fwd`: the plain one with BANDED off and
    G = 1, every other with BANDED on, all on `forward_config`'s tiles."""
    import bertscope.kernels.triton_launch as launch
    from bertscope.kernels.triton_config import forward_config

    names = launch.attn_stats_fwd.arg_names
    launches = spy_launches(monkeypatch)
    H = 2
    inputs = make_inputs(2, H, 12, 8, layout, [0, 3], False)
    assert_same(attention_stats_eager(*inputs, SPEC, layout=layout), ta.attention_stats_triton(*inputs, SPEC,
                                                                                           layout=layout), inputs[3])
    (kw,) = launches
    paths = launch.argument_paths()  # a named value's place in the kernel's arguments

    def arg(name):
        value = kw[names[paths[name][0]]]
        return value if len(paths[name]) == 1 else value[paths[name][1]]

    assert arg("BANDED") is banded and arg("G") == layout.group_size(H) and arg("GROUP") == 0  # G read at run time
    assert arg("BLOCK_M") == forward_config(8, torch.float32, interpreted=True)["BLOCK_M"]


def test_a_tiny_llama_through_the_plugin_matches_eager():
    """A random-initialised Llama (causal, 4 query / 2 key/value heads) through
    attn_implementation="bertscope" with a left-padded batch: the triton backend's statistics
    and hidden states are eager's. Skipped while the plug-in refuses the family."""
    import copy

    from transformers import LlamaConfig, LlamaModel

    from bertscope.models.attention import HeadProbe

    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, intermediate_size=64, vocab_size=100)
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    model.set_attn_implementation("bertscope")
    ids = torch.randint(0, 100, (2, 21))
    mask = padded(2, 21, [0, 5], True).long()
    spec = StatsSpec(offsets=(-1, 0, 1), n_key_classes=2, entropy=True, class_mass=True, argmax=True)
    key_class = torch.randint(0, 2, (2, 21))
    got = {}
    for backend in ("eager", "triton"):
        probe = HeadProbe(2, 4, spec, backend=backend)
        layers = {}
        with torch.inference_mode(), probe.active(key_class, lambda i, s, kv, out=layers: out.__setitem__(i, s)):
            hidden = copy.deepcopy(model)(input_ids=ids, attention_mask=mask).last_hidden_state
        got[backend] = hidden, layers
    (h_e, s_e), (h_t, s_t) = got["eager"], got["triton"]
    real = mask.bool()
    torch.testing.assert_close(h_t[real], h_e[real], atol=1e-4, rtol=1e-4)
    for i in range(2):
        assert s_t[i].layout.causal and s_t[i].layout.n_key_value_heads == 2
        for name in ("entropy", "offset_mass", "class_mass"):
            torch.testing.assert_close(getattr(s_t[i], name), getattr(s_e[i], name), atol=1e-5, rtol=1e-5)
        assert torch.equal(s_t[i].argmax, s_e[i].argmax)
