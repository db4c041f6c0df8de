"""The Triton Jensen-Shannon pair kernel (kernels/triton_js.py) against the eager
reference, run by Triton's interpreter on the CPU.

TRITON_INTERPRET=1 must be in the environment before the kernel module is imported, so it
is set before any import below.
"""
import math
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triton_interpreter import emulate_bf16_dots

from bertscope.kernels.common import masked_scores
from bertscope.kernels.js import pairwise_js, pairwise_js_eager
from bertscope.kernels.triton_js import pairwise_js_triton, row_lse_triton
from bertscope.kernels.triton_maps import INTERPRETED

if not INTERPRETED:
    pytest.fail("bertscope.kernels.triton_maps was imported before TRITON_INTERPRET=1 was set", pytrace=False)
emulate_bf16_dots()  # the interpreter's bf16 tl.dot multiplies raw bits (tests/triton_interpreter.py)


def make_qk(B, N, L, D, lengths, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, N, L, D, generator=g) * 2 for _ in range(2))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    return q.to(dtype), k.to(dtype), key_valid


@pytest.mark.parametrize("L", [1, 16, 37, 130])
def test_js_matches_eager_at_odd_lengths_with_padding(L):
    """Full, half, single-key and key-less sequences; q and k as strided model-layout views."""
    lengths = [L, max(1, L // 2), 1, 0]
    N = 4 if L < 100 else 2  # the interpreter is slow
    q, k, key_valid = make_qk(4, N, L, 8, lengths, seed=L)
    qs, ks = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k))  # (B, N, L, D) views of (B, L, N, D)
    ref = pairwise_js_eager(q, k, key_valid, 8**-0.5)
    fast = pairwise_js(qs, ks, key_valid, 8**-0.5, backend="triton")
    assert fast.dtype == torch.float64 and fast.shape == (N, N)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    assert torch.all(fast.diagonal() == 0) and torch.equal(fast, fast.T)
    if L > 1:  # with one key every row is (1) in every head: JS 0
        assert torch.all(fast[~torch.eye(N, dtype=torch.bool)] > 0)
    else:
        torch.testing.assert_close(fast, torch.zeros(N, N, dtype=torch.float64), atol=1e-6, rtol=0)


def test_row_pass_lse_and_entropy():
    q, k, key_valid = make_qk(3, 2, 37, 24, [37, 1, 0], seed=3)
    lse, entropy = row_lse_triton(q, k, key_valid, 0.3)
    s = masked_scores(q, k, key_valid, 0.3)
    p = torch.softmax(s, -1)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(entropy, -torch.special.xlogy(p, p).sum(-1), atol=1e-5, rtol=1e-5)
    assert torch.all(entropy[1] == 0)  # one valid key: a point mass
    torch.testing.assert_close(entropy[2], torch.full((2, 37), math.log(37)))  # no valid key: uniform


def test_js_from_first_principles():
    """Head 0 attends (1, 0), head 1 (1/2, 1/2), from one query row:
    JS = H(3/4, 1/4) - (0 + ln 2) / 2; identical heads give exactly 0."""
    q = torch.zeros(1, 3, 2, 16)
    k = torch.zeros(1, 3, 2, 16)
    q[0, 0, 0, 0] = 1.0
    k[0, 0, :, 0] = torch.tensor([100.0, -100.0])  # head 0, row 0: all mass on key 0
    k[0, 2] = k[0, 1]  # head 2 is a copy of head 1
    key_valid = torch.tensor([[True, True]])
    js = pairwise_js_triton(q, k, key_valid, 1.0)
    # row 1 of head 0 has q = 0 (uniform, like heads 1 and 2): JS 0 there
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - math.log(2) / 2
    assert js[0, 1] == pytest.approx(expected, abs=1e-6)
    assert js[0, 2] == pytest.approx(expected, abs=1e-6)
    assert abs(js[1, 2]) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype):
    """Against eager in fp32 on the same rounded q, k: JS is computed in fp32 from half
    inputs (nothing is stored in half), so only the fp32 summation order differs."""
    q, k, key_valid = make_qk(2, 3, 37, 16, [37, 20], seed=9, dtype=dtype)
    ref = pairwise_js_eager(q.float(), k.float(), key_valid, 0.25)
    fast = pairwise_js_triton(q, k, key_valid, 0.25)
    torch.testing.assert_close(fast, ref, atol=1e-3, rtol=1e-3)
    assert torch.all(fast[~torch.eye(3, dtype=torch.bool)] > 0.1)


def test_single_head_and_bad_arguments():
    q, k, key_valid = make_qk(1, 1, 5, 4, [5])
    assert torch.equal(pairwise_js_triton(q, k, key_valid, 0.5), torch.zeros(1, 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        pairwise_js_triton(q.double(), k.double(), key_valid, 0.5)
    with pytest.raises(ValueError, match="key_valid"):
        pairwise_js_triton(q, k, key_valid[:, :4], 0.5)


@settings(max_examples=6, deadline=None)
@given(B=st.integers(1, 2), N=st.integers(2, 4), L=st.integers(1, 40), D=st.sampled_from([4, 16, 24]), data=st.data(),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_js_matches_eager_on_random_shapes(B, N, L, D, data, dtype):
    """Half inputs too, against eager in fp32 on the same rounded values: the kernel works in
    fp32 after loading them, so the fp32 tolerance holds."""
    lengths = data.draw(st.lists(st.integers(0, L), min_size=B, max_size=B))
    q, k, key_valid = make_qk(B, N, L, D, lengths, seed=data.draw(st.integers(0, 10**6)), dtype=dtype)
    ref = pairwise_js_eager(q.float(), k.float(), key_valid, D**-0.5)
    torch.testing.assert_close(pairwise_js_triton(q, k, key_valid, D**-0.5), ref, atol=1e-5, rtol=1e-5)
