"""kernels.attention_grad: exact gradients of softmax attention, and |dL/dP| per key class
equal to autograd's on the materialised map (kernels.eager.attention_grad_eager)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.kernels import GradSums, attention_grad, attention_grad_eager

C = 4


def make(B, H, L, D, lengths, classes, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    key_class = torch.tensor(classes, dtype=torch.long).view(B, L)
    weight = torch.randn(B, H, L, D, generator=g, dtype=dtype)  # a loss with a gradient everywhere
    return q, k, v, key_valid, key_class, weight


def run(fn, q, k, v, key_valid, key_class, weight, **kw):
    got = []
    out = fn(q, k, v, key_valid, key_class, C, got.append, **kw)
    loss = (out * weight * key_valid[:, None, :, None]).sum()  # padding rows do not reach the loss
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    assert len(got) == 1
    return out, (dq, dk, dv), got[0]


def plain(q, k, v, key_valid, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=key_valid[:, None, None, :],
                                                            scale=scale)


@settings(max_examples=80, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), L=st.integers(1, 23), D=st.sampled_from([1, 3, 8]),
       tile=st.sampled_from([1, 7, 1 << 22]), data=st.data())
def test_matches_autograd_and_the_eager_oracle(B, H, L, D, tile, data):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))  # 1: single-key rows
    classes = data.draw(st.lists(st.integers(0, C - 1), min_size=B * L, max_size=B * L))  # any class absent
    q, k, v, key_valid, key_class, weight = make(B, H, L, D, lengths, classes, data.draw(st.integers(0, 10**6)))
    out, grads, sums = run(attention_grad, q, k, v, key_valid, key_class, weight, tile_elements=tile)
    ref_out, ref_grads, ref = run(attention_grad_eager, q, k, v, key_valid, key_class, weight)
    # the output and dq, dk, dv of plain softmax attention (SDPA) through autograd
    sdpa = plain(q, k, v, key_valid)
    rows = key_valid[:, None, :, None]
    torch.testing.assert_close(out * rows, sdpa * rows)
    want = torch.autograd.grad((sdpa * weight * rows).sum(), (q, k, v))
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b)
    for a, b in zip(ref_grads, want):
        torch.testing.assert_close(a, b)
    # the class sums against autograd's dL/dP
    torch.testing.assert_close(sums.grad, ref.grad)
    torch.testing.assert_close(sums.mass, ref.mass)
    torch.testing.assert_close(sums.pairs, ref.pairs)
    assert sums.rows == ref.rows == sum(lengths)
    # classes with no valid key have no pairs and nothing summed
    for c in range(C):
        if not bool(((key_class == c) & key_valid).any()):
            assert sums.pairs[c] == 0 and float(sums.grad[:, c].abs().sum()) == 0


def test_sums_from_first_principles():
    """One head, L = 3, all keys valid: |dL/dP_ij| = |<dO_i, V_j>| summed by the key's class."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    key_valid = torch.tensor([[True, True, False]])
    key_class = torch.tensor([[1, 3, 1]])  # the padding key's class must not count
    w = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    got = []
    out = attention_grad(q, k, v, key_valid, key_class, C, got.append)
    (out[:, :, :2] * w[:, :, :2]).sum().backward()
    s = got[0]
    # dO_i = w_i for rows 0, 1; dL/dP_ij = <w_i, v_j>
    dp = w[0, 0, :2] @ v[0, 0].detach().T  # (2, 3)
    assert s.grad[0, 1].item() == pytest.approx(dp[:, 0].abs().sum().item())
    assert s.grad[0, 3].item() == pytest.approx(dp[:, 1].abs().sum().item())
    assert s.grad[0, 0].item() == 0 and s.grad[0, 2].item() == 0
    assert s.pairs.tolist() == [0, 2, 0, 2]
    assert s.rows == 2
    assert s.mass[0].sum().item() == pytest.approx(2.0)  # every valid row's mass is 1


def test_float32_sums_match_the_oracle():
    q, k, v, key_valid, key_class, weight = make(2, 3, 40, 16, [40, 17], [c % C for c in range(80)], 3,
                                                  dtype=torch.float32)
    _, grads, sums = run(attention_grad, q, k, v, key_valid, key_class, weight, tile_elements=300)
    _, ref_grads, ref = run(attention_grad_eager, q, k, v, key_valid, key_class, weight)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(sums.grad, ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sums.mass, ref.mass, rtol=1e-5, atol=1e-6)


def test_gradsums_shapes():
    q, k, v, key_valid, key_class, weight = make(1, 2, 5, 4, [5], [0, 1, 2, 3, 1], 1)
    _, _, s = run(attention_grad, q, k, v, key_valid, key_class, weight)
    assert isinstance(s, GradSums)
    assert s.grad.shape == s.mass.shape == (2, C) and s.pairs.shape == (C,)
    assert s.grad.dtype == s.mass.dtype == torch.float64
