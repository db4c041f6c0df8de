"""Jensen-Shannon between heads of decoders: grouped-query keys and each layer's own layout
(Gemma-3 alternates sliding-window and global layers), against JS on the materialised maps."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_layout import padded

from bertscope.kernels.backends import attention_stats
from bertscope.kernels.js import pairwise_js, stack_layers
from bertscope.kernels.spec import AttentionLayout, RowStats, StatsSpec


def js_of_maps(maps, rows):
    """JS by its definition from materialised maps (N, B, L, L) float64, summed over rows (B, L)."""
    N = len(maps)
    out = torch.zeros(N, N, dtype=torch.float64)
    for a in range(N):
        for b in range(N):
            m = (maps[a] + maps[b]) / 2
            kl_a, kl_b = (torch.special.xlogy(p, p / m.clamp_min(1e-300)).sum(-1) for p in (maps[a], maps[b]))
            out[a, b] = ((kl_a + kl_b) / 2 * rows).sum()
    return out


def maps_of_layer(q, k, valid, layout, scale):
    """The layer's attention maps (H, B, L, L) from the eager oracle's own definition (softmax
    over the visible keys, key head h // G)."""
    G = layout.group_size(q.shape[1])
    s = torch.matmul(q.double(), k.double().repeat_interleave(G, 1).transpose(-1, -2)) * scale  # (B, H, L, L)
    from bertscope.kernels.spec import visible_mask

    s = s.masked_fill(~visible_mask(valid, layout), torch.finfo(s.dtype).min)
    return torch.softmax(s, -1).transpose(0, 1)


LAYER_LAYOUTS = st.sampled_from([
    AttentionLayout(causal=True, window=(3, 0), n_key_value_heads=1),
    AttentionLayout(causal=True, n_key_value_heads=1),
    AttentionLayout(causal=True, n_key_value_heads=2),
    AttentionLayout(causal=True),
    AttentionLayout(window=(2, 2)),
    AttentionLayout(),
])


@settings(max_examples=25, deadline=None)
@given(layer_layouts=st.lists(LAYER_LAYOUTS, min_size=1, max_size=3), L=st.integers(1, 14), left=st.booleans(),
       pad=st.integers(0, 5), seed=st.integers(0, 999), rows=st.integers(1, 20))
def test_js_under_layouts_matches_the_maps(layer_layouts, L, left, pad, seed, rows):
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, 4, 4
    valid = padded(B, L, [0, min(pad, L - 1)], left)
    layers, maps = [], []
    for layout in layer_layouts:
        H_kv = layout.n_key_value_heads or H
        q = torch.randn(B, H, L, D, generator=g) * 2
        k = torch.randn(B, H_kv, L, D, generator=g) * 2
        layers.append(RowStats(queries=q, keys=k, scale=0.5, layout=layout))
        maps += list(maps_of_layer(q, k, valid, layout, 0.5))
    ref = js_of_maps(maps, valid.double())
    q, k, layouts = stack_layers(layers)
    eager = pairwise_js(q, k, valid, 1.0, backend="eager", layouts=layouts)
    torch.testing.assert_close(eager, ref, atol=1e-9, rtol=1e-9)
    # rows * ...: query blocks of a few rows, and blocks of pairs
    fast = pairwise_js(q, k, valid, 1.0, backend="chunked", layouts=layouts, pair_bytes=rows * 4 * L * 4)
    torch.testing.assert_close(fast, ref, atol=2e-4, rtol=1e-4)


def test_js_of_a_causal_head_differs_from_its_bidirectional_twin():
    """Same q and k, one layer causal and one not: their rows differ (JS > 0) except the last row,
    which sees every key either way; a layout that were ignored would give 0."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 6, 4, generator=g), torch.randn(1, 1, 6, 4, generator=g)
    valid = torch.ones(1, 6, dtype=torch.bool)
    layers = [RowStats(queries=q, keys=k, scale=1.0, layout=AttentionLayout(causal=True)),
              RowStats(queries=q, keys=k, scale=1.0, layout=AttentionLayout())]
    qs, ks, layouts = stack_layers(layers)
    assert layouts is not None
    js = pairwise_js(qs, ks, valid, 1.0, backend="chunked", layouts=layouts)
    assert float(js[0, 1]) > 0.01
    last_row_only = torch.zeros(1, 6, dtype=torch.bool)
    last_row_only[0, -1] = True
    assert float(pairwise_js(qs, ks, last_row_only, 1.0, backend="chunked", layouts=layouts)[0, 1]) == 0.0


def test_gqa_keys_without_layouts_are_refused():
    q, k = torch.randn(1, 4, 5, 2), torch.randn(1, 2, 5, 2)
    with pytest.raises(ValueError, match="key heads"):
        pairwise_js(q, k, torch.ones(1, 5, dtype=torch.bool), 1.0)


def test_stack_layers_from_attention_stats():
    """keep_qk hands each layer's q, k, scale and layout on; stacking them gives what pairwise_js takes."""
    g = torch.Generator().manual_seed(1)
    spec = StatsSpec(keep_qk=True)
    valid = torch.ones(1, 7, dtype=torch.bool)
    cls = torch.zeros(1, 7, dtype=torch.long)
    layers = []
    for layout in (AttentionLayout(causal=True, window=(2, 0), n_key_value_heads=1),
                   AttentionLayout(causal=True, n_key_value_heads=1)):
        q, k = torch.randn(1, 2, 7, 4, generator=g), torch.randn(1, 1, 7, 4, generator=g)
        layers.append(attention_stats(q, k, k, valid, cls, spec, backend="chunked", layout=layout)[1])
    q, k, layouts = stack_layers(layers)
    assert q.shape == (1, 4, 7, 4) and k.shape == (1, 2, 7, 4)
    assert [h for _, h in layouts] == [2, 2]
    eager = pairwise_js(q, k, valid, 1.0, backend="eager", layouts=layouts)
    torch.testing.assert_close(pairwise_js(q, k, valid, 1.0, layouts=layouts), eager, atol=1e-5, rtol=1e-5)
