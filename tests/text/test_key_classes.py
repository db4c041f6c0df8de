"""Any number of key classes, on every backend: the class count is a parameter
(`StatsSpec.n_key_classes`), not the vocabulary's four ([CLS], [SEP], punctuation, other).

Classes from tags (UPOS has 17, dependency relations more) or from the segment structure
need other counts: 1, 2, 16 and counts that are not powers of two (the Triton kernel pads
its class accumulator to one). Every backend is checked against the eager oracle, and the
oracle against first principles. The Triton kernel runs under the interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py and here for a run of this file alone).
"""
import functools
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triton_interpreter import one_block_cfg

import bertscope.kernels.triton_attention as ta
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import StatsSpec

CLASS_COUNTS = [1, 2, 4, 16, 20]
ROW_PASSES = ["compiled", "torch"]
OFFSETS = (-2, -1, 0, 1)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter reads it again while a kernel runs


def spec_for(C, **kw):
    return StatsSpec(**{"offsets": OFFSETS, "n_key_classes": C, "entropy": True, "class_mass": True,
                        "argmax": True, **kw})


def make_inputs(B, H, L, D, lengths, C, seed=0, dtype=torch.float32):
    """Random q, k, v; classes drawn from all C ids (the largest included, when L allows)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) * 2 for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    key_class = torch.randint(0, C, (B, L), generator=g)
    key_class[:, -1] = C - 1  # the last class id is always used
    return q.to(dtype), k.to(dtype), v.to(dtype), key_valid, key_class


def chunked(row_pass):
    return functools.partial(attention_stats_chunked, row_pass=row_pass)


def triton(one_block):
    return functools.partial(ta.attention_stats_triton, blocks=one_block_cfg(one_block))


BACKENDS = {**{f"chunked-{r}": chunked(r) for r in ROW_PASSES},
            **{f"triton-{p}": triton(t) for p, t in (("single", True), ("online", False))}}


def assert_same(ref, got, key_valid, C, atol=2e-5):
    (out_r, sr), (out_g, sg) = ref, got
    rows = key_valid[:, :, None, None]  # (B, L, 1, 1) in the output layout
    torch.testing.assert_close(out_g * rows, out_r * rows, atol=atol, rtol=1e-5)
    assert sg.class_mass.shape == sr.class_mass.shape and sg.class_mass.shape[-1] == C
    for name in ("class_mass", "entropy", "offset_mass"):
        torch.testing.assert_close(getattr(sg, name), getattr(sr, name), atol=atol, rtol=1e-5, msg=name)
    assert torch.equal(sg.argmax, sr.argmax)


@pytest.mark.parametrize("C", CLASS_COUNTS)
def test_eager_class_mass_from_first_principles(C):
    """q = 0: every valid row is uniform over the valid keys, so the mass on class c is the
    share of valid keys of class c; rows sum to 1 and padding rows are 0."""
    B, H, L, D = 2, 2, 23, 4
    lengths = [23, 9]
    _, k, v, key_valid, key_class = make_inputs(B, H, L, D, lengths, C, seed=C)
    q = torch.zeros(B, H, L, D)
    _, s = attention_stats_eager(q, k, v, key_valid, key_class, spec_for(C))
    for b, n in enumerate(lengths):
        share = torch.bincount(key_class[b, :n], minlength=C).float() / n  # (C,)
        torch.testing.assert_close(s.class_mass[b, :, :n], share.expand(H, n, C))
        assert s.class_mass[b, :, n:].abs().sum() == 0
    assert s.class_mass.shape == (B, H, L, C)


@pytest.mark.parametrize("C", CLASS_COUNTS)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_backends_match_eager_with_padding(backend, C):
    """Odd lengths, a padded sequence and a single-key sequence in one batch."""
    L = 37
    inputs = make_inputs(3, 2, L, 16, [L, 20, 1], C, seed=C)
    spec = spec_for(C)
    ref = attention_stats_eager(*inputs, spec)
    got = BACKENDS[backend](*inputs, spec)
    assert_same(ref, got, inputs[3], C)
    torch.testing.assert_close(got[1].class_mass[2, :, 0].sum(-1), torch.ones(2))  # the single key's class
    assert got[1].class_mass[2, :, 0, inputs[4][2, 0]].tolist() == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize("C", [4, 16, 20])
@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_chunked_long_rows(row_pass, C):
    inputs = make_inputs(1, 2, 300, 32, [293], C, seed=3)
    assert_same(attention_stats_eager(*inputs, spec_for(C)), chunked(row_pass)(*inputs, spec_for(C)), inputs[3], C)


@pytest.mark.parametrize("C", [16, 20])
def test_triton_online_path_over_several_key_blocks(C):
    """Rows longer than one key block: class masses are rescaled block by block."""
    inputs = make_inputs(1, 1, 150, 16, [141], C, seed=5)
    assert_same(attention_stats_eager(*inputs, spec_for(C)), triton(None)(*inputs, spec_for(C)), inputs[3], C)


@pytest.mark.parametrize("C", [4, 16])
def test_triton_fp16_class_mass(C):
    inputs = make_inputs(2, 2, 45, 32, [45, 30], C, seed=2, dtype=torch.float16)
    ref = attention_stats_eager(*(t.float() if t.is_floating_point() else t for t in inputs), spec_for(C))
    _, s = ta.attention_stats_triton(*inputs, spec_for(C))
    assert s.class_mass.dtype == torch.float32 and s.class_mass.shape[-1] == C  # statistics are written in fp32
    torch.testing.assert_close(s.class_mass.float(), ref[1].class_mass, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("C", [4, 16])
def test_triton_spec_without_other_statistics(C):
    """Class masses alone (no entropy, offsets or argmax), as a tag-class analysis may ask."""
    spec = StatsSpec(offsets=(), n_key_classes=C, entropy=False, argmax=False, class_mass=True)
    inputs = make_inputs(2, 3, 19, 8, [19, 7], C, seed=9)
    ref, got = attention_stats_eager(*inputs, spec), ta.attention_stats_triton(*inputs, spec)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1].class_mass, ref[1].class_mass, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), L=st.integers(1, 70), D=st.sampled_from([1, 4, 8, 17]),
       C=st.integers(1, 33), chunk_maps=st.integers(1, 4), data=st.data())
@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_chunked_random_shapes_and_class_counts(row_pass, B, H, L, D, C, chunk_maps, data):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    inputs = make_inputs(B, H, L, D, lengths, C, seed=data.draw(st.integers(0, 10**6)))
    spec = spec_for(C)
    got = chunked(row_pass)(*inputs, spec, chunk_bytes=chunk_maps * L * L * 4)
    assert_same(attention_stats_eager(*inputs, spec), got, inputs[3], C)


@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 2), H=st.integers(1, 2), L=st.integers(1, 48), D=st.sampled_from([1, 4, 8, 17]),
       C=st.sampled_from([1, 3, 4, 5, 16, 17, 20]), one_block=st.sampled_from([None, True, False]), data=st.data())
def test_triton_random_shapes_and_class_counts(B, H, L, D, C, one_block, data):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    inputs = make_inputs(B, H, L, D, lengths, C, seed=data.draw(st.integers(0, 10**6)))
    spec = spec_for(C)
    assert_same(attention_stats_eager(*inputs, spec), triton(one_block)(*inputs, spec), inputs[3], C)
