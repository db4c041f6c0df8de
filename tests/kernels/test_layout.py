"""The attention layout (causal, window, grouped-query) of the contract, and the eager oracle under it.

`visible_mask` is the definition (an L x L tensor, for the oracle and tests); `visible_counts`
and `key_band` must agree with it, and the eager oracle must be the attention SDPA computes
with that mask, whatever the padding side."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.kernels.backends import attention_stats
from bertscope.kernels.gates import gated_sdpa
from bertscope.kernels.spec import AttentionLayout, LayerGates, StatsSpec, visible_counts, visible_mask


@st.composite
def layouts(draw):
    causal = draw(st.booleans())
    window = draw(st.none() | st.tuples(st.integers(0, 6), st.integers(0, 6)))
    if causal and window is not None:
        window = (window[0], 0)
    return AttentionLayout(causal=causal, window=window, n_key_value_heads=draw(st.sampled_from([None, 1, 2])))


def padded(B, L, pads, left):
    """(B, L) key_valid with pads[b] padding positions on the left (decoders) or the right (encoders)."""
    pos = torch.arange(L)[None, :]  # (1, L)
    n = torch.tensor(pads)[:, None]  # (B, 1)
    return pos >= n if left else pos < L - n


@settings(max_examples=60, deadline=None)
@given(layout=layouts(), L=st.integers(1, 13), pads=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       left=st.booleans())
def test_visible_counts_match_the_mask(layout, L, pads, left):
    valid = padded(len(pads), L, [min(p, L - 1) for p in pads], left)
    mask = visible_mask(valid, layout)[:, 0]  # (B, L, L)
    n_visible, n_seeing = visible_counts(valid, layout)
    assert torch.equal(n_visible, (mask.sum(-1) * valid).long())
    assert torch.equal(n_seeing, ((mask & valid[:, :, None]).sum(-2) * valid).long())
    if layout.causal:  # a real query always sees itself, never a later key
        assert bool((n_visible[valid] >= 1).all())
        assert not bool(torch.triu(mask, diagonal=1).any())


def test_band_by_hand():
    """Causal window of 3 (transformers' sliding_window=3 -> (2, 0)) over 2 left-padding positions."""
    valid = torch.tensor([[False, False, True, True, True, True]])
    layout = AttentionLayout(causal=True, window=(2, 0))
    n_visible, n_seeing = visible_counts(valid, layout)
    assert n_visible.tolist() == [[0, 0, 1, 2, 3, 3]]
    assert n_seeing.tolist() == [[0, 0, 3, 3, 2, 1]]
    bidir = AttentionLayout(window=(1, 1))
    assert visible_counts(torch.ones(1, 4, dtype=torch.bool), bidir)[0].tolist() == [[2, 3, 3, 2]]


SPEC = StatsSpec(offsets=(-1, 0, 1), n_key_classes=3, entropy=True, class_mass=True, argmax=True, column_mass=True)


@settings(max_examples=40, deadline=None)
@given(layout=layouts(), L=st.integers(1, 11), pad=st.integers(0, 3), left=st.booleans(), seed=st.integers(0, 99))
def test_eager_is_sdpa_with_the_visibility_mask(layout, L, pad, left, seed):
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, 4, 8
    H_kv = layout.n_key_value_heads or H
    q, k, v = (torch.randn(B, h, L, D, generator=g, dtype=torch.float64) for h in (H, H_kv, H_kv))
    valid = padded(B, L, [0, min(pad, L - 1)], left)
    key_class = torch.randint(0, 3, (B, L), generator=g)
    out, stats = attention_stats(q, k, v, valid, key_class, SPEC, backend="eager", layout=layout)
    ref = gated_sdpa(q, k, v, valid, None, layout=layout)  # (B, L, H, D)
    assert torch.allclose(out[valid], ref[valid], atol=1e-10)
    n_visible, _ = visible_counts(valid, layout)
    rows = valid[:, None, :].expand(B, H, L)
    # entropy lies in [0, ln n_visible]; a row that sees one key has entropy 0 and puts its mass on itself
    baseline = torch.log(n_visible.double().clamp_min(1))[:, None, :].expand(B, H, L)
    assert bool((stats.entropy[rows] <= baseline[rows] + 1e-5).all())
    single = rows & (n_visible[:, None, :] == 1)
    assert torch.allclose(stats.offset_mass[..., 1][single], torch.ones(int(single.sum())))
    if layout.causal:
        assert float(stats.offset_mass[..., 2].abs().max()) == 0.0  # the next token is never seen
    assert torch.allclose(stats.class_mass.sum(-1)[rows], torch.ones(int(rows.sum())), atol=1e-5)
    # the column mass of all keys is the number of real query rows
    assert torch.allclose(stats.column_mass.sum(-1), valid.sum(-1, keepdim=True).float().expand(B, H), atol=1e-4)
    assert stats.layout == layout


def test_uniform_gate_is_uniform_over_the_visible_keys():
    torch.manual_seed(0)
    B, H, L, D = 1, 2, 6, 4
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, 1, L, D), torch.randn(B, 1, L, D)
    valid = torch.tensor([[False, True, True, True, True, True]])
    layout = AttentionLayout(causal=True, window=(1, 0), n_key_value_heads=1)
    gates = LayerGates(uniform=torch.tensor([True, False]))
    out, _ = attention_stats(q, k, v, valid, torch.zeros(B, L, dtype=torch.long), SPEC, gates=gates,
                             backend="eager", layout=layout)
    assert torch.allclose(out[0, 1, 0], v[0, 0, 1])  # the first real row sees itself only
    assert torch.allclose(out[0, 4, 0], v[0, 0, 3:5].mean(0))  # then itself and the one before
    assert math.isfinite(float(out.abs().sum()))


def test_layout_mismatch_is_refused():
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    valid, cls = torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="key/value heads"):
        attention_stats(q, k, k, valid, cls, SPEC, backend="eager")
    with pytest.raises(ValueError, match="evenly"):
        attention_stats(q, torch.randn(1, 3, 3, 8), torch.randn(1, 3, 3, 8), valid, cls, SPEC, backend="eager",
                        layout=AttentionLayout(n_key_value_heads=3))
