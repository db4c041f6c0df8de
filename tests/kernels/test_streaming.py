"""`kernels.streaming`: the streaming output (attention sink + recent window) against the eager oracle
with the explicit mask on random shapes and every layout, the covered rows (error exactly 0) decided
from positions against the explicit masks, rows with no streaming key (o_L = 0, error 1), a sliding
window that fits in the recent span giving exactly 0 on every backend, and streaming head gates on a
tiny decoder: every head streaming with sink + recent >= L changes nothing, and with a small span it
equals an eager model run with the explicit sink + window mask."""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (tests/conftest.py sets it too)

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertscope.engine.accumulate import HeadStats
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.gates import gated_sdpa
from bertscope.kernels.spec import AttentionLayout, LayerGates, StatsSpec
from bertscope.kernels.streaming import (
    apply_streaming,
    covered_rows,
    covered_rows_reference,
    streaming_output,
    streaming_output_reference,
)

LAYOUTS = [AttentionLayout(), AttentionLayout(causal=True), AttentionLayout(causal=True, window=(3, 0)),
           AttentionLayout(causal=True, n_key_value_heads=1), AttentionLayout(window=(2, 3), n_key_value_heads=2),
           AttentionLayout(causal=True, window=(0, 0))]


@st.composite
def cases(draw):
    layout = draw(st.sampled_from(LAYOUTS))
    L = draw(st.integers(1, 37))
    B = draw(st.integers(1, 3))
    H = 4
    H_kv = layout.n_key_value_heads or H
    left = draw(st.booleans())
    lengths = draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    pos = torch.arange(L)[None, :]
    n = torch.tensor(lengths)[:, None]
    key_valid = pos >= L - n if left else pos < n
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(B, H, L, 8, generator=g) * 1.5
    k, v = (torch.randn(B, H_kv, L, 8, generator=g) * 1.5 for _ in range(2))
    sink, recent = draw(st.integers(0, 6)), draw(st.integers(0, 12))
    block = draw(st.sampled_from([1, 3, 7, 128]))
    return layout, q, k, v, key_valid, sink, recent, block


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_streaming_output_equals_the_explicit_mask(case):
    layout, q, k, v, key_valid, sink, recent, block = case
    got = streaming_output(q, k, v, key_valid, layout, None, sink, recent, block_rows=block)
    want = streaming_output_reference(q, k, v, key_valid, layout, None, sink, recent)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(covered_rows(key_valid, layout, sink, recent), covered_rows_reference(key_valid, layout, sink,
                                                                                           recent))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_chunked_streaming_error_equals_the_oracle(case):
    layout, q, k, v, key_valid, sink, recent, _ = case
    spec = StatsSpec(streaming=(sink, recent))
    kc = torch.zeros_like(key_valid, dtype=torch.long)
    _, ref = attention_stats_eager(q, k, v, key_valid, kc, spec, layout=layout)
    _, got = attention_stats_chunked(q, k, v, key_valid, kc, spec, layout=layout)
    torch.testing.assert_close(got.streaming_error_sq, ref.streaming_error_sq, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got.output_sq, ref.output_sq, atol=2e-5, rtol=1e-5)
    covered = covered_rows_reference(key_valid, layout, sink, recent)[:, None, :].expand_as(ref.output_sq)
    assert bool((ref.streaming_error_sq[covered] == 0).all()) and bool((got.streaming_error_sq[covered] == 0).all())


def test_rows_with_no_streaming_key_have_error_one():
    """sink = recent = 0: o_L = 0 on every row, so err^2 = ||o||^2 and the relative error is 1."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=g) for _ in range(3))
    key_valid = torch.ones(2, 9, dtype=torch.bool)
    assert torch.equal(streaming_output(q, k, v, key_valid, AttentionLayout(causal=True), None, 0, 0),
                       torch.zeros_like(q))
    _, stats = attention_stats_chunked(q, k, v, key_valid, torch.zeros(2, 9, dtype=torch.long),
                                       StatsSpec(streaming=(0, 0)), layout=AttentionLayout(causal=True))
    torch.testing.assert_close(stats.streaming_error_sq, stats.output_sq)


def test_hand_built_rows():
    """L = 6 causal, sink 1, recent 2: row i sees keys 0..i; streaming set {0} + {i-1, i}. Rows 0-2 are
    covered (error exactly 0), rows 3-5 are not; with v = e_j one-hot per key the outputs are known."""
    L = 6
    q = torch.zeros(1, 1, L, L)  # every score 0: uniform attention over the visible keys
    k = torch.zeros(1, 1, L, L)
    v = torch.eye(L)[None, None]  # value of key j: e_j
    key_valid = torch.ones(1, L, dtype=torch.bool)
    layout = AttentionLayout(causal=True)
    o_L = streaming_output(q, k, v, key_valid, layout, 1.0, 1, 2)[0, 0]  # (L, L)
    for i in range(L):
        keys = sorted({0} | {j for j in (i - 1, i) if j >= 0})
        want = torch.zeros(L)
        want[keys] = 1 / len(keys)
        torch.testing.assert_close(o_L[i], want)
    assert covered_rows(key_valid, layout, 1, 2).tolist() == [[True, True, True, False, False, False]]
    _, stats = attention_stats_eager(q, k, v, key_valid, torch.zeros(1, L, dtype=torch.long),
                                     StatsSpec(streaming=(1, 2)), scale=1.0, layout=layout)
    # row 3: o = (1/4) sum_{j<=3} e_j, o_L = (e_0 + e_2 + e_3) / 3: ||o - o_L||^2 = 3 (1/12)^2 + (1/4)^2
    assert stats.streaming_error_sq[0, 0, :3].tolist() == [0.0, 0.0, 0.0]
    assert stats.streaming_error_sq[0, 0, 3].item() == pytest.approx(3 / 144 + 1 / 16)
    assert stats.output_sq[0, 0, 3].item() == pytest.approx(1 / 4)


@pytest.mark.parametrize("backend", ["eager", "chunked", "triton"])
def test_a_window_that_fits_in_the_recent_span_has_error_exactly_zero(backend):
    """A sliding-window layer of w keys with recent >= w: every key a row sees is streaming, so its error
    is exactly 0, on every backend, whatever the floats (decided from positions); a global layer's is not."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 21, 8, generator=g) * 2 for _ in range(3))
    key_valid = torch.arange(21)[None, :] < torch.tensor([21, 13])[:, None]
    kc = torch.zeros(2, 21, dtype=torch.long)
    spec = StatsSpec(streaming=(2, 5))
    _, window = attention_stats(q, k, v, key_valid, kc, spec, backend=backend,
                                layout=AttentionLayout(causal=True, window=(4, 0)))  # 5 keys: i-4 .. i
    assert bool((window.streaming_error_sq == 0).all())
    assert bool((window.output_sq[:, :, :13] > 0).all())
    _, full = attention_stats(q, k, v, key_valid, kc, spec, backend=backend, layout=AttentionLayout(causal=True))
    assert bool((full.streaming_error_sq[0, :, 8:] > 0).all())


def test_head_stats_streaming_error_per_head_and_per_kv_group():
    """sqrt(sum err^2 / sum ||o||^2) over the rows, and per key/value group the G heads' sums together."""
    from bertscope.text.token_classes import TokenClasses

    acc = HeadStats(1, 4, StatsSpec(streaming=(1, 2)), TokenClasses.of(("other",)))
    acc.streaming_error_sq_sum[0, :, 0] = [1.0, 3.0, 0.0, 4.0]
    acc.output_sq_sum[0, :, 0] = [4.0, 1.0, 2.0, 0.0]
    acc.init_layouts([AttentionLayout(causal=True, n_key_value_heads=2)])
    e = acc.streaming_error()
    np.testing.assert_allclose(e[0, :3], [0.5, np.sqrt(3), 0.0])
    assert np.isnan(e[0, 3])
    np.testing.assert_allclose(acc.streaming_error(kv_heads=True), [[np.sqrt(4 / 5), np.sqrt(4 / 2)]])


def test_head_stats_without_streaming_says_so():
    from bertscope.engine.accumulate import NotComputedError
    from bertscope.text.token_classes import TokenClasses

    acc = HeadStats(1, 2, StatsSpec(entropy=True), TokenClasses.of(("other",)))
    with pytest.raises(NotComputedError, match="streaming"):
        acc.streaming_error()


def test_streaming_spec_values_and_union():
    assert StatsSpec(streaming=True).streaming == (2, 8) and StatsSpec().streaming == ()
    for bad in [(1,), (-1, 3), (1.5, 2), "ab"]:
        with pytest.raises(ValueError, match="streaming"):
            StatsSpec(streaming=bad)
    assert StatsSpec(streaming=(4, 64)).union(StatsSpec(entropy=True)).streaming == (4, 64)
    with pytest.raises(ValueError, match="streaming span"):
        StatsSpec(streaming=(4, 64)).union(StatsSpec(streaming=(2, 8)))


@pytest.mark.parametrize("backend", ["eager", "chunked", "triton"])
def test_streaming_gates_replace_the_heads_output_by_o_L_on_every_backend(backend):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 15, 8, generator=g)
    k, v = (torch.randn(2, 2, 15, 8, generator=g) for _ in range(2))
    key_valid = torch.ones(2, 15, dtype=torch.bool)
    layout = AttentionLayout(causal=True, n_key_value_heads=2)
    on = torch.tensor([True, False, True, False])
    gates = LayerGates(xi=torch.tensor([1.0, 1.0, 0.5, 0.0]), streaming=on, streaming_span=(1, 3))
    out, _ = attention_stats(q, k, v, key_valid, torch.zeros(2, 15, dtype=torch.long), StatsSpec(), gates=gates,
                             backend=backend, layout=layout)  # (B, L, H, D)
    o_L = streaming_output_reference(q, k, v, key_valid, layout, None, 1, 3)  # (B, H, L, D)
    full = gated_sdpa(q, k, v, key_valid, None, layout=layout)  # (B, L, H, D)
    torch.testing.assert_close(out[:, :, 0], o_L[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, 2], 0.5 * o_L[:, 2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, 1], full[:, :, 1], atol=1e-5, rtol=1e-5)
    assert bool((out[:, :, 3] == 0).all())
    torch.testing.assert_close(gated_sdpa(q, k, v, key_valid, gates, layout=layout), out, atol=1e-5, rtol=1e-5)
    same = apply_streaming(full.transpose(1, 2), q, k, v, key_valid, LayerGates(streaming=on, streaming_span=(15, 0)),
                           None, layout)
    torch.testing.assert_close(same, full.transpose(1, 2), atol=1e-5, rtol=1e-5)  # sink covers every key


# ----------------------------------------------------------------------------- a tiny decoder


def _explicit_attention(sink: int, recent: int):
    """An eager attention function with the explicit causal & sink + recent mask (no padding)."""
    from bertscope.kernels.streaming import streaming_mask

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        G = query.shape[1] // key.shape[1]
        k, v = key.repeat_interleave(G, 1), value.repeat_interleave(G, 1)
        s = torch.matmul(query, k.transpose(-1, -2)) * scaling  # (B, H, L, L)
        L = s.shape[-1]
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        m = causal & streaming_mask(L, sink, recent)
        p = torch.softmax(s.masked_fill(~m, torch.finfo(s.dtype).min), -1)
        return torch.matmul(p, v).transpose(1, 2).contiguous(), p

    return attend


@pytest.mark.usefixtures("single_thread")
def test_every_head_streaming_on_a_tiny_decoder(tiny_llama_lm_dir):
    from transformers import AttentionInterface, AutoModelForCausalLM

    from bertscope.models.loading import load_model

    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    ids = torch.randint(6, 20, (2, 17), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base = loaded.model(input_ids=ids).logits
        loaded.gates.set_streaming(torch.ones(loaded.n_layers, loaded.n_heads, dtype=torch.bool), 4, 13)
        same = loaded.model(input_ids=ids).logits  # sink + recent >= L: nothing changes
        loaded.gates.set_streaming(torch.ones(loaded.n_layers, loaded.n_heads, dtype=torch.bool), 2, 3)
        small = loaded.model(input_ids=ids).logits
        loaded.gates.reset()
        again = loaded.model(input_ids=ids).logits
    torch.testing.assert_close(same, base, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, base)
    assert not torch.allclose(small, base, atol=1e-3)
    AttentionInterface.register("test_streaming_2_3", _explicit_attention(2, 3))
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_lm_dir, attn_implementation="test_streaming_2_3").eval()
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    torch.testing.assert_close(small, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["eager", "chunked", "triton"])
def test_the_error_describes_the_head_as_trained_whatever_its_gates(backend):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 3, 13, 8, generator=g) for _ in range(3))
    key_valid = torch.ones(1, 13, dtype=torch.bool)
    kc = torch.zeros(1, 13, dtype=torch.long)
    spec = StatsSpec(streaming=(1, 4))
    layout = AttentionLayout(causal=True)
    _, plain = attention_stats(q, k, v, key_valid, kc, spec, backend=backend, layout=layout)
    gates = LayerGates(xi=torch.tensor([0.0, 0.5, 1.0]), uniform=torch.tensor([False, True, False]),
                       streaming=torch.tensor([False, False, True]), streaming_span=(1, 1))
    _, gated = attention_stats(q, k, v, key_valid, kc, spec, gates=gates, backend=backend, layout=layout)
    torch.testing.assert_close(gated.streaming_error_sq, plain.streaming_error_sq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gated.output_sq, plain.output_sq, atol=1e-5, rtol=1e-5)
